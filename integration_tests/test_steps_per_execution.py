"""Proof of steps-per-execution: several steps per call under replicas.

With ``steps_per_execution > 1``, the TensorFlow trainer runs the steps of
one call in a ``tf.while_loop`` and each step inside a ``tf.cond``. Under a
``tf.distribute`` strategy with several replicas, the replicas cannot
synchronize inside that ``tf.cond``: stock Keras 3.15.1 fails at the first
call with "You must feed a value for placeholder tensor" (the error of
keras-team/keras#19246). The fork runs the step that the loop condition has
just checked without the ``tf.cond``. Proof: ``fit``, ``evaluate`` and
``predict`` with 2 and 3 steps per execution equal one device with one
step per execution, on 72 samples in batches of 16 (5 steps per epoch: the
last call has fewer steps than ``steps_per_execution``).

JAX and one TensorFlow device run unchanged: guards. The PyTorch backend
accepts only ``steps_per_execution=1``.
"""

import contextlib

import keras
import numpy as np
import pytest

from integration_tests import multiprocess
from integration_tests import topologies

pytestmark = pytest.mark.fix("steps-per-execution")

GLOBAL_BATCH = 16
NUM_SAMPLES = 72  # last batch of 8: splits evenly over 1, 2, 4, 8 devices
EPOCHS = 2  # 10 steps

# N replicas sum the same per-sample gradient terms as one device in
# another order (per-replica partial sums, then the all-reduce): float32
# reassociation moves each of the 10 steps by a few ulps; 1e-5 relative is
# a wide margin (observed <= 1e-6). Running steps in another grouping does
# not change the arithmetic of a step. A skipped or repeated step moves the
# weights by 1e-2 or more.
RTOL, ATOL = 1e-5, 1e-6


def _data():
    # A private generator: the data must not depend on global RNG state.
    rng = np.random.default_rng(19246)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return x, y


def _run(scope, steps_per_execution):
    """fit, evaluate and predict from fixed initial weights under ``scope``.

    Returns:
        A dict of lists: flat weights, epoch losses and MAEs, evaluate's
        [loss, mae], flat predictions.
    """
    x, y = _data()
    with scope:
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(3, kernel_initializer="ones"),
                keras.layers.Dense(1, kernel_initializer="ones"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss="mse",
            metrics=["mae"],
            steps_per_execution=steps_per_execution,
        )
        history = model.fit(
            x,
            y,
            batch_size=GLOBAL_BATCH,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
        evaluated = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
        predicted = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    return {
        "weights": np.concatenate(
            [np.ravel(w) for w in model.get_weights()]
        ).tolist(),
        "loss": history.history["loss"],
        "mae": history.history["mae"],
        "evaluate": list(evaluated),
        "predict": np.ravel(predicted).tolist(),
    }


def _assert_same(result, expected, where=""):
    for key in expected:
        np.testing.assert_allclose(
            result[key],
            expected[key],
            rtol=RTOL,
            atol=ATOL,
            err_msg=f"{where} {key}",
        )


@pytest.mark.parametrize("steps_per_execution", [2, 3])
def test_steps_per_execution_matches_one_device(topology, steps_per_execution):
    """Several steps per execution under the topology equal one device with
    one step per execution."""
    if topology.name == "multiworker-2":
        pytest.skip("multiworker-2 runs the worker test")
    if topology.backend == "torch" and topology.num_replicas > 1:
        pytest.skip("torch has no multi-device Model.fit")
    expected = _run(contextlib.nullcontext(), 1)
    _assert_same(_run(topology.scope(), steps_per_execution), expected)


def _multiworker_runs(rank, world_size):
    """In each worker: 2 steps per execution under MultiWorkerMirrored, and
    one device with one step per execution."""
    strategy = topologies.multi_worker_strategy(rank)
    return [_run(strategy.scope(), 2), _run(contextlib.nullcontext(), 1)]


def test_multiworker_steps_per_execution_matches_one_device(topology):
    """Two workers (one replica each) against one device in each worker.

    On stock 3.15.1, ``fit`` under MultiWorkerMirroredStrategy fails before
    the first step for another reason too (fix multiworker-fit)."""
    if topology.name != "multiworker-2":
        pytest.skip("multiworker-2 only")
    runs = multiprocess.run_workers(
        f"{__name__}:_multiworker_runs", world_size=2, timeout=300
    )
    for rank, (result, expected) in enumerate(runs):
        _assert_same(result, expected, where=f"worker {rank}")
