"""Proof of the shuffle-epochs fix (keras-team/keras#20577, follow-up).

The order of epoch ``e`` must be a pure function of (Keras seed, absolute
epoch ``e``): epochs differ, every sample is seen once per epoch, and a run
resumed at ``initial_epoch`` from a saved ``.keras`` model equals the
uninterrupted run. Stock repeats the same order every epoch on the tf.data
path (TensorFlow backend) and replays the first epochs' orders after a
resume on the NumPy/JAX and torch paths. On the master base the Keras
seed's part of the tf.data path's order is a patch the fork carries on top
of its PRs (whether the seed decides the order is a design question of the
master PR series).
"""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.fix("shuffle-epochs")
BACKEND = keras.backend.backend()
NUM_SAMPLES = 64
GLOBAL_BATCH = 16  # divisible by every replica count (1, 2, 8)


class Recorder(keras.layers.Layer):
    """Records the sample ids (feature 0) each replica sees, in eager mode.

    ``record`` is a callable (e.g. ``list.append``): a list attribute would
    be replaced by a tracked copy of it.
    """

    def __init__(self, record, **kwargs):
        super().__init__(**kwargs)
        self._record = record

    def call(self, x):
        try:
            ids = keras.ops.convert_to_numpy(x[:, 0])
        except Exception:
            return x  # a symbolic or traced build pass has no ids
        self._record(ids.astype(int))
        return x

    def compute_output_shape(self, input_shape):
        return input_shape


def _ids():
    ids = np.arange(NUM_SAMPLES, dtype="float32")[:, None]
    return np.concatenate([ids, np.zeros_like(ids)], axis=1), ids


@pytest.mark.fix("shuffle-epochs", guard_on=("jax", "torch"))
def test_epochs_differ_and_each_sees_every_sample_once(topology):
    """Sample ids seen per step in eager mode. Each epoch covers every id
    exactly once; epoch 0 and 1 batch differently. (On jax/torch stock
    draws a new global-RNG order each epoch: guard there.)

    Per-step sets (not sequences) are compared, since replicas of one step
    may log in any order. Two independent shuffles of 64 ids into 4 batches
    of 16 give the same batch sets with probability (16!^4)/64! < 1e-30.
    """
    x, y = _ids()
    keras.utils.set_random_seed(5)
    log = []
    with topology.scope():
        model = keras.Sequential(
            [keras.Input((2,)), Recorder(log.append), keras.layers.Dense(1)]
        )
        model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
        # The build-time trace may log a symbolic batch: start counting now.
        model.predict(x[:GLOBAL_BATCH], verbose=0)
        log.clear()
        model.fit(
            x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=True, verbose=0
        )
    ids = np.concatenate(log)
    assert len(ids) == 2 * NUM_SAMPLES, len(ids)
    epochs = [ids[:NUM_SAMPLES], ids[NUM_SAMPLES:]]
    for e in epochs:
        np.testing.assert_array_equal(np.sort(e), np.arange(NUM_SAMPLES))
    steps = [
        [frozenset(e[i : i + GLOBAL_BATCH]) for i in range(0, 64, 16)]
        for e in epochs
    ]
    assert steps[0] != steps[1], "epoch 1 repeated epoch 0's batches"


def _mlp():
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )


def _weights(model):
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


@pytest.mark.fix("shuffle-epochs", guard_on=("tensorflow",))
def test_resume_from_saved_model_equals_uninterrupted_run(topology, tmp_path):
    """fit(4 epochs) == fit(2) + save .keras + load + fit(initial_epoch=2).

    (On tensorflow stock repeats one order every epoch, so resuming cannot
    go wrong there: guard; the epoch test above proves tensorflow.)

    Tolerance: on one device both runs execute the same ops on the same
    batches, and .keras stores float32 exactly: bit-identical (atol 0).
    With several replicas the cross-replica gradient all-reduce may sum in
    another order between the two runs' compilations: rtol 1e-5. A wrong
    order moves the weights by far more; the control measures that.
    """
    rng = np.random.default_rng(3)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    fit = dict(batch_size=GLOBAL_BATCH, shuffle=True, verbose=0)
    keras.utils.set_random_seed(11)
    with topology.scope():
        full = _mlp()
        init = full.get_weights()
        full.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        full.fit(x, y, epochs=4, **fit)

        first = _mlp()
        first.set_weights(init)
        first.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        first.fit(x, y, epochs=2, **fit)
        path = str(tmp_path / "stage1.keras")
        first.save(path)
    # A new "process": nothing survives but the file and the seed.
    keras.backend.clear_session()
    keras.utils.set_random_seed(11)
    with topology.scope():
        resumed = keras.saving.load_model(path)
        resumed.fit(x, y, epochs=4, initial_epoch=2, **fit)

        # The control trains on another order, the unshuffled one: it shows
        # that the order moves the weights. Not another seed: on master's
        # stock the seed does not act on the tf.data path (seeded-shuffle's
        # bug, keras-team/keras#23046), where this test is a guard.
        control = _mlp()
        control.set_weights(init)
        control.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        control.fit(x, y, epochs=4, **dict(fit, shuffle=False))

    # This fix's symptom first: a resumed run that does not continue with
    # the orders of epochs 2 and 3.
    if topology.num_replicas == 1:
        np.testing.assert_array_equal(_weights(resumed), _weights(full))
    else:
        np.testing.assert_allclose(
            _weights(resumed), _weights(full), rtol=1e-5, atol=1e-6
        )
    assert np.max(np.abs(_weights(control) - _weights(full))) > 1e-3
