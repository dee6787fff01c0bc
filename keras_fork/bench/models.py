"""The models and data of the step workloads (``opts["model"]``,
``opts["metrics"]``).
"""


def _mlp(keras):
    return keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def _cnn(keras):
    """A small CNN with BatchNormalization (moving statistics per replica
    under tf.distribute: the fork's bn-replica-stats syncs them each epoch).
    Input: 16x16 RGB images."""
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(16, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Conv2D(16, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1),
        ]
    )


MODELS = {"mlp": (_mlp, (32,)), "cnn": (_cnn, (16, 16, 3))}


def model_and_data(opts):
    """The model builder of ``opts["model"]`` (``"mlp"`` by default) and
    its data: ``opts["samples"]`` normal inputs and targets, ``(samples,
    ...)`` and ``(samples, 1)``, the same in every process."""
    import numpy as np

    build, input_shape = MODELS[opts.get("model", "mlp")]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(opts["samples"], *input_shape)).astype("float32")
    y = rng.normal(size=(opts["samples"], 1)).astype("float32")
    return build, x, y


def step_metrics(keras, opts, y):
    """``(targets, metrics)`` of a step case: with ``opts["metrics"]``, 0/1
    targets (``y > 0``) and binary accuracy and AUC (200 thresholds), else
    ``y`` and no metric."""
    if not opts.get("metrics"):
        return y, []
    metrics = ["binary_accuracy", keras.metrics.AUC(name="auc")]
    return (y > 0).astype("float32"), metrics
