"""Proof of global-clipping: clipping bounds the global batch's gradients.

Under a ``tf.distribute`` strategy with several replicas, each replica
computes the gradients of its part of the global batch and the optimizer
sums them over the replicas. Stock Keras clips (``clipnorm``,
``global_clipnorm``, ``clipvalue``) each replica's part before that sum,
so a clipped step can reach ``num_replicas_in_sync`` times the bound the
user set. The fork clips after the all-reduce, as one device does.
Proof: ``fit`` with each kind of clipping, active at every step, follows
one device trained on the same global batches in the same process.

JAX (DataParallel over global arrays) computes the gradients of the global
batch before the optimizer sees them, and torch DDP averages them in
``backward()``: guards.
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("global-clipping")

GLOBAL_BATCH = 16  # divisible by every topology's replica count
NUM_SAMPLES = 64
EPOCHS = 2  # 8 steps

# Bounds below the gradients of every step, and below each replica's part
# of them, so that every step is clipped: from ones on targets near 0, each
# variable's gradient norm on the global batch is 0.6 to 5.3 over the 8
# steps, and 0.2 or more for each of 2 replicas' parts.
CONFIGS = {
    "clipnorm": {"clipnorm": 0.1},
    "global_clipnorm": {"global_clipnorm": 0.1},
    "clipvalue": {"clipvalue": 0.01},
}

# N replicas sum the same per-sample gradient terms as one device, in
# another order (per-replica partial sums, then the all-reduce): float32
# reassociation moves each of the 8 steps by a few ulps, and the clipping
# scale divides by a norm computed from those sums; 1e-5 relative leaves a
# wide margin (observed <= 1e-6). Clipping each replica's part moves the
# weights by 8e-3 to 5e-2 after 8 steps (mirrored-2).
RTOL, ATOL = 1e-5, 1e-6


def _data():
    rng = np.random.default_rng(33929)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = 0.1 * rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return x, y


def _fit(scope, config, process=None):
    """Fits from fixed initial weights under ``scope``; flat weights.

    ``process=(rank, world_size)``: feed only that process's part of every
    global batch (a multi-process JAX job, see ``data.local_part``).
    """
    x, y = _data()
    (x, y), batch_size = data.process_batches((x, y), GLOBAL_BATCH, process)
    with scope:
        model = data.ones_mlp()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, **CONFIGS[config]),
            loss="mse",
        )
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


@pytest.mark.fix("global-clipping", guard_on=("jax",))
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.topology(
    multi_process=False, reason="multi-process topologies run the worker test"
)
def test_clipped_fit_matches_one_device(topology, config):
    """``fit`` with the clipping ``config`` under the topology equals one
    device on the same global batches."""
    devices.skip_comparison_on_one_device(topology)
    expected = _fit(contextlib.nullcontext(), config)
    np.testing.assert_allclose(
        _fit(topology.scope(), config), expected, rtol=RTOL, atol=ATOL
    )


def _assert_fits_match(runs, who):
    """Each worker's ``{config: [result, expected]}`` agree (``who``:
    "worker" or "process", for the message)."""
    for rank, fits in enumerate(runs):
        data.assert_close_by_key(
            {config: result for config, (result, _) in fits.items()},
            {config: expected for config, (_, expected) in fits.items()},
            RTOL,
            ATOL,
            f"{who} {rank}: ",
        )


def _multiworker_fits(rank, world_size):
    """In each worker: every config, MultiWorkerMirrored vs one device."""
    strategy = devices.multi_worker_strategy(rank)
    return {
        config: [
            _fit(strategy.scope(), config).tolist(),
            _fit(contextlib.nullcontext(), config).tolist(),
        ]
        for config in sorted(CONFIGS)
    }


@pytest.mark.topology("multiworker-2")
def test_multiworker_clipped_fit_matches_one_device():
    """Two workers (one replica each) against one device in each worker.
    The workers need about 20 s on 2 CPU cores; 300 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_fits", world_size=2, timeout=300
    )
    _assert_fits_match(runs, "worker")


def _jax_process_fits(rank, world_size):
    """In each ``jax/procs-2`` worker: every config under DataParallel over
    both processes (each feeding its part of every global batch) and on
    this process's one device with the whole global batches."""
    distribution = devices.jax_processes(rank, world_size)
    return {
        config: [
            _fit(distribution.scope(), config, (rank, world_size)).tolist(),
            _fit(contextlib.nullcontext(), config).tolist(),
        ]
        for config in sorted(CONFIGS)
    }


@pytest.mark.fix("global-clipping", role="guard")
@pytest.mark.topology("procs-2")
def test_jax_processes_clipped_fit_matches_one_device():
    """jax/procs-2: JAX computes the gradients of the global arrays, so
    clipping bounds the global batch's gradients (guard)."""
    runs = workers.run_workers(
        f"{__name__}:_jax_process_fits", world_size=2, timeout=300
    )
    _assert_fits_match(runs, "process")


def _torch_loop(config, process=None):
    """A custom torch training loop (``data.torch_train``) with the
    clipping ``config``; flat final weights.

    ``process=(rank, world_size)``: this process's part of every global
    batch, under DDP; ``None``: the whole global batches, no DDP.
    """
    x, y = _data()
    (x, y), batch_size = data.process_batches((x, y), GLOBAL_BATCH, process)
    model = data.ones_mlp()
    optimizer = keras.optimizers.SGD(0.1, **CONFIGS[config])
    data.torch_train(
        model, optimizer, x, y, batch_size, EPOCHS, ddp=process is not None
    )
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def _ddp_fits(rank, world_size):
    """In each torch/ddp-2 worker: every config under DDP (this process's
    part of each global batch) and on one device (the whole batches)."""
    with workers.torch_process_group(rank, world_size):
        return {
            config: [
                _torch_loop(config, (rank, world_size)).tolist(),
                _torch_loop(config).tolist(),
            ]
            for config in sorted(CONFIGS)
        }


@pytest.mark.fix("global-clipping", role="guard")
@pytest.mark.topology("ddp-2")
def test_ddp_clipped_loop_matches_one_device():
    """torch/ddp-2: DDP averages the gradients in ``backward()``, before
    the Keras optimizer clips them (guard of clipping on the global
    batch in a torch DDP loop)."""
    runs = workers.run_workers(
        f"{__name__}:_ddp_fits", world_size=2, timeout=300
    )
    _assert_fits_match(runs, "process")
