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


def fit_step(opts):
    """Mean step time of each epoch after the first (compilation) one."""
    import keras
    import numpy as np

    from integration_tests import topologies

    topology = topologies.current()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(opts["samples"], 32)).astype("float32")
    y = rng.normal(size=(opts["samples"], 1)).astype("float32")
    times = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    with topology.scope():
        model = _mlp(keras)
        model.compile(optimizer="sgd", loss="mse")
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
