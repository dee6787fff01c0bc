"""Proof of stop-training-processes: a job stops where any process stops.

A callback can set ``Model.stop_training`` on a condition of its own
process: a wall-clock budget, a file on that host, a signal it received.
In a multi-process job (JAX processes under one distribution,
``MultiWorkerMirroredStrategy``, torch under ``DistributedDataParallel``)
every step all-reduces over the processes, so a process that ends
``fit()`` alone leaves the others in their next step's collectives until
the job is killed. Stock Keras checks the flag of its own process only.
The fork agrees on the flag after each epoch's ``on_epoch_end`` (one
collective of a scalar per epoch): every process ends ``fit()`` after
the epoch in which any process stopped.

Proof: 2 processes train 4 epochs of 4 steps; a callback sets
``stop_training`` in process 0 only, at the end of epoch 1. Every process
must end after epoch 1, with 8 optimizer steps. A second callback fails a
process that begins epoch 2 (stock: the other process), so that stock
fails at once, naming that process, instead of at the job's timeout. On
JAX, stock's process 1 does not reach epoch 2's first callback: it waits
in a collective before it (observed after its ``on_epoch_end``), so there
the run's bound ends it.
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("stop-training-processes")

GLOBAL_BATCH = 8
NUM_SAMPLES = 32  # 4 steps an epoch
EPOCHS = 4
STOP_AFTER = 1  # the epoch at whose end process 0 stops


class StopInProcessZero(keras.callbacks.Callback):
    """Sets ``stop_training`` at the end of epoch ``STOP_AFTER``, in the
    process of rank 0 only."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def on_epoch_end(self, epoch, logs=None):
        if epoch == STOP_AFTER and self.rank == 0:
            self.model.stop_training = True


class FailAfterTheStop(keras.callbacks.Callback):
    """Fails a process that begins an epoch after the one in which process
    0 stopped (before that epoch's first collective)."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def on_epoch_begin(self, epoch, logs=None):
        if epoch > STOP_AFTER:
            raise AssertionError(
                f"process {self.rank} began epoch {epoch} after process 0 "
                f"stopped training at the end of epoch {STOP_AFTER}"
            )


def _fit(scope, rank, world_size, local=False):
    """``fit()`` under ``scope`` with both callbacks; the epochs and the
    optimizer steps this process ran. ``local``: this process feeds its
    part of every global batch (JAX processes, torch); otherwise the whole
    data in global batches, which the strategy shards
    (``MultiWorkerMirroredStrategy``)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    process = (rank, world_size) if local else None
    (x, y), batch = data.process_batches([x, y], GLOBAL_BATCH, process)
    with scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        history = model.fit(
            x,
            y,
            batch_size=batch,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
            callbacks=[StopInProcessZero(rank), FailAfterTheStop(rank)],
        )
    return {
        "epochs": len(history.history["loss"]),
        "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
    }


def _assert_every_process_stopped(runs):
    """Every process ran epochs 0 and 1 (2 epochs of 4 steps) and ended.

    Stock: process 1 begins epoch 2 and fails there (``FailAfterTheStop``);
    ``run_workers`` raises, naming it."""
    for rank, run in enumerate(runs):
        assert run == {"epochs": STOP_AFTER + 1, "steps": 8}, (
            f"process {rank}: {run}"
        )


def _jax_processes(rank, world_size):
    distribution = devices.jax_processes(rank, world_size)
    return _fit(distribution.scope, rank, world_size, local=True)


@pytest.mark.topology("procs-2")
def test_jax_processes_stop_together():
    """jax/procs-2. The fork's workers need about 10 s on 2 CPU cores;
    60 s bounds the run, which is how stock fails here (its process 1
    waits for process 0, which ended ``fit()``: ``run_workers`` kills both
    and raises)."""
    runs = workers.run_workers(
        f"{__name__}:_jax_processes", world_size=2, timeout=60
    )
    _assert_every_process_stopped(runs)


def _multiworker(rank, world_size):
    strategy = devices.multi_worker_strategy(rank)
    return _fit(strategy.scope, rank, world_size)


@pytest.mark.topology("multiworker-2")
def test_multiworker_stops_together():
    """tensorflow/multiworker-2 (both workers feed the same arrays, which
    the strategy shards). The workers need about 20 s on 2 CPU cores;
    180 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker", world_size=2, timeout=180
    )
    _assert_every_process_stopped(runs)


def _torch_ddp(rank, world_size):
    with workers.torch_process_group(rank, world_size, timeout=30):
        return _fit(contextlib.nullcontext, rank, world_size, local=True)


@pytest.mark.topology("ddp-2")
def test_torch_ddp_processes_stop_together():
    """torch/ddp-2: a process group without a ``keras.distribution``
    (``fit`` wraps the model in ``DistributedDataParallel``), each process
    feeding its part of every global batch. The workers need about 20 s
    on 2 CPU cores; 180 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_torch_ddp", world_size=2, timeout=180
    )
    _assert_every_process_stopped(runs)


def _torch_dp(rank, world_size):
    with workers.torch_process_group(rank, world_size, timeout=30):
        distribution = devices.torch_processes(rank, world_size)
        # Auto-sharding takes a PyDataset or tf.data only: each process
        # feeds its part of every global batch, as on JAX.
        distribution.auto_shard_dataset = False
        return _fit(distribution.scope, rank, world_size, local=True)


@pytest.mark.topology("dp-2")
def test_torch_data_parallel_processes_stop_together():
    """torch/dp-2: ``keras.distribution.DataParallel`` over the processes.
    The workers need about 20 s on 2 CPU
    cores; 180 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_torch_dp", world_size=2, timeout=180
    )
    _assert_every_process_stopped(runs)
