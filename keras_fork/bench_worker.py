"""One benchmark measurement in a fresh process (run by ``keras_fork.bench``).

``python -m keras_fork.bench_worker <workload> <json options>`` imports
whichever keras is first on PYTHONPATH (stock or fork), measures, and prints
one JSON line ``{"seconds": [...], "peak_mib": float}``: one duration per
repetition, in seconds, and the process's peak resident memory in MiB.
"""

import json
import os
import resource
import sys
import time


def shuffle(opts):
    """Per-epoch cost of shuffling ``samples`` array samples: time to the
    first batch of a new shuffled epoch (the permutation is drawn there)."""
    import numpy as np
    from keras.src.trainers.data_adapters import array_data_adapter

    n = opts["samples"]
    x = np.zeros((n, 1), "float32")
    adapter = array_data_adapter.ArrayDataAdapter(
        x, batch_size=opts["batch_size"], shuffle=True
    )
    out = []
    for _ in range(opts["epochs"]):
        start = time.perf_counter()
        next(iter(adapter.get_numpy_iterator()))
        out.append(time.perf_counter() - start)
    return out


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


def fit_step(opts):
    """Mean step time (seconds) of each epoch after the first (compilation)
    one; ``opts["model"]`` is ``"mlp"`` (default) or ``"cnn"``. With
    ``opts["metrics"]``, the model also tracks binary accuracy and AUC (200
    thresholds) on 0/1 targets: their state is what the fork's
    per-batch-logs sums over replicas every step. The epoch time includes
    the work done at its end (e.g. the fork's sync of on-read weights)."""
    import keras
    import numpy as np

    from integration_tests import topologies

    topology = topologies.current()
    build, input_shape = MODELS[opts.get("model", "mlp")]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(opts["samples"], *input_shape)).astype("float32")
    y = rng.normal(size=(opts["samples"], 1)).astype("float32")
    metrics = []
    if opts.get("metrics"):
        y = (y > 0).astype("float32")
        metrics = ["binary_accuracy", keras.metrics.AUC(name="auc")]
    times = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    with topology.scope():
        model = build(keras)
        model.compile(optimizer="sgd", loss="mse", metrics=metrics)
        model.fit(
            x,
            y,
            batch_size=opts["batch_size"],
            epochs=opts["epochs"] + 1,
            shuffle=True,
            verbose=0,
            callbacks=[Timer()],
        )
    steps = -(-opts["samples"] // opts["batch_size"])
    return [t / steps for t in times[1:]]


def stateless_call(opts):
    """Eager ``stateless_call`` (no gradient tracing, no ``training``)."""
    import keras
    import numpy as np

    model = _mlp(keras)
    x = np.ones((8, 32), "float32")
    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in model.non_trainable_variables]
    model.stateless_call(tv, ntv, x)
    out = []
    for _ in range(opts["repeats"]):
        start = time.perf_counter()
        for _ in range(opts["calls"]):
            model.stateless_call(tv, ntv, x)
        out.append((time.perf_counter() - start) / opts["calls"])
    return out


WORKLOADS = {
    "shuffle": shuffle,
    "fit_step": fit_step,
    "stateless_call": stateless_call,
}


if __name__ == "__main__":
    name, opts = sys.argv[1], json.loads(sys.argv[2])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    seconds = WORKLOADS[name](opts)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_mib": peak_kib / 1024}))
