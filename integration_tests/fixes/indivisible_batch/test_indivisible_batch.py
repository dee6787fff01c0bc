"""Proof of indivisible-batch: a JAX batch that does not split over devices.

JAX ``DataParallel`` shards every batch along its batch dimension over the
devices of the mesh. An epoch's last batch is usually smaller, and its size
need not be a multiple of the device count (33 samples in batches of 16 on
8 devices leave a batch of 1; 39 leave 7). Stock Keras 3.15.1 fails on it
in ``fit``, ``evaluate`` and ``predict`` with JAX's ``IndivisibleError``
(keras-team/keras#21167). The fork places such a batch whole on every device
(single-process jobs only), so the step computes what one device computes.

Proof (jax/8): training, evaluation and prediction with such last batches
equal one device on the same global batches, BatchNormalization's moving
statistics included. Other cells are n/a: one device always divides, a
multi-process job keeps JAX's error (each process holds only its part of the
batch), and tf.distribute splits uneven batches itself (the uneven-batch
fix).
"""

import contextlib
import warnings

import keras
import numpy as np
import pytest

from ...harness import recorders

pytestmark = pytest.mark.fix("indivisible-batch")

GLOBAL_BATCH = 16
EPOCHS = 2

# The full batches are sharded over 8 devices, which sum their per-sample
# terms (loss, BatchNormalization moments) in another order than one device:
# float32 reassociation moves each of the 6 steps by a few ulps, far below
# 1e-5 (observed <= 1e-6). A dropped, repeated or misweighted last batch
# moves the weights by 1e-3 or more.
RTOL = ATOL = 1e-5


def _data(num_samples):
    # A private generator: the data must not depend on global RNG state.
    rng = np.random.default_rng(11)
    x = rng.normal(size=(num_samples, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1)) + 0.5).astype("float32")
    sample_weight = rng.uniform(0.5, 1.5, size=(num_samples,)).astype("float32")
    return x, y, sample_weight


def _model():
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1),
        ]
    )


def _run(scope, init, x, y, sample_weight):
    """Fits, evaluates and predicts with a fresh model from ``init``.

    Returns:
        A dict of numpy arrays: weights (flat, moving statistics included),
        per-step reported losses, epoch losses, evaluate() loss and
        predictions (num_samples, 1).
    """
    with scope:
        model = _model()
        model.set_weights(init)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        fitted = recorders.fit_and_evaluate(
            model, x, y, GLOBAL_BATCH, EPOCHS, sample_weight
        )
        predictions = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    return {
        "weights": fitted.weights,
        "per-step loss": fitted.step_losses,
        "epoch loss": np.asarray(fitted.history["loss"]),
        "evaluate loss": np.asarray(fitted.evaluated),
        "predictions": np.asarray(predictions),
    }


@pytest.mark.parametrize(
    "num_samples,weighted",
    [(33, False), (39, True)],
    ids=["33-last-1", "39-last-7-weighted"],
)
@pytest.mark.topology(
    backend="jax",
    multi_replica=True,
    reason="only multi-device JAX shards a batch over devices",
)
def test_indivisible_last_batch_matches_one_device(
    topology, num_samples, weighted
):
    """An epoch's last batch that the devices cannot split (1 or 7 samples
    on 8 devices): fit, evaluate and predict equal one device."""
    x, y, sample_weight = _data(num_samples)
    if not weighted:
        sample_weight = None
    keras.utils.set_random_seed(1)
    init = _model().get_weights()
    expected = _run(contextlib.nullcontext(), init, x, y, sample_weight)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _run(topology.scope(), init, x, y, sample_weight)
    for name, want in expected.items():
        np.testing.assert_allclose(
            result[name], want, rtol=RTOL, atol=ATOL, err_msg=name
        )
    # The fork says that it replicated the batch (the user may be using a
    # batch size that never divides); full batches split and stay silent.
    messages = {str(w.message) for w in caught}
    assert any(
        f"has size {num_samples % GLOBAL_BATCH}, which does not split" in m
        for m in messages
    ), messages
    assert not any("has size 16" in m for m in messages), messages
