"""Proof of the per-replica random numbers fix (keras-team/keras#18426).

Under a ``tf.distribute`` strategy every replica runs the same step with its
own copy of each ``SeedGenerator`` state. Stock Keras 3.15.1 draws the seed
from that state as is, so every replica draws the same seed: ``Dropout``
applies the same mask to each replica's share of the global batch, step
after step, and every ``keras.random`` op driven by a ``SeedGenerator``
returns the same values on every replica (also inside ``model.fit`` and
across the workers of ``MultiWorkerMirroredStrategy``). The noise is
correlated across the global batch. With JAX ``DataParallel`` a random op
computes one global array whose shards differ: that is the behavior to
match (guard).

The fork folds the replica id (``replica_id_in_sync_group``, global across
workers) into each seed drawn from a ``SeedGenerator`` when more than one
replica is in sync. With one replica the numbers are bit-identical to stock
(guards), runs stay reproducible under ``keras.utils.set_random_seed``
(guard), and integer seeds still give the same values on every replica.

torch DDP runs one process per rank and Keras has no replica context there:
Keras does not fold the rank, and following the torch convention the user
seeds each rank (guard documents both).
"""

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("replica-rng")
BACKEND = keras.backend.backend()
UNITS = 1024
RATE = 0.5


_SINGLE_PROCESS = pytest.mark.topology(
    multi_process=False,
    reason="single-process test; this topology runs its worker test",
)


class Scale(keras.layers.Layer):
    """``x * w`` with a trainable ``w`` (one weight per unit, init ones)."""

    def build(self, input_shape):
        self.w = self.add_weight(
            shape=(input_shape[-1],), initializer="ones", name="w"
        )

    def call(self, x):
        return x * self.w


def dropout_model(seed):
    """``Dropout(RATE, seed=seed)`` then ``Scale`` on ``UNITS`` inputs,
    compiled for ``_keep_counts``: loss ``mean(y_pred)``, SGD at learning
    rate ``(1 - RATE) * UNITS``."""
    model = keras.Sequential(
        [
            keras.Input((UNITS,)),
            keras.layers.Dropout(RATE, seed=seed),
            Scale(),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD((1 - RATE) * UNITS),
        loss=lambda y_true, y_pred: keras.ops.mean(y_pred, axis=-1),
    )
    return model


def _keep_counts(topology, batch, seed=1337):
    """One ``fit`` step on ``batch`` rows of ones through ``Dropout`` and
    ``Scale``; returns, per unit, how many rows kept it.

    The loss is ``mean(y_pred)``: a row's gradient for ``w_j`` is
    ``m_j / ((1 - RATE) * UNITS)`` (``m_j`` its keep bit), averaged over the
    global batch (per-replica losses are scaled by 1/replicas and the
    gradients summed). With SGD at learning rate ``(1 - RATE) * UNITS``, one
    step moves ``w_j`` from 1 to ``1 - k_j / batch``, ``k_j`` the number of
    rows that kept unit ``j``. All these values are dyadic (powers of two
    over small integers), so float32 sums are exact in any order.
    """
    with topology.scope():
        model = dropout_model(seed)
        x = np.ones((batch, UNITS), "float32")
        model.fit(
            x,
            np.zeros((batch, 1), "float32"),
            batch_size=batch,
            epochs=1,
            shuffle=False,
            verbose=0,
        )
    k = batch * (1.0 - keras.ops.convert_to_numpy(model.layers[-1].w))
    # Calibration: the counts are integers up to float32 rounding (exact
    # here, see above; 1e-4 leaves room for a non-exact reduction order).
    np.testing.assert_allclose(k, np.round(k), atol=1e-4)
    return np.round(k).astype(int)


@pytest.mark.fix("replica-rng", guard_on=("jax",))
@_SINGLE_PROCESS
@pytest.mark.topology(multi_replica=True)
def test_fit_dropout_masks_differ_per_replica(topology):
    """One ``fit`` step with one row per replica: each unit is kept by
    ``k_j`` of the ``R`` replicas. Identical masks give ``k_j`` in {0, R}
    only (stock TF); independent masks give Binomial(R, 1/2) counts.

    Tolerances: over 1024 units the fraction of "mixed" units
    (0 < k_j < R) is 1 - 2^(1-R) (0.5, 0.875, 0.992 for R = 2, 4, 8) with
    a standard deviation <= 0.016; the test asks for more than that
    expectation minus 0.1 (> 6 sigma). The keep rate is 0.5 with standard
    deviation sqrt(0.25 / (1024 R)) <= 0.011; the test allows 0.05.
    """
    replicas = topology.num_replicas
    k = _keep_counts(topology, batch=replicas)
    mixed = np.mean((k > 0) & (k < replicas))
    expected = 1 - 2.0 ** (1 - replicas)
    assert mixed > expected - 0.1, (
        f"{mixed:.3f} of units kept by some but not all of {replicas} "
        f"replicas (independent masks: {expected:.3f}); replicas share masks"
    )
    assert abs(np.mean(k) / replicas - (1 - RATE)) < 0.05


@pytest.mark.topology(
    strategy=True,
    multi_replica=True,
    reason="tf.distribute multi-replica topology only",
)
def test_random_ops_differ_per_replica_in_strategy_run(topology):
    """``strategy.run`` of a ``Dropout`` layer and ``keras.random.normal``
    with a ``SeedGenerator``, two steps: every pair of (replica, step)
    draws differs, also replica r's draw vs replica r' at the next step
    (a fold that offset the counter would repeat those). An integer seed
    gives the same values on every replica.

    Tolerance: each mask has 4096 Bernoulli(1/2) draws; two independent
    masks disagree on 0.5 +- 0.008 of them (identical: 0), the test asks
    for > 0.4. The keep rate is 0.5 +- 0.008, allowed 0.05.
    """
    import tensorflow as tf

    strategy = topology.strategy
    with strategy.scope():
        dropout = keras.layers.Dropout(RATE, seed=1337)
        seed_generator = keras.random.SeedGenerator(42)
    x = tf.ones((64, 64))

    @tf.function
    def step():
        return strategy.run(
            lambda: (
                dropout(x, training=True),
                keras.random.normal((256,), seed=seed_generator),
                keras.random.normal((256,), seed=7),
            )
        )

    draws = []  # (step, replica, mask, normal, int-seeded normal)
    for s in range(2):
        masks, normals, seeded = (
            [t.numpy() for t in strategy.experimental_local_results(r)]
            for r in step()
        )
        for r in range(topology.num_replicas):
            draws.append((s, r, masks[r] != 0, normals[r], seeded[r]))
    for _, _, mask, _, _ in draws:
        assert abs(np.mean(mask) - (1 - RATE)) < 0.05
    for i, (s1, r1, mask1, normal1, seeded1) in enumerate(draws):
        for s2, r2, mask2, normal2, seeded2 in draws[i + 1 :]:
            where = f"replica {r1} step {s1} vs replica {r2} step {s2}"
            disagree = np.mean(mask1 != mask2)
            assert disagree > 0.4, f"masks disagree on {disagree}: {where}"
            assert not np.allclose(normal1, normal2), f"same normal: {where}"
            if s1 == s2:
                np.testing.assert_array_equal(seeded1, seeded2)
    # The per-replica copies of the generator state advance in step.
    for state in strategy.experimental_local_results(
        dropout.seed_generator.state.value
    ):
        np.testing.assert_array_equal(state.numpy(), [1337, 2])


@pytest.mark.fix("replica-rng", role="guard")
@_SINGLE_PROCESS
@pytest.mark.topology(multi_replica=False)
def test_one_replica_fit_mask_is_the_seed_generator_draw(topology):
    """With one replica, the mask ``fit`` applies is exactly the first draw
    of a ``SeedGenerator`` with the layer's seed outside any strategy
    (stock numerics, bit for bit). On TensorFlow also under a one-device
    ``MirroredStrategy``."""
    expected = keras.ops.convert_to_numpy(
        keras.random.dropout(
            keras.ops.ones((1, UNITS)),
            RATE,
            seed=keras.random.SeedGenerator(1337),
        )
    )
    expected = (expected != 0).astype(int)[0]
    np.testing.assert_array_equal(_keep_counts(topology, batch=1), expected)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        from ...harness import devices

        one_device = devices.Topology(
            "tensorflow",
            "mirrored-1",
            1,
            tf.distribute.MirroredStrategy(["/cpu:0"]),
        )
        np.testing.assert_array_equal(
            _keep_counts(one_device, batch=1), expected
        )


@pytest.mark.fix("replica-rng", role="guard")
@_SINGLE_PROCESS
def test_fit_masks_are_reproducible_under_set_random_seed(topology):
    """An unseeded ``Dropout`` (its generator seeded from the global seed):
    the same ``set_random_seed`` gives the same masks in ``fit`` (per-unit
    keep counts, exact integers), another seed other masks (control)."""
    batch = max(topology.num_replicas, 2)

    def run(seed):
        keras.utils.set_random_seed(seed)
        return _keep_counts(topology, batch=batch, seed=None)

    first, again, other = run(18426), run(18426), run(18427)
    np.testing.assert_array_equal(first, again)
    # Control: 1024 units, two independent count vectors agree on at most
    # ~3/8 of them for batch 2 (less for larger batches).
    assert np.mean(first != other) > 0.3, "another seed gave the same masks"


def multiworker_worker(rank, world_size):
    """One ``MultiWorkerMirroredStrategy`` worker (one replica each): a
    ``Dropout`` mask and a ``keras.random.normal`` draw inside
    ``strategy.run``, with the replica id they ran as."""

    strategy = devices.multi_worker_strategy(rank)
    import tensorflow as tf

    with strategy.scope():
        dropout = keras.layers.Dropout(RATE, seed=1337)
        seed_generator = keras.random.SeedGenerator(42)
    x = tf.ones((64, 64))

    def replica_fn():
        context = tf.distribute.get_replica_context()
        return (
            dropout(x, training=True),
            keras.random.normal((256,), seed=seed_generator),
            context.replica_id_in_sync_group,
        )

    mask, normal, replica_id = (
        strategy.experimental_local_results(r)[0]
        for r in tf.function(lambda: strategy.run(replica_fn))()
    )
    return {
        "mask": (mask.numpy() != 0).astype(int).ravel().tolist(),
        "normal": normal.numpy().tolist(),
        "replica_id": int(replica_id),
        "replicas": strategy.num_replicas_in_sync,
    }


@pytest.mark.topology("multiworker-2")
def test_multiworker_workers_draw_different_numbers():
    """2 workers of ``MultiWorkerMirroredStrategy``: the global replica ids
    are 0 and 1 and their draws differ (stock: identical).

    Tolerance: 4096-unit masks, as in the ``strategy.run`` test (disagree
    on 0.5 +- 0.008 when independent; > 0.4 asked; keep rate +- 0.05)."""
    results = workers.run_workers(
        f"{__name__}:multiworker_worker", world_size=2, timeout=180
    )
    assert [r["replica_id"] for r in results] == [0, 1]
    assert [r["replicas"] for r in results] == [2, 2]
    masks = [np.array(r["mask"]) for r in results]
    for mask in masks:
        assert abs(np.mean(mask) - (1 - RATE)) < 0.05
    assert np.mean(masks[0] != masks[1]) > 0.4, "workers share the mask"
    assert not np.allclose(results[0]["normal"], results[1]["normal"])


def ddp_worker(rank, world_size):
    """One torch DDP rank: dropout masks after the same global seed
    on every rank, then after ``seed + rank``."""
    with workers.torch_process_group(rank, world_size):
        masks = {}
        for name, seed in (("same", 18426), ("per_rank", 18426 + rank)):
            keras.utils.set_random_seed(seed)
            layer = keras.layers.Dropout(RATE, seed=None)
            out = layer(keras.ops.ones((64, 64)), training=True)
            masks[name] = (
                (keras.ops.convert_to_numpy(out) != 0).astype(int).ravel()
            ).tolist()
        return masks


@pytest.mark.fix("replica-rng", role="guard")
@pytest.mark.topology("ddp-2")
def test_ddp_ranks_are_seeded_by_the_user():
    """torch DDP: Keras has no replica context and does not fold the rank.
    The same ``set_random_seed`` on every rank gives every rank the same
    mask; seeding ``seed + rank`` (the torch convention) gives independent
    masks (4096 draws: disagree on 0.5 +- 0.008, > 0.4 asked)."""
    results = workers.run_workers(
        f"{__name__}:ddp_worker", world_size=2, timeout=180
    )
    same = [np.array(r["same"]) for r in results]
    per_rank = [np.array(r["per_rank"]) for r in results]
    np.testing.assert_array_equal(same[0], same[1])
    assert np.mean(per_rank[0] != per_rank[1]) > 0.4
