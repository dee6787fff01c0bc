"""One benchmark measurement in a fresh process (run by ``keras_fork.bench``).

``python -m keras_fork.bench_worker <workload> <json options>`` imports
whichever keras is first on PYTHONPATH (stock or fork), measures, and prints
one JSON line ``{"seconds": [...], "peak_mib": float}``: one duration per
repetition, in seconds, and the process's peak resident memory in MiB (the
worker processes' largest, for a workload that starts workers).
"""

import json
import os
import resource
import sys
import time


def _result(seconds):
    """The JSON document of a measurement: ``seconds`` (a list) and this
    process's peak resident memory in MiB."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mib": peak_kib / 1024}


def shuffle(opts):
    """Per-epoch cost of shuffling ``samples`` array samples (no data: a
    ``(samples, 1)`` array of zeros) on the input path ``opts["path"]``,
    one duration per epoch after an untimed first one (tracing, imports):

    * ``"numpy"`` (the JAX and NumPy path): time to the first batch of a
      new epoch, where the order is drawn (stock: ``np.random.permutation``;
      fork: a private ``np.random.Generator``); later batches are sliced
      alike.
    * ``"tf"``: time to the first batch of a new pass over the
      ``tf.data.Dataset``, created once as ``fit`` does (stock:
      ``tf.random.shuffle``; fork: the same NumPy permutation in a
      ``tf.numpy_function``).
    * ``"torch"``: one whole pass over the ``DataLoader``'s batch sampler,
      the indices of every batch without their data (stock: a
      ``RandomSampler`` in a ``BatchSampler``, a Python int at a time;
      fork: the NumPy permutation, sliced per batch).
    """
    import numpy as np
    from keras.src.trainers.data_adapters import array_data_adapter

    n = opts["samples"]
    x = np.zeros((n, 1), "float32")
    adapter = array_data_adapter.ArrayDataAdapter(
        x, batch_size=opts["batch_size"], shuffle=True
    )
    path = opts.get("path", "numpy")
    if path == "numpy":

        def epoch():
            next(iter(adapter.get_numpy_iterator()))

    elif path == "tf":
        dataset = adapter.get_tf_dataset()

        def epoch():
            next(iter(dataset))

    elif path == "torch":
        batch_sampler = adapter.get_torch_dataloader().batch_sampler

        def epoch():
            for _ in batch_sampler:
                pass

    else:
        raise ValueError(f"unknown input path {path!r}")
    epoch()
    out = []
    for _ in range(opts["epochs"]):
        start = time.perf_counter()
        epoch()
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


def _model_and_data(opts):
    """The model builder of ``opts["model"]`` (``"mlp"`` by default) and
    its data: ``opts["samples"]`` normal inputs and targets, ``(samples,
    ...)`` and ``(samples, 1)``, the same in every process."""
    import numpy as np

    build, input_shape = MODELS[opts.get("model", "mlp")]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(opts["samples"], *input_shape)).astype("float32")
    y = rng.normal(size=(opts["samples"], 1)).astype("float32")
    return build, x, y


def fit_step(opts):
    """Mean step time (seconds) of each epoch after the first (compilation)
    one; ``opts["model"]`` is ``"mlp"`` (default) or ``"cnn"``. With
    ``opts["metrics"]``, the model also tracks binary accuracy and AUC (200
    thresholds) on 0/1 targets: their state is what the fork's
    per-batch-logs sums over replicas every step. The epoch time includes
    the work done at its end (e.g. the fork's sync of on-read weights)."""
    import keras

    from integration_tests import topologies

    topology = topologies.current()
    build, x, y = _model_and_data(opts)
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


def ddp_step(opts):
    """Mean step time (seconds) of each epoch after the first of a Keras
    model trained in a torch ``DistributedDataParallel`` loop
    (``topologies.torch_train``, the Keras guide's way to train on several
    devices with PyTorch: ``Model.fit`` has no multi-device mode there) by
    ``opts["processes"]`` gloo processes on 127.0.0.1, each feeding its part
    of every global batch of ``opts["batch_size"]``. Per epoch, the slower
    process's time (the all-reduce in ``backward`` keeps them in step);
    the peak memory is the larger of the processes'."""
    from integration_tests import multiprocess

    runs = multiprocess.run_workers(
        "keras_fork.bench_worker:_ddp_worker",
        world_size=opts["processes"],
        timeout=600,
        env={"BENCH_OPTS": json.dumps(opts)},
    )
    return {
        "seconds": [max(times) for times in zip(*(r["seconds"] for r in runs))],
        "peak_mib": max(r["peak_mib"] for r in runs),
    }


def _ddp_worker(rank, world_size):
    """One process of ``ddp_step``; returns its step time per epoch and its
    peak memory (``_result``)."""
    import keras

    from integration_tests import multiprocess
    from integration_tests import topologies

    opts = json.loads(os.environ["BENCH_OPTS"])
    build, x, y = _model_and_data(opts)
    (x, y), batch_size = topologies.process_batches(
        (x, y), opts["batch_size"], (rank, world_size)
    )
    ends = []
    with multiprocess.torch_process_group(rank, world_size):
        model = build(keras)
        start = time.perf_counter()
        topologies.torch_train(
            model,
            keras.optimizers.SGD(),
            x,
            y,
            batch_size,
            opts["epochs"] + 1,
            ddp=True,
            on_epoch_end=lambda _: ends.append(time.perf_counter()),
        )
    steps = -(-len(x) // batch_size)
    times = [b - a for a, b in zip([start] + ends, ends)]
    return _result([t / steps for t in times[1:]])


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
    "ddp_step": ddp_step,
    "stateless_call": stateless_call,
}


if __name__ == "__main__":
    name, opts = sys.argv[1], json.loads(sys.argv[2])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = WORKLOADS[name](opts)
    if not isinstance(result, dict):
        result = _result(result)
    print(json.dumps(result))
