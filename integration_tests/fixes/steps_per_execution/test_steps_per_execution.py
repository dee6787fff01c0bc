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

With ``unrolled_steps_per_execution > 1`` the further steps of a loop
iteration still need the ``tf.cond``, and several replicas still cannot
synchronize there: stock fails the same way, in the graph, at the first
call; the fork refuses it with a ``ValueError`` before any step (proof: the
stock crash is an ``InvalidArgumentError`` out of a graph execution, which
a correct Keras would not give; on multiworker-2 stock refuses ``fit`` for
another reason first, so that test is a guard). On one device unrolled
steps still train like one step per execution (guard).

JAX and one TensorFlow device run unchanged: guards. The PyTorch backend
of 3.15.1 accepts only ``steps_per_execution=1``; master's ``Model.fit``
under torch ``DataParallel`` (``torch/dp-2``) runs several steps per
execution and follows one device: a guard there.
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

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


def _run(scope, steps_per_execution, process=None, unrolled=1):
    """fit, evaluate and predict from fixed initial weights under ``scope``
    (``unrolled``: the TensorFlow trainer's
    ``unrolled_steps_per_execution``).

    ``process=(rank, world_size)``: a multi-process JAX job, where this
    process feeds its part of every global batch (``data.local_part``)
    of the first 64 samples (4 steps per epoch: with 3 steps per execution
    the last call still has fewer); it skips ``predict``, whose outputs
    are each process's own rows.

    Returns:
        A dict of lists: flat weights, epoch losses and MAEs, evaluate's
        [loss, mae], flat predictions.
    """
    x, y = _data()
    batch_size = GLOBAL_BATCH
    if process is not None:
        (x, y), batch_size = data.process_batches(
            (x[:64], y[:64]), GLOBAL_BATCH, process
        )
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
        if unrolled != 1:
            model.unrolled_steps_per_execution = unrolled
        history = model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
        evaluated = model.evaluate(x, y, batch_size=batch_size, verbose=0)
        result = {
            "weights": np.concatenate(
                [np.ravel(w) for w in model.get_weights()]
            ).tolist(),
            "loss": history.history["loss"],
            "mae": history.history["mae"],
            "evaluate": list(evaluated),
        }
        if process is None:
            predicted = model.predict(x, batch_size=batch_size, verbose=0)
            result["predict"] = np.ravel(predicted).tolist()
    return result


def _assert_same(result, expected, where=""):
    data.assert_close_by_key(result, expected, RTOL, ATOL, f"{where} ")


@pytest.mark.parametrize("steps_per_execution", [2, 3])
@pytest.mark.topology(
    multi_process=False, reason="multi-process topologies run the worker test"
)
def test_steps_per_execution_matches_one_device(topology, steps_per_execution):
    """Several steps per execution under the topology equal one device with
    one step per execution."""
    expected = _run(contextlib.nullcontext(), 1)
    _assert_same(_run(topology.scope(), steps_per_execution), expected)


def _process_runs(distribution, rank, world_size):
    """2 and 3 steps per execution under ``distribution`` over the
    processes, each feeding its part of every global batch, each paired
    with one device running one step per execution on the whole global
    batches of the same 64 samples (no predict), trained first."""
    expected = _run(contextlib.nullcontext(), 1, (0, 1))
    process = (rank, world_size)
    return {
        spe: [_run(distribution.scope(), spe, process), expected]
        for spe in (2, 3)
    }


def _assert_process_runs(target):
    """Runs ``target`` on 2 workers; each run must equal its reference."""
    runs = workers.run_workers(
        f"{__name__}:{target}", world_size=2, timeout=300
    )
    for rank, results in enumerate(runs):
        for spe, (result, expected) in results.items():
            _assert_same(
                result, expected, where=f"process {rank}, {spe} steps:"
            )


def _multiworker_runs(rank, world_size):
    """In each worker: 2 steps per execution under MultiWorkerMirrored, and
    one device with one step per execution."""
    strategy = devices.multi_worker_strategy(rank)
    return [_run(strategy.scope(), 2), _run(contextlib.nullcontext(), 1)]


@pytest.mark.topology("multiworker-2")
def test_multiworker_steps_per_execution_matches_one_device():
    """Two workers (one replica each) against one device in each worker.

    On stock 3.15.1, ``fit`` under MultiWorkerMirroredStrategy fails before
    the first step for another reason too (fix multiworker-fit)."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_runs", world_size=2, timeout=300
    )
    for rank, (result, expected) in enumerate(runs):
        _assert_same(result, expected, where=f"worker {rank}")


def _jax_process_runs(rank, world_size):
    """In each jax/procs-2 worker: 2 and 3 steps per execution under
    DataParallel over both processes (each feeding its part of every global
    batch), and this process's one device with one step per execution on
    the whole global batches."""
    return _process_runs(
        devices.jax_processes(rank, world_size), rank, world_size
    )


@pytest.mark.fix("steps-per-execution", role="guard")
@pytest.mark.topology("procs-2")
def test_jax_processes_steps_per_execution_match_one_device():
    """jax/procs-2: JAX runs the steps of one call on global arrays, so
    several steps per execution already followed one device (guard of the
    N processes = 1 device invariant)."""
    _assert_process_runs("_jax_process_runs")


def _torch_process_runs(rank, world_size):
    """In each torch/dp-2 worker: this process's one device with one step
    per execution on the whole global batches, then 2 and 3 steps per
    execution under DataParallel over both processes, each feeding its part
    of every global batch (NumPy arrays need ``auto_shard_dataset=False``
    there)."""
    distribution = devices.torch_processes(rank, world_size)
    distribution.auto_shard_dataset = False
    return _process_runs(distribution, rank, world_size)


@pytest.mark.fix("steps-per-execution", role="guard")
@pytest.mark.topology("dp-2")
def test_torch_processes_steps_per_execution_match_one_device():
    """torch/dp-2 (master: ``Model.fit`` on torch under
    ``keras.distribution.DataParallel``, keras-team/keras#23316): several
    steps per execution follow one device there already (stock nightly:
    within 1.2e-7), weights, epoch losses and metrics, and ``evaluate``
    (guard of the N processes = 1 device invariant)."""
    _assert_process_runs("_torch_process_runs")


def _unrolled_fit(strategy):
    """``fit`` with 4 steps per execution, 2 of them unrolled into each
    loop iteration, under ``strategy`` on 32 samples in batches of 8 (one
    execution). Returns what a ``ValueError`` left: its message, the
    optimizer's step count and whether any weight moved; or the trained
    weights. Any other exception propagates."""
    x, y = _data()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(1, kernel_initializer="ones"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss="mse",
            steps_per_execution=4,
        )
    model.unrolled_steps_per_execution = 2
    initial = model.get_weights()
    try:
        model.fit(x[:32], y[:32], batch_size=8, verbose=0)
    except ValueError as e:
        optimizer = model.optimizer
        return {
            "refused": str(e),
            "steps": int(keras.ops.convert_to_numpy(optimizer.iterations))
            if optimizer.built
            else 0,
            "weights_moved": any(
                not np.array_equal(w, w0)
                for w, w0 in zip(model.get_weights(), initial)
            ),
        }
    return {"trained": [np.ravel(w).tolist() for w in model.get_weights()]}


def _assert_refused_before_any_step(result, where=""):
    assert "refused" in result, f"{where} trained: {result}"
    assert result["steps"] == 0, f"{where} {result}"
    assert not result["weights_moved"], f"{where} {result}"


@pytest.mark.topology(
    backend="tensorflow",
    reason="unrolled_steps_per_execution is the TensorFlow trainer's",
)
@pytest.mark.topology(
    strategy=True,
    multi_replica=True,
    reason="needs a tf.distribute strategy of several replicas",
)
def test_unrolled_steps_with_several_replicas_are_refused(topology):
    """``unrolled_steps_per_execution=2`` with several replicas in one
    process: ``fit`` raises a ``ValueError`` before any step (no optimizer
    step, no weight moved), then the fork's message names the setting.
    Stock crashes instead (the symptom this test fails on there): the
    first call's graph execution raises ``InvalidArgumentError: ... You
    must feed a value for placeholder tensor`` (``while/cond/Placeholder``,
    keras-team/keras#19246's error), after the optimizer has counted a
    step."""
    result = _unrolled_fit(topology.strategy)
    _assert_refused_before_any_step(result)
    assert "unrolled_steps_per_execution" in result["refused"], result


def _multiworker_unrolled(rank, world_size):
    return _unrolled_fit(devices.multi_worker_strategy(rank))


@pytest.mark.fix("steps-per-execution", role="guard")
@pytest.mark.topology("multiworker-2")
def test_multiworker_unrolled_steps_are_refused():
    """multiworker-2: each worker's ``fit`` with unrolled steps raises a
    ``ValueError`` before any step, and both workers finish (no collective
    left waiting). A guard: stock refuses it before any step too, for
    another reason (``fit`` under MultiWorkerMirroredStrategy fails
    building its step, "Attempt to convert a value (PerReplica...)": the
    multiworker-fit fix), so the fork's message is not checked here (the
    in-process test and the unit test check it)."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_unrolled", world_size=2, timeout=120
    )
    for rank, result in enumerate(runs):
        _assert_refused_before_any_step(result, where=f"worker {rank}:")


@pytest.mark.fix("steps-per-execution", role="guard")
@pytest.mark.topology(
    backend="tensorflow", multi_replica=False, reason="tensorflow/1 only"
)
def test_unrolled_steps_on_one_device_match_one_step():
    """One TensorFlow device: 4 steps per execution, 2 of them unrolled,
    equal one step per execution (the fork runs the first unrolled step of
    each loop iteration without its ``tf.cond``; stock trains the same)."""
    expected = _run(contextlib.nullcontext(), 1)
    _assert_same(_run(contextlib.nullcontext(), 4, unrolled=2), expected)
