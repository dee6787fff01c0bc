"""One benchmark measurement in a fresh process (run by ``keras_fork.bench``).

``python -m keras_fork.bench.worker <workload> <json options>`` imports
whichever keras is first on PYTHONPATH (stock or fork), measures, and prints
one JSON line ``{"seconds": [...], "peak_mib": float}``: one duration per
repetition, in seconds, and the process's peak resident memory in MiB (the
worker processes' largest, for a workload that starts workers).

Timed runs go in lockstep with the benchmark (``keras_fork.bench``):
with ``BENCH_GATE=127.0.0.1:<port>`` in the environment, the worker
connects there (``protocol.Gate``) and runs each measured repetition only
when told to, so that the stock and fork workers of a round, both alive,
take turns and never run at the same time. ``BENCH_CPU=<n>`` pins the
worker (and its threads) to CPU ``n``.

With ``"work": true`` in the options, the step workloads count instead of
timing (``python -m keras_fork bench --work``): ``"calls_per_step"``, the
Python function calls per step of each measured repetition (``cProfile``'s
count: every Python function and every C function called from Python,
hence every op dispatched from Python), and ``"graph"``, the size and digest
of the compiled step (``counters.compiled_step``), or ``None`` where the
step runs eagerly. Counts do not depend on the machine's load, so a
difference of a few calls per step is resolved where a timing is not.
"""

import contextlib
import json
import os
import sys
import tempfile
import time

from keras_fork.bench import counters
from keras_fork.bench import models
from keras_fork.bench import multiprocess
from keras_fork.bench import protocol


def shuffle(opts, gate):
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
        gate.wait()
        start = time.perf_counter()
        epoch()
        out.append(time.perf_counter() - start)
        gate.report(out[-1])
    return out


def fit_step(opts, gate):
    """Mean step time (seconds) of each epoch after the first (compilation)
    one; ``opts["model"]`` is ``"mlp"`` (default) or ``"cnn"``. With
    ``opts["metrics"]``, the model also tracks binary accuracy and AUC (200
    thresholds) on 0/1 targets: their state is what the fork's
    per-batch-logs sums over replicas every step. The epoch time includes
    the work done at its end (e.g. the fork's sync of on-read weights).
    With ``opts["work"]``, counts calls per step instead (module doc)."""
    import keras

    from integration_tests.harness import devices

    topology = devices.current()
    build, x, y = models.model_and_data(opts)
    steps = -(-opts["samples"] // opts["batch_size"])
    y, metrics = models.step_metrics(keras, opts, y)
    times = []
    counter = counters.CallCounter(enabled=opts.get("work", False))

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch:
                gate.wait()
                counter.start()
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)
            if epoch:
                counter.stop()
                gate.report(times[-1] / steps)

    reductions = contextlib.nullcontext()
    if opts.get("work") and topology.strategy is not None:
        reductions = counters.TFReductionCounter()
    with topology.scope(), reductions:
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
    if opts.get("work"):
        return _work_result(model, counter, reductions, steps, opts)
    return [t / steps for t in times[1:]]


def _work_result(model, counter, reductions, steps, opts):
    """``fit_step``'s counts: Python calls per step, the compiled step and,
    under a ``tf.distribute`` strategy, its cross-replica reductions."""
    graph = counters.compiled_step(model, opts["hlo_dump_dir"])
    if graph is not None and isinstance(
        reductions, counters.TFReductionCounter
    ):
        # The step is traced once (the batches divide the samples).
        total_steps = steps * (opts["epochs"] + 1)
        graph["collectives"] = reductions.traced["calls"]
        graph["reduced_tensors"] = reductions.traced["tensors"]
        graph["eager_per_step"] = reductions.eager["calls"] / total_steps
    return protocol.measurement(
        [], calls_per_step=[c / steps for c in counter.counts], graph=graph
    )


def stateless_call(opts, gate):
    """Eager ``stateless_call`` (no gradient tracing, no ``training``):
    seconds per call, or with ``opts["work"]`` Python calls per call."""
    import keras
    import numpy as np

    model = models._mlp(keras)
    x = np.ones((8, 32), "float32")
    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in model.non_trainable_variables]
    model.stateless_call(tv, ntv, x)
    out = []
    counter = counters.CallCounter(enabled=opts.get("work", False))
    for _ in range(opts["repeats"]):
        gate.wait()
        counter.start()
        start = time.perf_counter()
        for _ in range(opts["calls"]):
            model.stateless_call(tv, ntv, x)
        out.append((time.perf_counter() - start) / opts["calls"])
        counter.stop()
        gate.report(out[-1])
    if opts.get("work"):
        return protocol.measurement(
            [],
            calls_per_step=[c / opts["calls"] for c in counter.counts],
            graph=None,
        )
    return out


WORKLOADS = {
    "shuffle": shuffle,
    "fit_step": fit_step,
    "ddp_step": multiprocess.ddp_step,
    "dp_fit_step": multiprocess.dp_fit_step,
    "jax_procs_fit_step": multiprocess.jax_procs_fit_step,
    "stateless_call": stateless_call,
}


if __name__ == "__main__":
    name, opts = sys.argv[1], json.loads(sys.argv[2])
    if os.environ.get("BENCH_CPU"):
        # Before any framework starts its threads: they inherit the CPU.
        os.sched_setaffinity(0, {int(os.environ["BENCH_CPU"])})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="bench-hlo-") as dump_dir:
        if opts.get("work"):
            # Before jax starts (it reads XLA_FLAGS once): dump the modules
            # of the training step as compiled, for counters.compiled_step.
            os.environ["XLA_FLAGS"] = (
                f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump_dir}"
                " --xla_dump_hlo_as_text"
                " --xla_dump_hlo_module_re=.*train_step.*"
            ).strip()
            opts["hlo_dump_dir"] = dump_dir
        gate = protocol.Gate.from_env()
        result = WORKLOADS[name](opts, gate)
        gate.close()
    if not isinstance(result, dict):
        result = protocol.measurement(result)
    print(json.dumps(result))
