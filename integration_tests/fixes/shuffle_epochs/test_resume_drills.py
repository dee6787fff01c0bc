"""Resume drills for the shuffle-epochs fix, across real process restarts.

A training job that dies and restarts must continue with the shuffle order
of the epoch it resumes at, so that the interrupted job reproduces the
uninterrupted one. Nothing survives a restart but the files on disk and the
seed the job sets; these drills restart for real:

(a) two stages in separate processes: ``fit(epochs=2)`` and ``save()`` to a
    ``.keras`` file, then ``load_model()`` and ``fit(initial_epoch=2)``;
(b) ``keras.callbacks.BackupAndRestore``: the test SIGKILLs the training
    process in the middle of epoch 2 and starts it again, which restores the
    epoch-1 backup and trains epochs 2 and 3.

Both must end with the weights of one uninterrupted ``fit(epochs=4)``,
computed in the test process. Stock (NumPy/JAX and torch paths) restarts
with the orders of the first epochs after each restart. On TensorFlow stock
repeats one order in every epoch, so a restart cannot go wrong there: guard
(test_shuffle_epochs.py proves tensorflow); it guards the fork's orders
drawn by the absolute epoch on the tf.data path.
"""

import os

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = [
    pytest.mark.fix("shuffle-epochs", guard_on=("tensorflow",)),
    pytest.mark.topology(
        multi_replica=False,
        reason=(
            "the drills restart one process on one replica: the order a "
            "restart resumes is drawn before the global batch is split "
            "over replicas, and test_shuffle_epochs.py's resume tests run "
            "on every topology"
        ),
    ),
]

NUM_SAMPLES = 64
GLOBAL_BATCH = 16
EPOCHS = 4
SEED = 1234
KILL_AT = (2, 1)  # (epoch, batch): the batch ends, then the process dies
TIMEOUT = 240  # seconds per worker process (startup ~5-10 s on 2 CPUs)


def _data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return x, y


def _initial_weights():
    # From a private generator: identical in every process, whatever the
    # backend's initializers draw.
    rng = np.random.default_rng(8)
    shapes = [(4, 8), (8,), (8, 1), (1,)]
    return [rng.normal(size=s).astype("float32") * 0.5 for s in shapes]


def _model():
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    model.set_weights(_initial_weights())
    # Momentum: the optimizer has state that the restart must restore too.
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse"
    )
    return model


def _fit(model, **kwargs):
    x, y = _data()
    model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=True, verbose=0, **kwargs)


def _weights(model):
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


class _DieAt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if (self._epoch, batch) == KILL_AT:
            workers.signal_and_wait()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


def worker(rank, world_size):
    """One process of a drill; the phase comes from ``DRILL_PHASE``."""
    topology = devices.current()
    phase, folder = os.environ["DRILL_PHASE"], os.environ["DRILL_DIR"]
    keras.utils.set_random_seed(SEED)
    with topology.scope():
        if phase == "stage-1":
            model = _model()
            _fit(model, epochs=2)
            model.save(os.path.join(folder, "stage-1.keras"))
            return None
        if phase == "stage-2":
            model = keras.saving.load_model(
                os.path.join(folder, "stage-1.keras")
            )
            _fit(model, epochs=EPOCHS, initial_epoch=2)
            return _weights(model).tolist()
        backup = keras.callbacks.BackupAndRestore(
            os.path.join(folder, "backup")
        )
        callbacks = [backup]
        if phase == "die":
            callbacks.append(_DieAt())
        model = _model()
        _fit(model, epochs=EPOCHS, callbacks=callbacks)
        return _weights(model).tolist()


def _uninterrupted(topology):
    keras.utils.set_random_seed(SEED)
    with topology.scope():
        model = _model()
        _fit(model, epochs=EPOCHS)
    return _weights(model)


def _assert_same_run(resumed, full):
    # The same ops on the same batches on one device, in another process of
    # the same build: bit-identical.
    np.testing.assert_array_equal(resumed, full)


def test_two_stages_in_separate_processes_equal_one_run(topology, tmp_path):
    env = {"DRILL_DIR": str(tmp_path)}
    target = f"{__name__}:worker"
    workers.run_workers(target, 1, TIMEOUT, dict(env, DRILL_PHASE="stage-1"))
    (resumed,) = workers.run_workers(
        target, 1, TIMEOUT, dict(env, DRILL_PHASE="stage-2")
    )
    full = _uninterrupted(topology)
    _assert_same_run(np.array(resumed, dtype="float32"), full)


def test_killed_mid_epoch_and_restarted_with_backup_equals_one_run(
    topology, tmp_path
):
    env = {"DRILL_DIR": str(tmp_path)}
    target = f"{__name__}:worker"
    status = workers.kill_at_signal(
        target, TIMEOUT, dict(env, DRILL_PHASE="die")
    )
    assert status == -9  # it died by SIGKILL, mid-epoch 2
    assert os.listdir(tmp_path / "backup"), "no backup written before death"
    (resumed,) = workers.run_workers(
        target, 1, TIMEOUT, dict(env, DRILL_PHASE="restart")
    )
    full = _uninterrupted(topology)
    _assert_same_run(np.array(resumed, dtype="float32"), full)
