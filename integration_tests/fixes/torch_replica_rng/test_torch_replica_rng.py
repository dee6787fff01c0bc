"""Proof of the per-process random numbers fix of torch ``fit`` under DDP.

On Keras master, ``Model.fit`` on torch trains under
``DistributedDataParallel`` when ``torch.distributed`` is initialized,
alone (``torch/ddp-2``) or under ``keras.distribution.DataParallel``
(``torch/dp-2``, keras-team/keras#23316). Each process trains on its shard
of the global batch, and every process holds the same ``SeedGenerator``
states (after the same ``keras.utils.set_random_seed``; torch's global
generator, which unseeded ``Dropout`` uses, even starts from one fixed seed
in every process). So stock draws the same ``Dropout`` mask in every
process: the replicas drop the same units, as ``MirroredStrategy``'s did
before the replica-rng fix (keras-team/keras#18426).

The fork hashes each seed drawn from a ``SeedGenerator`` during ``fit``'s
training steps together with the process's rank in the data-parallel group
(``numpy.random.SeedSequence``). One process draws as before (guard), and
runs stay reproducible under ``set_random_seed`` (checked in the workers).
"""

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers
from ..replica_rng.test_replica_rng import RATE
from ..replica_rng.test_replica_rng import UNITS
from ..replica_rng.test_replica_rng import dropout_model

pytestmark = pytest.mark.fix("torch-replica-rng")


def _process_keep_counts(scope, world_size, seed):
    """One ``fit`` step with one row of ones per process through
    ``Dropout(RATE, seed=seed)`` and ``Scale``; returns, per unit, how many
    of the ``world_size`` processes kept it.

    As in replica-rng's ``_keep_counts``: the loss is ``mean(y_pred)`` and
    SGD's learning rate ``(1 - RATE) * UNITS``, so one step moves ``w_j``
    from 1 to ``1 - k_j / world_size`` (DDP averages the processes'
    gradients). The values are dyadic, so exact in float32 in any order.
    """
    with scope:
        model = dropout_model(seed)
        model.fit(
            np.ones((1, UNITS), "float32"),
            np.zeros((1, 1), "float32"),
            batch_size=1,
            epochs=1,
            shuffle=False,
            verbose=0,
        )
    k = world_size * (1.0 - keras.ops.convert_to_numpy(model.layers[-1].w))
    # Calibration: integers up to float32 rounding (exact, see above).
    np.testing.assert_allclose(k, np.round(k), atol=1e-4)
    return np.round(k).astype(int).tolist()


def _runs(scope_for, world_size):
    """A seeded and an unseeded ``Dropout``, each after the same
    ``set_random_seed`` in every process, the unseeded one twice
    (reproducibility) and once after another seed."""
    runs = {}
    for name, global_seed, layer_seed in (
        ("seeded", 18426, 1337),
        ("unseeded", 18426, None),
        ("unseeded_again", 18426, None),
        ("unseeded_other", 18427, None),
    ):
        keras.utils.set_random_seed(global_seed)
        runs[name] = _process_keep_counts(scope_for(), world_size, layer_seed)
    return runs


def _dp_runs(rank, world_size):
    """In a ``torch/dp-2`` worker: ``fit`` under ``DataParallel`` over both
    processes, each feeding its own row (NumPy arrays need
    ``auto_shard_dataset=False``)."""
    distribution = devices.torch_processes(rank, world_size)
    distribution.auto_shard_dataset = False
    return _runs(distribution.scope, world_size)


def _ddp_runs(rank, world_size):
    """In a ``torch/ddp-2`` worker: ``fit`` with only a gloo process group,
    no ``keras.distribution`` (``fit`` wraps the model in DDP itself)."""
    import contextlib

    with workers.torch_process_group(rank, world_size):
        return _runs(contextlib.nullcontext, world_size)


def _assert_processes_draw_their_own_masks(target):
    """Runs ``target`` on 2 workers and checks the keep counts.

    Each unit is kept by ``k_j`` of the 2 processes: identical masks give
    ``k_j`` in {0, 2} only (stock), independent ones ``k_j = 1`` for half
    of the 1024 units (standard deviation 0.016); the test asks for more
    than 0.4 (> 6 sigma). The keep rate is 0.5 +- 0.011, allowed 0.05. The
    same seed gives the same counts; another seed differs on about 5/8 of
    the units (two independent count vectors agree on 3/8), > 0.3 asked.
    """
    runs = workers.run_workers(
        f"{__name__}:{target}", world_size=2, timeout=300
    )
    # DDP averages the gradients, so both processes end with the same
    # weights: the same counts.
    assert runs[0] == runs[1], "the processes' weights differ after fit"
    counts = {name: np.array(k) for name, k in runs[0].items()}
    for name in ("seeded", "unseeded"):
        k = counts[name]
        assert abs(np.mean(k) / 2 - (1 - RATE)) < 0.05, name
        mixed = np.mean(k == 1)
        assert mixed > 0.4, (
            f"{name} Dropout: {mixed:.3f} of units kept by one process of "
            "2 (independent masks: 0.5); the processes share masks"
        )
    np.testing.assert_array_equal(counts["unseeded"], counts["unseeded_again"])
    assert np.mean(counts["unseeded"] != counts["unseeded_other"]) > 0.3


@pytest.mark.topology("dp-2")
def test_dp_processes_draw_their_own_dropout_masks():
    """torch/dp-2: ``fit`` under ``keras.distribution.DataParallel``."""
    _assert_processes_draw_their_own_masks("_dp_runs")


@pytest.mark.topology("ddp-2")
def test_ddp_processes_draw_their_own_dropout_masks():
    """torch/ddp-2: ``fit`` in a gloo process group without a
    ``keras.distribution``."""
    _assert_processes_draw_their_own_masks("_ddp_runs")


def _one_process_runs(rank, world_size):
    """In a process group of one: ``fit``'s mask under DDP, and the first
    draw of a ``SeedGenerator`` with the layer's seed outside ``fit``."""
    import contextlib

    with workers.torch_process_group(rank, world_size):
        counts = _process_keep_counts(contextlib.nullcontext(), 1, 1337)
    expected = keras.random.dropout(
        keras.ops.ones((1, UNITS)), RATE, seed=keras.random.SeedGenerator(1337)
    )
    expected = (keras.ops.convert_to_numpy(expected) != 0).astype(int)[0]
    return {"fit": counts, "expected": expected.tolist()}


@pytest.mark.fix("torch-replica-rng", role="guard")
@pytest.mark.topology("1")
def test_one_process_group_fit_mask_is_the_seed_generator_draw():
    """torch/1, in a gloo process group of one process (``fit`` wraps the
    model in DDP): nothing is folded, the mask is exactly the generator's
    first draw (stock numerics, bit for bit)."""
    (run,) = workers.run_workers(
        f"{__name__}:_one_process_runs", world_size=1, timeout=300
    )
    assert run["fit"] == run["expected"]
