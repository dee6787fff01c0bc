"""The features of the equivalence suite: what one run of each computes.

Each feature is a function ``run(feed) -> {name: array}`` that builds a
small model from fixed weights, trains or evaluates it on fixed data with
the feature on, and returns what a user would read back: the weights
after ``fit``, ``fit``'s per-epoch history, what ``evaluate`` returns,
the rows ``predict`` returns, the values in the files a callback wrote.
The suite (``test_equivalence``) runs it once under a topology and once
on one device, on the same global batches, and compares every name
(tf-keras compared the same things in
``tf_keras/distribute/*_correctness_test.py``).

``feed`` says how this process feeds the global batches (``Feed``): the
whole data in global batches (one device, ``MirroredStrategy``,
``MultiWorkerMirroredStrategy``, JAX ``DataParallel`` in one process),
or this process's part of every global batch (a multi-process JAX job).

This module imports keras only inside the feature functions, so that the
runner can list the features without a backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import numpy as np

from ..harness import data

GLOBAL_BATCH = 8  # divisible by every topology's replica count
NUM_SAMPLES = 32  # 4 global batches an epoch
EPOCHS = 2

# N replicas add up the same per-sample terms as one device, in another
# order (per-replica partial sums, then the all-reduce): float32
# reassociation moves each of the 8 steps by a few ulps, and the features
# below amplify that by at most a few times (Adam divides by a root of a
# second moment; a schedule or clipping scales by sums too); 1e-5 relative
# and 1e-6 absolute leave a margin of 10x over what one device shows
# between two orders of the same sums. A wrong aggregation moves results
# by 1e-3 or more (a replica's mean instead of the global batch's is
# off by the spread of the replicas' data, O(0.1) here).
RTOL, ATOL = 1e-5, 1e-6
# float16 compute rounds each product to 11 bits (2**-11 ~ 5e-4); over
# 8 steps, 2e-3 relative. A missed loss-scale agreement is a whole step.
RTOL_FLOAT16, ATOL_FLOAT16 = 5e-3, 5e-4
# bfloat16 keeps 8 bits: one unit in the last place is 2**-7 (7.8e-3) for
# outputs between 1 and 2, and a sum in another order can round to the
# next one.
RTOL_BFLOAT16, ATOL_BFLOAT16 = 3e-2, 1e-2


@dataclasses.dataclass(frozen=True)
class Feed:
    """How this process feeds the global batches, and where it writes.

    Attributes:
        scope: returns a new context to create, compile and fit under.
        folder: a folder for the files the feature writes; in a
            multi-process job, one folder every process names alike.
        rank, world_size: this process in a multi-process job; 0 and 1 in
            one process.
        local: whether this process feeds its part of every global batch
            (a multi-process JAX job, ``data.local_part``) rather than the
            whole data in global batches.
    """

    scope: object
    folder: Path
    rank: int = 0
    world_size: int = 1
    local: bool = False

    @property
    def multi_process(self) -> bool:
        """Whether this process is one of several of a job."""
        return self.world_size > 1

    @property
    def chief(self) -> bool:
        """Whether this process reads back the files (the one process of a
        job that writes them)."""
        return self.rank == 0

    def batches(self, *arrays):
        """``(arrays, batch_size)`` this process feeds (``data.
        process_batches``); a None array stays None."""
        process = (self.rank, self.world_size) if self.local else None
        present = [a for a in arrays if a is not None]
        parts, batch = data.process_batches(present, GLOBAL_BATCH, process)
        parts = iter(parts)
        return tuple(None if a is None else next(parts) for a in arrays), batch


@dataclasses.dataclass(frozen=True)
class Feature:
    """One row of the table.

    Attributes:
        name: the row's name, e.g. ``"optimizer/adam"``.
        run: ``run(feed) -> {name: array}``.
        rtol, atol: the comparison's tolerances (justified at their
            definition).
        not_on: ``{"<backend>" or "<backend>/<topology>": why}``: where
            the feature does not apply (the table's ``n/a``).
        multi_process_only: the feature compares the processes of a job
            with each other (a callback in one process), not a topology
            with one device.
    """

    name: str
    run: object
    rtol: float = RTOL
    atol: float = ATOL
    not_on: dict = dataclasses.field(default_factory=dict)
    multi_process_only: bool = False

    def not_applicable(self, backend: str, topology: str) -> str | None:
        """Why the feature does not apply to the cell, or None."""
        return self.not_on.get(f"{backend}/{topology}") or self.not_on.get(
            backend
        )


FEATURES: dict[str, Feature] = {}


class NotApplicable(Exception):
    """Raised by a feature that cannot run here (a package it needs is not
    installed): the cell is ``n/a`` with the message as its reason."""


def feature(name, **kwargs):
    """Registers the decorated ``run(feed)`` as feature ``name``."""

    def register(run):
        FEATURES[name] = Feature(name, run, **kwargs)
        return run

    return register


def _regression_data(outputs=1, seed=61):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, outputs)).astype("float32")
    return x, y


def _classification_data(classes=2, seed=62):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = (x[:, 0] + 0.5 * rng.normal(size=NUM_SAMPLES) > 0).astype("int32")
    if classes > 2:
        y = (np.digitize(x[:, 0], [-0.5, 0.5])).astype("int32")
    return x, y


def _fixed_weights(model, seed=0):
    """Sets every weight of ``model`` from a NumPy generator: the same
    values in every process and on every topology, whatever the backend's
    initializers draw."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [
            (0.5 * rng.normal(size=w.shape)).astype(w.dtype)
            if w.ndim
            else np.asarray(w)
            for w in model.get_weights()
        ]
    )


def _mlp(outputs=1, activation=None, hidden=8):
    import keras

    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(hidden, activation="tanh"),
            keras.layers.Dense(outputs, activation=activation),
        ]
    )
    _fixed_weights(model)
    return model


def _flat(model):
    return np.concatenate(
        [np.ravel(np.asarray(w, "float32")) for w in model.get_weights()]
    )


def _results(model, history, x, y, feed, sample_weight=None):
    """What a user reads back after ``fit``: weights, the history, what
    ``evaluate`` returns and the rows of ``predict`` (global batches, in
    order; in a multi-process job each process's own rows)."""
    (ex, ey, ew), batch = feed.batches(x, y, sample_weight)
    evaluated = model.evaluate(
        ex, ey, sample_weight=ew, batch_size=batch, verbose=0, return_dict=True
    )
    out = {"weights": _flat(model)}
    out.update({f"history/{k}": np.asarray(v) for k, v in history.items()})
    out.update({f"evaluate/{k}": np.asarray(v) for k, v in evaluated.items()})
    if not feed.local:
        out["predict"] = np.asarray(
            model.predict(x, batch_size=GLOBAL_BATCH, verbose=0), "float32"
        )
    return out


def _fit(feed, make_model, compile_kwargs, fit_kwargs=None, data_=None):
    """Creates, compiles and fits under ``feed.scope()``; ``_results``.

    ``compile_kwargs()`` returns ``compile``'s arguments; it is called in
    the scope, so that the optimizer is the strategy's."""
    x, y = data_ if data_ is not None else _regression_data()
    fit_kwargs = dict(fit_kwargs or {})
    sample_weight = fit_kwargs.pop("sample_weight", None)
    (fx, fy, fw), batch = feed.batches(x, y, sample_weight)
    with feed.scope():
        model = make_model()
        model.compile(**compile_kwargs())
        history = model.fit(
            fx,
            fy,
            sample_weight=fw,
            batch_size=batch,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
            **fit_kwargs,
        )
        return _results(model, history.history, x, y, feed, sample_weight)


def _sgd_fit(feed, optimizer, **compile_kwargs):
    compile_kwargs.setdefault("loss", "mse")
    compile_kwargs.setdefault("metrics", ["mae"])
    return _fit(
        feed, _mlp, lambda: dict(optimizer=optimizer(), **compile_kwargs)
    )


# --- optimizers ---------------------------------------------------------


@feature("optimizer/sgd-momentum")
def _sgd_momentum(feed):
    import keras

    return _sgd_fit(feed, lambda: keras.optimizers.SGD(0.05, momentum=0.9))


@feature("optimizer/adam")
def _adam(feed):
    import keras

    return _sgd_fit(feed, lambda: keras.optimizers.Adam(0.01))


@feature("optimizer/adamw-weight-decay")
def _adamw(feed):
    import keras

    return _sgd_fit(
        feed, lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)
    )


@feature("optimizer/learning-rate-schedule")
def _schedule(feed):
    import keras

    def make():
        schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5)
        return keras.optimizers.SGD(schedule)

    return _sgd_fit(feed, make)


@feature("optimizer/use-ema")
def _ema(feed):
    import keras

    return _sgd_fit(
        feed,
        lambda: keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5),
    )


@feature("optimizer/gradient-accumulation")
def _accumulation(feed):
    import keras

    return _sgd_fit(
        feed, lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
    )


# Bounds below the gradients of every step (norms 0.3 to 3 here), so that
# every step is clipped.
@feature("optimizer/clipnorm")
def _clipnorm(feed):
    import keras

    return _sgd_fit(feed, lambda: keras.optimizers.SGD(0.1, clipnorm=0.05))


@feature("optimizer/global-clipnorm")
def _global_clipnorm(feed):
    import keras

    return _sgd_fit(
        feed, lambda: keras.optimizers.SGD(0.1, global_clipnorm=0.05)
    )


@feature("optimizer/clipvalue")
def _clipvalue(feed):
    import keras

    return _sgd_fit(feed, lambda: keras.optimizers.SGD(0.1, clipvalue=0.01))


@contextlib.contextmanager
def _policy(name):
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


@feature(
    "optimizer/loss-scale-mixed-float16",
    rtol=RTOL_FLOAT16,
    atol=ATOL_FLOAT16,
)
def _loss_scale(feed):
    """Dynamic loss scaling with a step that overflows in one replica.

    The second batch of each epoch holds one sample whose error, scaled,
    overflows float16 in its own gradient (256 * 2 * 3000 / 8 > 65504,
    where the float32 loss's gradient is cast to the float16 output):
    that step is skipped and the scale halved on every layout, since the
    overflow is in one sample, not in a sum over the batch. Every other
    gradient stays under 1% of float16's range at the scale used. A scale
    near the range decides no step alike: a replica sums fewer samples in
    float16 than one device, so its partial sums overflow at a higher scale
    (measured on JAX: a bias gradient of 31424 and 32512 in each of 2
    processes, inf over the 8 samples at scale 16384), and a job can skip
    one step fewer than one device."""
    import keras

    x, y = _regression_data()
    y[GLOBAL_BATCH + GLOBAL_BATCH // 2 + 1] = 3000.0
    with _policy("mixed_float16"):
        return _fit(
            feed,
            _mlp,
            lambda: dict(
                optimizer=keras.optimizers.LossScaleOptimizer(
                    keras.optimizers.SGD(0.1), initial_scale=256.0
                ),
                loss="mse",
                metrics=["mae"],
            ),
            data_=(x, y),
        )


@feature("optimizer/mixed-bfloat16", rtol=RTOL_BFLOAT16, atol=ATOL_BFLOAT16)
def _bfloat16(feed):
    import keras

    with _policy("mixed_bfloat16"):
        return _sgd_fit(feed, lambda: keras.optimizers.SGD(0.1))


# --- losses and weights -------------------------------------------------


@feature("loss/sample-weight")
def _sample_weight(feed):
    import keras

    weights = np.linspace(0.0, 2.0, NUM_SAMPLES).astype("float32")
    return _fit(
        feed,
        _mlp,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"]
        ),
        dict(sample_weight=weights),
    )


@feature("loss/class-weight")
def _class_weight(feed):
    import keras

    return _fit(
        feed,
        lambda: _mlp(1, "sigmoid"),
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.5),
            loss="binary_crossentropy",
            metrics=["accuracy"],
        ),
        dict(class_weight={0: 0.25, 1: 2.0}),
        _classification_data(),
    )


def _two_outputs():
    import keras

    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    a = keras.layers.Dense(1, name="a")(hidden)
    b = keras.layers.Dense(1, name="b")(hidden)
    model = keras.Model(inputs, {"a": a, "b": b})
    _fixed_weights(model)
    return model


@feature("loss/multi-output-loss-weights")
def _multi_output(feed):
    import keras

    x, y = _regression_data(outputs=2)
    (fx, fa, fb), batch = feed.batches(x, y[:, :1], y[:, 1:])
    with feed.scope():
        model = _two_outputs()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss={"a": "mse", "b": "mae"},
            loss_weights={"a": 1.0, "b": 0.25},
            metrics={"a": ["mae"], "b": ["mse"]},
        )
        history = model.fit(
            fx,
            {"a": fa, "b": fb},
            batch_size=batch,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
        evaluated = model.evaluate(
            fx,
            {"a": fa, "b": fb},
            batch_size=batch,
            verbose=0,
            return_dict=True,
        )
    out = {"weights": _flat(model)}
    out.update(
        {f"history/{k}": np.asarray(v) for k, v in history.history.items()}
    )
    out.update({f"evaluate/{k}": np.asarray(v) for k, v in evaluated.items()})
    return out


def _sequences(seed=63):
    """Token sequences of length 6 padded with 0 at the end (lengths 2 to
    6), and a target per sequence."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 20, size=(NUM_SAMPLES, 6))
    lengths = rng.integers(2, 7, size=NUM_SAMPLES)
    tokens[np.arange(6)[None, :] >= lengths[:, None]] = 0
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return tokens.astype("int32"), y


@feature("layer/embedding-mask-zero-lstm")
def _masked_lstm(feed):
    import keras

    def make():
        model = keras.Sequential(
            [
                keras.Input((6,), dtype="int32"),
                keras.layers.Embedding(20, 4, mask_zero=True),
                keras.layers.LSTM(4),
                keras.layers.Dense(1),
            ]
        )
        _fixed_weights(model)
        return model

    return _fit(
        feed,
        make,
        lambda: dict(optimizer=keras.optimizers.SGD(0.1), loss="mse"),
        data_=_sequences(),
    )


@feature("layer/batchnorm-synchronized")
def _batchnorm(feed):
    import keras

    def make():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8),
                keras.layers.BatchNormalization(synchronized=True),
                keras.layers.Dense(1),
            ]
        )
        _fixed_weights(model)
        return model

    return _fit(
        feed,
        make,
        lambda: dict(optimizer=keras.optimizers.SGD(0.1), loss="mse"),
    )


# --- stateful metrics ---------------------------------------------------


def _metrics_fit(feed, metrics):
    import keras

    return _fit(
        feed,
        lambda: _mlp(1, "sigmoid"),
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.5),
            loss="binary_crossentropy",
            metrics=metrics(),
        ),
        data_=_classification_data(),
    )


@feature("metric/auc")
def _auc(feed):
    import keras

    return _metrics_fit(
        feed, lambda: [keras.metrics.AUC(num_thresholds=50, name="auc")]
    )


@feature("metric/precision-recall")
def _precision_recall(feed):
    import keras

    return _metrics_fit(
        feed,
        lambda: [
            keras.metrics.Precision(name="precision"),
            keras.metrics.Recall(name="recall"),
        ],
    )


@feature("metric/f1-score")
def _f1(feed):
    import keras

    x, y = _classification_data()
    y = y.astype("float32")[:, None]
    return _fit(
        feed,
        lambda: _mlp(1, "sigmoid"),
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.5),
            loss="binary_crossentropy",
            metrics=[keras.metrics.F1Score(threshold=0.5, name="f1_score")],
        ),
        data_=(x, y),
    )


@feature("metric/mean-iou")
def _mean_iou(feed):
    import keras

    return _fit(
        feed,
        lambda: _mlp(3, "softmax"),
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.5),
            loss="sparse_categorical_crossentropy",
            metrics=[
                keras.metrics.MeanIoU(
                    num_classes=3, sparse_y_pred=False, name="mean_iou"
                )
            ],
        ),
        data_=_classification_data(classes=3),
    )


# --- the *_on_batch methods ---------------------------------------------


@feature("model/on-batch")
def _on_batch(feed):
    import keras

    x, y = _regression_data()
    (fx, fy), batch = feed.batches(x, y)
    out = {}
    with feed.scope():
        model = _mlp()
        model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
        for step in range(len(fx) // batch):
            rows = slice(step * batch, (step + 1) * batch)
            logs = model.train_on_batch(fx[rows], fy[rows], return_dict=True)
        out.update({f"train/{k}": np.asarray(v) for k, v in logs.items()})
        logs = model.test_on_batch(fx[:batch], fy[:batch], return_dict=True)
        out.update({f"test/{k}": np.asarray(v) for k, v in logs.items()})
        if not feed.local:
            out["predict"] = np.asarray(model.predict_on_batch(fx[:batch]))
    out["weights"] = _flat(model)
    return out


# --- saving -------------------------------------------------------------


@feature("model/save-load-continue")
def _save_load(feed):
    import keras

    x, y = _regression_data()
    (fx, fy), batch = feed.batches(x, y)
    path = feed.folder / "model.keras"
    with feed.scope():
        model = _mlp()
        model.compile(keras.optimizers.Adam(0.01), "mse")
        model.fit(fx, fy, batch_size=batch, shuffle=False, verbose=0)
        model.save(path)
    _barrier(feed)
    with feed.scope():
        loaded = keras.saving.load_model(path)
        history = loaded.fit(fx, fy, batch_size=batch, shuffle=False, verbose=0)
    return {
        "weights": _flat(loaded),
        "history/loss": np.asarray(history.history["loss"]),
    }


def _barrier(feed):
    """Waits for every process of a multi-process job (a file the chief
    wrote is complete after it); nothing in one process."""
    if not feed.multi_process:
        return
    import keras

    if keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("equivalence")
    elif keras.backend.backend() == "torch":
        import torch.distributed as dist

        dist.barrier()
    else:
        import tensorflow as tf

        with feed.scope():
            strategy = tf.distribute.get_strategy()
        strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(
                "sum", tf.constant(0.0)
            )
        )


# --- fit's validation ---------------------------------------------------


@feature("fit/validation-split")
def _validation_split(feed):
    return _validation(feed, dict(validation_split=0.25))


def _validation(feed, fit_kwargs):
    import keras

    x, y = _regression_data()
    (fx, fy), batch = feed.batches(x, y)
    if "validation_data" in fit_kwargs:
        (vx, vy), _ = feed.batches(x[: GLOBAL_BATCH * 2], y[: GLOBAL_BATCH * 2])
        fit_kwargs = dict(fit_kwargs, validation_data=(vx, vy))
    with feed.scope():
        model = _mlp()
        model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
        history = model.fit(
            fx,
            fy,
            batch_size=batch,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
            **fit_kwargs,
        )
    out = {"weights": _flat(model)}
    out.update(
        {f"history/{k}": np.asarray(v) for k, v in history.history.items()}
    )
    return out


@feature("fit/validation-freq")
def _validation_freq(feed):
    return _validation(feed, dict(validation_data=True, validation_freq=2))


@feature("fit/jit-compile")
def _jit_compile(feed):
    import keras

    if keras.backend.backend() == "tensorflow" and not feed.multi_process:
        with feed.scope():
            import tensorflow as tf

            strategy = tf.distribute.get_strategy()
        # The default strategy (one device, the reference) has no
        # worker_devices.
        devices = ()
        if isinstance(strategy, tf.distribute.MirroredStrategy):
            devices = strategy.extended.worker_devices
        if len(devices) > 1 and all("CPU" in d.upper() for d in devices):
            raise NotApplicable(
                "TensorFlow runs an XLA-compiled step on one device, which "
                "cannot read the variables of the other CPU devices of one "
                "process (stock: InvalidArgumentError); on GPUs it applies"
            )

    return _fit(
        feed,
        _mlp,
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.01),
            loss="mse",
            metrics=["mae"],
            jit_compile=True,
        ),
    )


# --- callbacks ----------------------------------------------------------


def _callback_fit(feed, callbacks, epochs=4, rate=0.1, **fit_kwargs):
    import keras

    x, y = _regression_data()
    (fx, fy), batch = feed.batches(x, y)
    with feed.scope():
        model = _mlp()
        model.compile(keras.optimizers.SGD(rate), "mse", metrics=["mae"])
        history = model.fit(
            fx,
            fy,
            batch_size=batch,
            epochs=epochs,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
            **fit_kwargs,
        )
    out = {"weights": _flat(model), "epochs": np.asarray(len(history.epoch))}
    out.update(
        {f"history/{k}": np.asarray(v) for k, v in history.history.items()}
    )
    return out, model


@feature("callback/model-checkpoint-save-best-only")
def _checkpoint(feed):
    import keras

    # The loss falls every epoch, so with mode="max" the best epoch is the
    # first: the file holds the weights of epoch 0, not the last ones.
    path = feed.folder / "best.weights.h5"
    callback = keras.callbacks.ModelCheckpoint(
        path,
        monitor="loss",
        mode="max",
        save_best_only=True,
        save_weights_only=True,
    )
    out, model = _callback_fit(feed, [callback])
    # Every process loads the file (its variables may span the processes,
    # so that assigning them is a step every process takes).
    _barrier(feed)
    with feed.scope():
        model.load_weights(path)
    out["file/weights"] = _flat(model)
    return out


@feature("callback/backup-and-restore-resume")
def _backup(feed):
    import keras

    folder = feed.folder / "backup"

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt("interrupted after epoch 1")

    x, y = _regression_data()
    (fx, fy), batch = feed.batches(x, y)
    with feed.scope():
        model = _mlp()
        model.compile(keras.optimizers.Adam(0.01), "mse")
        backup = keras.callbacks.BackupAndRestore(folder)
        try:
            model.fit(
                fx,
                fy,
                batch_size=batch,
                epochs=4,
                shuffle=False,
                verbose=0,
                callbacks=[backup, Interrupt()],
            )
        except KeyboardInterrupt:
            pass
        _barrier(feed)
        model = _mlp()
        model.compile(keras.optimizers.Adam(0.01), "mse")
        history = model.fit(
            fx,
            fy,
            batch_size=batch,
            epochs=4,
            shuffle=False,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(folder)],
        )
    return {
        "weights": _flat(model),
        "resumed_epochs": np.asarray(history.epoch),
        "history/loss": np.asarray(history.history["loss"]),
    }


@feature("callback/early-stopping-restore-best")
def _early_stopping(feed):
    import keras

    # No epoch improves on the first by min_delta: fit stops after epoch
    # 1 and restores the weights of epoch 0.
    callback = keras.callbacks.EarlyStopping(
        monitor="loss", min_delta=10.0, patience=1, restore_best_weights=True
    )
    out, _ = _callback_fit(feed, [callback], epochs=6)
    return out


@feature("callback/reduce-lr-on-plateau")
def _reduce_lr(feed):
    import keras

    callback = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", patience=0, factor=0.5, min_delta=10.0
    )
    out, model = _callback_fit(feed, [callback])
    out["learning_rate"] = np.asarray(
        keras.ops.convert_to_numpy(model.optimizer.learning_rate)
    )
    return out


@feature("callback/terminate-on-nan")
def _terminate_on_nan(feed):
    import keras

    # A rate at which the loss overflows to inf/nan within a few steps.
    out, _ = _callback_fit(
        feed,
        [keras.callbacks.TerminateOnNaN()],
        epochs=3,
        rate=1e3,
    )
    return {"epochs": out["epochs"]}


@feature("callback/learning-rate-scheduler")
def _lr_scheduler(feed):
    import keras

    callback = keras.callbacks.LearningRateScheduler(
        lambda epoch, lr: 0.1 / (1 + epoch)
    )
    out, _ = _callback_fit(feed, [callback], epochs=3)
    return out


@feature("callback/csv-logger")
def _csv_logger(feed):
    import keras

    path = feed.folder / "log.csv"
    out, _ = _callback_fit(feed, [keras.callbacks.CSVLogger(path)], epochs=3)
    _barrier(feed)
    if feed.chief:
        rows = np.genfromtxt(path, delimiter=",", names=True)
        for name in rows.dtype.names:
            out[f"file/{name}"] = np.asarray(rows[name])
    return out


@feature("callback/tensorboard")
def _tensorboard(feed):
    import keras

    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise NotApplicable("the tensorboard package is not installed")
    folder = feed.folder / "logs"
    out, _ = _callback_fit(
        feed, [keras.callbacks.TensorBoard(folder)], epochs=2
    )
    _barrier(feed)
    if feed.chief:
        written = sorted(
            str(p.relative_to(folder).parent)
            for p in folder.rglob("*tfevents*")
        )
        out["file/event-folders"] = np.asarray(len(written))
    return out


@feature("callback/stop-training-in-one-process", multi_process_only=True)
def _stop_in_one_process(feed):
    """A custom callback sets ``stop_training`` in the process of rank 0
    only, at the end of epoch 1: every process must stop there, after the
    same number of steps, and end."""
    import keras

    rank = feed.rank

    class StopInOne(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1 and rank == 0:
                self.model.stop_training = True

    out, model = _callback_fit(feed, [StopInOne()], epochs=4)
    return {
        "epochs": out["epochs"],
        "iterations": np.asarray(
            keras.ops.convert_to_numpy(model.optimizer.iterations)
        ),
    }
