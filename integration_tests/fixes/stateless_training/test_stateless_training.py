"""Proof of the stateless_call `training` fix (keras-team/keras#20378).

A training loop built on ``stateless_call`` must pass ``training=True`` and
thread the returned non-trainable variables (BatchNorm statistics, RNG seed
state) into the next call. Stock Keras (3.15.1 and master) says nothing when a
gradient step omits ``training``: the model silently runs in inference mode.
The fork warns once per model when ``training`` is not passed to a model that
acts on it, in a gradient step or not (no public API tells a gradient step
apart on every backend): an inference call passes ``training=False``. Proof
tests check the warning; the guard tests document what a correct loop gets, and
what a loop that does not thread the state gets.
"""

import contextlib
import warnings

import keras
import numpy as np
import pytest

from ...harness import workers

pytestmark = pytest.mark.fix("stateless-training")
BACKEND = keras.backend.backend()
GLOBAL_BATCH = 32  # divisible by every replica count (1, 2, 8)


def _data(seed=20378):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(GLOBAL_BATCH, 8)).astype("float32")
    y = rng.normal(size=(GLOBAL_BATCH, 1)).astype("float32")
    return x, y


def _model():
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(1),
        ]
    )


def _is_training_warning(w) -> bool:
    text = str(w.message)
    return (
        issubclass(w.category, UserWarning)
        and "stateless_call" in text
        and "training" in text
    )


def _grad_steps(model, x, y, steps, **call_kwargs):
    """``steps`` gradient evaluations through ``stateless_call`` with the
    backend's own autodiff; returns the training warnings raised."""
    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in model.non_trainable_variables]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            if BACKEND == "jax":
                import jax

                def loss_fn(tv, ntv):
                    out, ntv = model.stateless_call(tv, ntv, x, **call_kwargs)
                    return keras.ops.mean((out - y) ** 2), ntv

                (_, ntv), _ = jax.value_and_grad(loss_fn, has_aux=True)(tv, ntv)
            elif BACKEND == "tensorflow":
                import tensorflow as tf

                with tf.GradientTape() as tape:
                    tape.watch(tv)
                    out, ntv = model.stateless_call(tv, ntv, x, **call_kwargs)
                    loss = tf.reduce_mean((out - y) ** 2)
                tape.gradient(loss, tv)
            else:
                tv = [t.detach().requires_grad_() for t in tv]
                out, ntv = model.stateless_call(tv, ntv, x, **call_kwargs)
                keras.ops.mean((out - keras.ops.convert_to_tensor(y)) ** 2)
    return [w for w in caught if _is_training_warning(w)]


_SINGLE_PROCESS = pytest.mark.topology(
    exclude="ddp-2", reason="single-process test; ddp-2 runs the worker variant"
)


def _per_replica(topology, fn):
    """Runs ``fn`` where a training step runs: in the replica context under
    a tf.distribute strategy (MirroredStrategy variables can only be read
    there), else directly. Returns what ``fn`` returned (replica 0's)."""
    if topology.strategy is None:
        return fn()
    results = []
    topology.strategy.run(lambda: results.append(fn()))
    return results[0]


@_SINGLE_PROCESS
def test_gradient_step_without_training_warns_once(topology):
    """Two gradient steps without ``training``: exactly one warning."""
    x, y = _data()
    with topology.scope():
        model = _model()
        found = _per_replica(
            topology, lambda: _grad_steps(model, x, y, steps=2)
        )
    assert len(found) == 1, [str(w.message) for w in found]


@pytest.mark.fix("stateless-training", role="guard")
@pytest.mark.parametrize("training", [True, False])
@_SINGLE_PROCESS
def test_explicit_training_is_silent(topology, training):
    x, y = _data()
    with topology.scope():
        model = _model()
        found = _per_replica(
            topology,
            lambda: _grad_steps(model, x, y, steps=2, training=training),
        )
    assert found == []


def _no_autograd():
    """Outside gradient tracing. On torch that needs ``torch.no_grad()``:
    trainable values require grad, so autograd records any eager call."""
    if BACKEND == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


@_SINGLE_PROCESS
def test_inference_without_training_warns_once(topology):
    """Two inference calls (outside gradient tracing) without ``training``:
    exactly one warning, which names ``training=False`` as the way to say
    it is inference (``test_explicit_training_is_silent`` checks that)."""
    x, _ = _data()

    def infer():
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _no_autograd():
                model.stateless_call(tv, ntv, x)
                model.stateless_call(tv, ntv, x)
        return [str(w.message) for w in caught if _is_training_warning(w)]

    with topology.scope():
        model = _model()
        found = _per_replica(topology, infer)
    assert len(found) == 1, found
    assert "training=False" in found[0]


def ddp_worker(rank, world_size):
    """One torch DDP rank: a process group, a gradient step without
    ``training`` whose gradients are all-reduced; returns the warnings."""
    import torch

    with workers.torch_process_group(rank, world_size) as dist:
        x, y = _data(seed=rank)
        model = _model()
        tv = [
            v.value.detach().requires_grad_() for v in model.trainable_variables
        ]
        ntv = [v.value for v in model.non_trainable_variables]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                out, ntv = model.stateless_call(tv, ntv, x)
                loss = torch.mean(
                    (out - torch.as_tensor(y, device=out.device)) ** 2
                )
                grads = torch.autograd.grad(loss, tv)
                for g in grads:
                    dist.all_reduce(g)
        return [str(w.message) for w in caught if _is_training_warning(w)]


@pytest.mark.topology("ddp-2")
def test_ddp_gradient_step_without_training_warns_once_per_rank(topology):
    found = workers.run_workers(
        f"{__name__}:ddp_worker", world_size=topology.num_replicas
    )
    assert [len(f) for f in found] == [1] * topology.num_replicas, found


@pytest.mark.fix("stateless-training", role="guard")
@pytest.mark.topology(
    backend="jax", multi_replica=True, reason="JAX multi-device topology only"
)
def test_data_parallel_loop_matches_one_device(topology):
    """JAX custom data-parallel loop (batch sharded over 8 devices, state
    replicated) with ``training=True`` and threaded state: BatchNorm moving
    statistics equal the 1-device run on the same global batches.

    Tolerance: the sharded batch mean/variance are all-reduces of per-device
    partial sums, i.e. the same float32 sums in another order; over 5 steps
    that moves results by a few ulps (rtol 1e-5, atol 1e-6). Dropout is off
    in this model (rate 0) so both runs see identical math.
    """
    import jax
    from jax.sharding import Mesh
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16),
            keras.layers.BatchNormalization(momentum=0.5),
            keras.layers.Dense(1),
        ]
    )
    tv0 = [v.value for v in model.trainable_variables]
    ntv0 = [v.value for v in model.non_trainable_variables]
    batches = [_data(seed=s) for s in range(5)]

    def train_step(tv, ntv, x, y):
        def loss_fn(tv, ntv):
            out, ntv = model.stateless_call(tv, ntv, x, training=True)
            return keras.ops.mean((out - y) ** 2), ntv

        (_, ntv), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv, ntv)
        tv = [t - 0.1 * g for t, g in zip(tv, grads)]
        return tv, ntv

    def run(devices):
        mesh = Mesh(np.array(devices), ("batch",))
        data = NamedSharding(mesh, P("batch"))
        replicated = NamedSharding(mesh, P())
        tv = jax.device_put(tv0, replicated)
        ntv = jax.device_put(ntv0, replicated)
        step = jax.jit(train_step)
        for x, y in batches:
            tv, ntv = step(
                tv, ntv, jax.device_put(x, data), jax.device_put(y, data)
            )
        return [np.asarray(v) for v in ntv]

    one = run(jax.devices()[:1])
    many = run(jax.devices())
    assert len(jax.devices()) == topology.num_replicas
    moved = max(np.max(np.abs(a - b)) for a, b in zip(one, ntv0))
    assert moved > 1e-2, "BatchNorm statistics did not train"
    for a, b in zip(many, one):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.fix("stateless-training", role="guard")
@_SINGLE_PROCESS
def test_threaded_seed_state_gives_new_dropout_masks(topology):
    """Documents the threading contract: with the returned state threaded,
    dropout masks differ between steps; re-using the initial state repeats
    the same mask. (The Dropout is seeded: on torch an unseeded Dropout
    draws from the global torch RNG and ignores the seed state.)"""
    x = np.ones((GLOBAL_BATCH, 64), "float32")

    def three_calls():
        tv = [v.value for v in model.trainable_variables]
        ntv0 = [v.value for v in model.non_trainable_variables]
        out1, ntv1 = model.stateless_call(tv, ntv0, x, training=True)
        out2, _ = model.stateless_call(tv, ntv1, x, training=True)
        again, _ = model.stateless_call(tv, ntv0, x, training=True)
        return [keras.ops.convert_to_numpy(o) for o in (out1, out2, again)]

    with topology.scope():
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dropout(0.5, seed=1337)]
        )
        out1, out2, again = _per_replica(topology, three_calls)
    keep = np.mean(out1 != 0)
    # 2048 Bernoulli(0.5) draws: the keep rate is 0.5 +- 0.011 (1 sigma).
    assert 0.4 < keep < 0.6
    assert np.mean((out1 != 0) != (out2 != 0)) > 0.3, "threaded: same mask"
    np.testing.assert_array_equal(out1, again)
