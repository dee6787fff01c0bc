"""Proof of atomic-save: a save renames a complete file onto its path.

In a multi-process job where every process runs the same script, each
calls ``model.save(path)`` on the same shared path, then loads it. Stock
Keras opens the path for writing and writes the archive into it, so a
process can load a file another is still writing, or one that two wrote
at once (``BadZipFile``). The fork writes a file of its own beside the
path and renames it onto the path once it is complete (``os.replace``).
Proof: 2 processes train an epoch, save the model to one path, load it
and train another epoch. A layer of the model checks the path in the
middle of each save, while every process is inside its save (a barrier
on each side of the check): there is no file yet, or a whole one. After
the saves every process loads the model with one device's weights and
trains on to one device's, and only the model file is left."""

import contextlib
import os
import tempfile
import zipfile

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("atomic-save")

FOLDER_ENV = "ATOMIC_SAVE_FOLDER"
MODEL = "model.keras"
GLOBAL_BATCH = 8
NUM_SAMPLES = 32  # 4 steps an epoch

# The processes sum the same per-sample gradient terms as one device in
# another order (per-process partial sums, then the all-reduce): float32
# reassociation moves each of the 8 steps by a few ulps (observed <= 1e-6).
# A model loaded from another step, or not loaded, is off by 1e-2 or more.
RTOL, ATOL = 1e-5, 1e-6


@keras.saving.register_keras_serializable(package="atomic_save")
class SaveProbe(keras.layers.Layer):
    """An identity layer that calls ``on_save()`` in the middle of a save
    (``save_own_variables``: the file is open for writing, not complete)."""

    on_save = None

    def call(self, x):
        return x

    def save_own_variables(self, store):
        if self.on_save is not None:
            self.on_save()


def _data():
    rng = np.random.default_rng(21)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return x, y


def _flat(model):
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def _is_whole(path):
    """No file at ``path`` yet, or a whole ``.keras`` archive."""
    if not os.path.exists(path):
        return True
    return zipfile.is_zipfile(path) and zipfile.ZipFile(path).testzip() is None


def _save_load_continue(scope, folder, barrier=None, process=None):
    """Trains an epoch, saves to ``folder``, loads, trains another epoch.

    ``barrier``: waits for every process (``None`` in one process).
    ``process=(rank, world_size)``: feed that process's part of every
    global batch. Returns the flat weights after the save, after the load
    and at the end, and what each check in the middle of the save saw.
    """
    (x, y), batch_size = data.process_batches(_data(), GLOBAL_BATCH, process)
    kwargs = dict(batch_size=batch_size, shuffle=False, verbose=0)
    path = os.path.join(folder, MODEL)
    seen = []

    def check_path():
        barrier()  # every process is inside its save
        seen.append(_is_whole(path))
        barrier()  # every process has checked

    with scope():
        model = data.ones_mlp()
        model.add(SaveProbe())
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        model.fit(x, y, **kwargs)
        if barrier is not None:
            model.layers[-1].on_save = check_path
        model.save(path)
    if barrier is not None:
        barrier()  # every process has saved
    with scope():
        loaded = keras.saving.load_model(path)
        after_load = _flat(loaded).tolist()
        loaded.fit(x, y, **kwargs)
    return {
        "saved": _flat(model).tolist(),
        "loaded": after_load,
        "final": _flat(loaded).tolist(),
        "seen": seen,
    }


def _one_device():
    with tempfile.TemporaryDirectory() as folder:
        return _save_load_continue(contextlib.nullcontext, folder)


def _assert_one_device(runs, folder):
    """Every check saw a whole file; every process loaded one device's
    weights and trained on to one device's; only the model is left."""
    for rank, (result, expected) in enumerate(runs):
        assert result["seen"] == [True], (
            f"process {rank}: in the middle of the saves, {MODEL} was "
            "neither absent nor a whole archive"
        )
        for key in ("saved", "loaded", "final"):
            np.testing.assert_allclose(
                result[key],
                expected[key],
                rtol=RTOL,
                atol=ATOL,
                err_msg=f"process {rank}: {key}",
            )
    assert sorted(os.listdir(folder)) == [MODEL], os.listdir(folder)


def _jax_process_saves(rank, world_size):
    """In each ``jax/procs-2`` worker: under DataParallel over both
    processes, and on this process's one device."""
    distribution = devices.jax_processes(rank, world_size)
    from jax.experimental import multihost_utils

    def barrier():
        multihost_utils.sync_global_devices("atomic-save")

    folder = os.environ[FOLDER_ENV]
    return [
        _save_load_continue(
            distribution.scope, folder, barrier, (rank, world_size)
        ),
        _one_device(),
    ]


@pytest.mark.topology("procs-2")
def test_jax_processes_save_one_path(tmp_path):
    """jax/procs-2. The workers need about 20 s on 2 CPU cores; 300 s
    bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_jax_process_saves",
        world_size=2,
        timeout=300,
        env={FOLDER_ENV: str(tmp_path)},
    )
    _assert_one_device(runs, tmp_path)


def _multiworker_saves(rank, world_size):
    """In each ``multiworker-2`` worker: under MultiWorkerMirrored (both
    workers feed the same arrays, which the strategy shards), and on one
    device."""
    strategy = devices.multi_worker_strategy(rank)
    import tensorflow as tf

    def barrier():
        strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(
                "sum", tf.constant(0.0)
            )
        )

    folder = os.environ[FOLDER_ENV]
    return [
        _save_load_continue(strategy.scope, folder, barrier),
        _one_device(),
    ]


@pytest.mark.topology("multiworker-2")
def test_multiworker_save_one_path(tmp_path):
    """tensorflow/multiworker-2. The workers need about 20 s on 2 CPU
    cores; 300 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_saves",
        world_size=2,
        timeout=300,
        env={FOLDER_ENV: str(tmp_path)},
    )
    _assert_one_device(runs, tmp_path)
