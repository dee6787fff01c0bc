"""Callbacks that record what ``fit`` reports, to compare two runs."""

import dataclasses

import keras
import numpy as np


class StepLosses(keras.callbacks.Callback):
    """Records the running loss ``fit`` reports after every step.

    Attributes:
        losses: ``logs["loss"]`` of every ``on_train_batch_end`` since the
            last ``on_train_begin``, as Python floats (one per step, all
            epochs in order).
    """

    def on_train_begin(self, logs=None):
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


@dataclasses.dataclass
class FitResult:
    """What ``fit_and_evaluate`` saw.

    Attributes:
        weights: every weight of the model after ``fit``, flattened and
            concatenated (moving statistics included).
        step_losses: the loss ``fit`` reported after each step, (steps,).
        history: ``fit``'s ``keras.callbacks.History.history`` (metric
            name to per-epoch values).
        evaluated: what ``evaluate`` returned after ``fit``.
    """

    weights: np.ndarray
    step_losses: np.ndarray
    history: dict
    evaluated: object


def fit_and_evaluate(
    model, x, y, batch_size, epochs, sample_weight=None, return_dict=False
) -> FitResult:
    """Fits ``model`` on ``x, y`` unshuffled, then evaluates it on them.

    Call it under the scope the model was built in. Both calls see the same
    ``batch_size`` (the global batch) and ``sample_weight``.
    """
    steps = StepLosses()
    history = model.fit(
        x,
        y,
        sample_weight=sample_weight,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[steps],
    )
    evaluated = model.evaluate(
        x,
        y,
        sample_weight=sample_weight,
        batch_size=batch_size,
        verbose=0,
        return_dict=return_dict,
    )
    weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
    return FitResult(
        weights, np.asarray(steps.losses), history.history, evaluated
    )
