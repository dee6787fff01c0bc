"""Callbacks that record what ``fit`` reports, to compare two runs."""

import keras


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
