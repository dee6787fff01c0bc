"""Proof of loss-scale-replicas: replicas agree on an overflow.

Under a ``tf.distribute`` strategy with several replicas, each replica's
gradients are those of its part of the global batch, summed over the
replicas by the inner optimizer. Stock Keras's ``LossScaleOptimizer`` took
``finite`` from replica 0 alone, so a step whose gradients overflow on
another replica was applied: the weights became ``-inf``, and the scale
was not halved. One device skips that step and halves its scale. The fork
all-reduces a non-finite flag first. Proof: ``fit`` over a first batch
whose last rows overflow (they go to the last replica on every topology),
then finite batches, gives one device's weights, loss scale and step
counter; with a ``LossScaleOptimizer`` around SGD in float32 and with the
``mixed_float16`` policy (which wraps the optimizer itself).

JAX ``DataParallel`` gives the optimizer the gradients of the global
batch: a guard.
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("loss-scale-replicas")

GLOBAL_BATCH = 8  # divisible by every topology's replica count
# Rows 6 and 7 of the first batch overflow: on 2, 4 or 8 replicas they go
# to the last replica only.
OVERFLOW_ROWS = slice(6, 8)
CONFIGS = ("loss_scale_optimizer", "mixed_float16")

# The finite steps sum the same per-sample terms as one device in another
# order (float32 reassociation, a few ulps; float16 compute under
# mixed_float16 rounds each product to 11 bits, the same on both sides, so
# the replicas' sums still differ by reassociation only): 1e-3 relative
# leaves a wide margin for float16 (observed <= 1e-6 in float32). The
# defect gives -inf or NaN weights and another scale.
RTOL, ATOL = 1e-3, 1e-4


def _data():
    rng = np.random.default_rng(16)
    x = rng.uniform(-1.0, 1.0, size=(4 * GLOBAL_BATCH, 2)).astype("float32")
    y = rng.uniform(-1.0, 1.0, size=(4 * GLOBAL_BATCH, 1)).astype("float32")
    x[OVERFLOW_ROWS] = 1e30
    return x, y


def _fit(scope, config):
    """Fits 4 batches (the first overflows on its last rows) from fixed
    weights under ``scope``.

    Returns:
        A dict: flat weights, the loss scale and step counter at the end.
    """
    x, y = _data()
    policy = keras.config.dtype_policy()
    if config == "mixed_float16":
        keras.config.set_dtype_policy("mixed_float16")
    try:
        with scope:
            model = keras.Sequential(
                [
                    keras.Input((2,)),
                    keras.layers.Dense(3, kernel_initializer="ones"),
                    keras.layers.Dense(
                        1, kernel_initializer="ones", dtype="float32"
                    ),
                ]
            )
            optimizer = keras.optimizers.SGD(0.01)
            if config == "loss_scale_optimizer":
                optimizer = keras.optimizers.LossScaleOptimizer(
                    optimizer, dynamic_growth_steps=2
                )
            model.compile(optimizer=optimizer, loss="mse")
            model.fit(
                x,
                y,
                batch_size=GLOBAL_BATCH,
                epochs=1,
                shuffle=False,
                verbose=0,
            )
    finally:
        keras.config.set_dtype_policy(policy)
    optimizer = model.optimizer
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    return {
        "weights": np.concatenate(
            [np.ravel(w) for w in model.get_weights()]
        ).tolist(),
        "scale": float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)),
        "step counter": int(keras.ops.convert_to_numpy(optimizer.step_counter)),
    }


def _assert_same(result, expected, who=""):
    np.testing.assert_allclose(
        result["weights"],
        expected["weights"],
        rtol=RTOL,
        atol=ATOL,
        err_msg=f"{who}weights",
    )
    for name in ("scale", "step counter"):
        assert result[name] == expected[name], (who, name, result, expected)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.topology(
    multi_process=False, reason="multi-process topologies run the worker test"
)
def test_overflow_on_one_replica_matches_one_device(topology, config):
    """The overflowing step is skipped and the scale halved; the 3 finite
    steps train as on one device."""
    devices.skip_comparison_on_one_device(topology)
    expected = _fit(contextlib.nullcontext(), config)
    _assert_same(_fit(topology.scope(), config), expected)


def _multiworker_fits(rank, world_size):
    """In each worker: MultiWorkerMirrored vs one device, with a
    ``LossScaleOptimizer`` (the mixed_float16 policy wraps one alike)."""
    strategy = devices.multi_worker_strategy(rank)
    config = "loss_scale_optimizer"
    return {
        config: [
            _fit(strategy.scope(), config),
            _fit(contextlib.nullcontext(), config),
        ]
    }


@pytest.mark.topology("multiworker-2")
def test_multiworker_overflow_on_one_worker_matches_one_device():
    """Two workers (one replica each): the rows that overflow are worker
    1's. Unpatched, each worker decides on its own gradients, so worker 0
    applies the step (and all-reduces the gradients) where worker 1 skips
    it, and the job hangs in that collective until the timeout. The
    workers need about 15 s on 2 CPU cores; 40 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_fits", world_size=2, timeout=40
    )
    for rank, fits in enumerate(runs):
        for config, (result, expected) in fits.items():
            _assert_same(result, expected, who=f"worker {rank}, {config}: ")
