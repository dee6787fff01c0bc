"""Proof of multi-process-checkpoints: one process writes a shared file.

In a multi-process job every process runs the callbacks of ``fit()``.
Stock Keras has every process write the same ``ModelCheckpoint`` file and
``BackupAndRestore`` directory: on one file system, one process fails to
lock the HDF5 file (``BlockingIOError``) and the others then die in their
next collective. The fork runs the save in every process, as before, and
has only the chief (JAX process 0, the worker ``tf.distribute``
checkpoints from) write the shared path; the others write to a temporary
directory of their own and remove it; when training begins the chief
restores first and the others wait for it. Proof:
2 processes train 3 epochs with a ``ModelCheckpoint`` saved at every step
and a ``BackupAndRestore``, interrupted after epoch 2 and resumed; every
process ends, with one device's weights, the checkpoint loads into a fresh
model with those weights, and only the checkpoint is left in the folder.
"""

import contextlib
import os

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("multi-process-checkpoints")

FOLDER_ENV = "CHECKPOINTS_FOLDER"
CHECKPOINT = "checkpoint.weights.h5"
GLOBAL_BATCH = 8
NUM_SAMPLES = 32  # 4 steps an epoch
EPOCHS = 3

# The processes sum the same per-sample gradient terms as one device in
# another order (per-process partial sums, then the all-reduce): float32
# reassociation moves each of the 12 steps by a few ulps (observed <=
# 1e-6). A process that did not resume, or resumed elsewhere, is off by
# 1e-2 or more.
RTOL, ATOL = 1e-5, 1e-6


class Interrupt(Exception):
    """Raised after the second epoch, in every process, to stop ``fit``."""


class InterruptAfterSecondEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise Interrupt()


def _data():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return x, y


def _flat(model):
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def _fit(scope, folder=None, process=None, fit_in_scope=True):
    """Trains 3 epochs from fixed weights; flat weights.

    ``scope``: makes the context to build (and, with ``fit_in_scope``,
    fit) the model in.

    With ``folder``: a ``ModelCheckpoint`` of the weights at every step
    and a ``BackupAndRestore`` there, ``fit`` interrupted after epoch 2,
    then called again, which resumes at epoch 3. ``process=(rank,
    world_size)``: feed that process's part of every global batch.
    """
    x, y = _data()
    (x, y), batch_size = data.process_batches((x, y), GLOBAL_BATCH, process)
    kwargs = dict(
        batch_size=batch_size, epochs=EPOCHS, shuffle=False, verbose=0
    )
    with scope():
        model = data.ones_mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    with scope() if fit_in_scope else contextlib.nullcontext():
        if folder is None:
            model.fit(x, y, **kwargs)
            return _flat(model).tolist()
        callbacks = [
            keras.callbacks.ModelCheckpoint(
                os.path.join(folder, CHECKPOINT),
                save_weights_only=True,
                save_freq=1,
            ),
            keras.callbacks.BackupAndRestore(os.path.join(folder, "backup")),
        ]
        try:
            model.fit(
                x,
                y,
                callbacks=callbacks + [InterruptAfterSecondEpoch()],
                **kwargs,
            )
        except Interrupt:
            pass
        else:
            raise AssertionError("fit() was not interrupted")
        model.fit(x, y, callbacks=callbacks, **kwargs)
    return _flat(model).tolist()


def _assert_one_device(runs, folder):
    """Every process's weights and the checkpoint's are one device's, and
    only the checkpoint is left in ``folder``."""
    for rank, (result, expected) in enumerate(runs):
        np.testing.assert_allclose(
            result, expected, rtol=RTOL, atol=ATOL, err_msg=f"process {rank}"
        )
    model = data.ones_mlp()
    model.load_weights(os.path.join(folder, CHECKPOINT))
    np.testing.assert_allclose(
        _flat(model), runs[0][1], rtol=RTOL, atol=ATOL, err_msg="checkpoint"
    )
    assert sorted(os.listdir(folder)) == [CHECKPOINT], os.listdir(folder)


def _jax_process_fits(rank, world_size):
    """In each ``jax/procs-2`` worker: under DataParallel over both
    processes, and on this process's one device without callbacks."""
    distribution = devices.jax_processes(rank, world_size)
    folder = os.environ[FOLDER_ENV]
    return [
        _fit(distribution.scope, folder, (rank, world_size)),
        _fit(contextlib.nullcontext),
    ]


@pytest.mark.topology("procs-2")
def test_jax_processes_checkpoint_and_resume(tmp_path):
    """jax/procs-2. The workers need about 30 s on 2 CPU cores; 300 s
    bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_jax_process_fits",
        world_size=2,
        timeout=300,
        env={FOLDER_ENV: str(tmp_path)},
    )
    _assert_one_device(runs, tmp_path)


def _multiworker_fits(rank, world_size):
    """In each ``multiworker-2`` worker: built under MultiWorkerMirrored
    and fit outside its scope (callbacks run outside it in any case), and
    on one device without callbacks."""
    strategy = devices.multi_worker_strategy(rank)
    folder = os.environ[FOLDER_ENV]
    return [
        _fit(strategy.scope, folder, fit_in_scope=False),
        _fit(contextlib.nullcontext),
    ]


@pytest.mark.topology("multiworker-2")
def test_multiworker_checkpoint_and_resume(tmp_path):
    """tensorflow/multiworker-2 (both workers feed the same arrays, which
    the strategy shards). The workers need about 30 s on 2 CPU cores;
    300 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_fits",
        world_size=2,
        timeout=300,
        env={FOLDER_ENV: str(tmp_path)},
    )
    _assert_one_device(runs, tmp_path)
