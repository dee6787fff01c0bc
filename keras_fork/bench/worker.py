"""One benchmark measurement in a fresh process (run by ``keras_fork.bench``).

``python -m keras_fork.bench.worker <workload> <json options>`` imports
whichever keras is first on PYTHONPATH (stock or fork), measures, and prints
one JSON line ``{"seconds": [...], "peak_mib": float}``: one duration per
repetition, in seconds, and the process's peak resident memory in MiB (the
worker processes' largest, for a workload that starts workers).

Timed runs go in lockstep with the benchmark (``keras_fork.bench``):
with ``BENCH_GATE=127.0.0.1:<port>`` in the environment, the worker
connects there (``Gate``) and runs each measured repetition only when told
to, so that the stock and fork workers of a round, both alive, take turns
and never run at the same time. ``BENCH_CPU=<n>`` pins the worker (and its
threads) to CPU ``n``.

With ``"work": true`` in the options, the step workloads count instead of
timing (``python -m keras_fork bench --work``): ``"calls_per_step"``, the
Python function calls per step of each measured repetition (``cProfile``'s
count: every Python function and every C function called from Python,
hence every op dispatched from Python), and ``"graph"``, the size and digest
of the compiled step (``compiled_step``), or ``None`` where the step runs
eagerly. Counts do not depend on the machine's load, so a difference of a
few calls per step is resolved where a timing is not.
"""

import collections
import contextlib
import cProfile
import glob
import hashlib
import json
import os
import pstats
import re
import resource
import socket
import sys
import tempfile
import time


def _result(seconds, **extra):
    """The JSON document of a measurement: ``seconds`` (a list), this
    process's peak resident memory in MiB, and ``extra``."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mib": peak_kib / 1024, **extra}


# Seconds a worker waits for its next turn: the other variant's longest
# repetition (an epoch of a multi-device case) plus its start-up.
GATE_TIMEOUT = 600


class Gate:
    """The worker's side of the lockstep with ``keras_fork.bench``.

    A line protocol over a TCP connection to ``address`` (127.0.0.1 only),
    ASCII, one message a line:

    * worker: connects and sends ``{"ready": true}`` when it first waits
      (its warm-up done: a process that never waits never connects);
    * bench: ``go``, run one repetition; worker: ``{"seconds": t}``;
    * bench closes the connection when the round is over; the worker then
      exits (``close``), so that its teardown overlaps no measurement.

    A gate made with ``address=None`` (a work count, a test) lets every
    repetition run at once. Every wait is bounded by ``GATE_TIMEOUT``.
    """

    def __init__(self, address=None):
        self._address = None
        self._file = None
        if address:
            host, port = address.rsplit(":", 1)
            if host != "127.0.0.1":
                raise ValueError(f"the gate is on 127.0.0.1, not {host!r}")
            self._address = (host, int(port))

    @classmethod
    def from_env(cls):
        """The gate named by ``BENCH_GATE``, or a no-op one."""
        return cls(os.environ.get("BENCH_GATE"))

    def wait(self):
        """Blocks until the benchmark says ``go``."""
        if self._address is None:
            return
        if self._file is None:
            sock = socket.create_connection(self._address, GATE_TIMEOUT)
            self._file = sock.makefile("rw", encoding="ascii", newline="\n")
            self._send({"ready": True})
        line = self._file.readline()
        if line != "go\n":
            raise RuntimeError(f"benchmark gate: expected 'go', got {line!r}")

    def report(self, seconds):
        """Sends the duration (seconds) of the repetition just run."""
        if self._file is not None:
            self._send({"seconds": seconds})

    def close(self):
        """Waits for the benchmark to end the round (it closes)."""
        if self._file is not None:
            self._file.read()
            self._file.close()

    def _send(self, message):
        self._file.write(json.dumps(message) + "\n")
        self._file.flush()


class CallCounter:
    """Counts the Python function calls made between ``start`` and
    ``stop`` (``cProfile``: Python functions and the C functions they call,
    https://docs.python.org/3/library/profile.html), one count per
    start/stop, in ``counts``. Only the calling thread is counted. A
    counter made with ``enabled=False`` (a timed run) counts nothing."""

    def __init__(self, enabled=True):
        self.enabled = enabled
        self.counts = []
        self._profile = None

    def start(self):
        if self.enabled:
            self._profile = cProfile.Profile()
            self._profile.enable()

    def stop(self):
        if self.enabled:
            self._profile.disable()
            self.counts.append(pstats.Stats(self._profile).total_calls)


_HLO_INSTRUCTION = re.compile(r"^\s+(ROOT )?%?[\w.-]+ = ")
_HLO_LOCATION = re.compile(r", (metadata=\{[^}]*\}|stack_frame_id=\d+)")


def canonical_hlo(text):
    """The instructions of an HLO text dump without their source locations.

    Args:
        text: an XLA ``*after_optimizations.txt`` dump (``--xla_dump_to``
            with ``--xla_dump_hlo_as_text``).

    Returns:
        The instruction lines, stripped, with ``metadata={...}`` and
        ``stack_frame_id=N`` removed: those name the Python file and line
        that emitted each op, which differ between two installs of the
        same code.
    """
    return [
        _HLO_LOCATION.sub("", line.strip())
        for line in text.splitlines()
        if _HLO_INSTRUCTION.match(line)
    ]


# XLA's cross-device collectives, as HLO opcodes (the async forms start
# with "-start"): https://openxla.org/xla/operation_semantics.
_HLO_COLLECTIVE = re.compile(
    r" (all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)"
    r"(-start)?\("
)


def hlo_collectives(lines):
    """How many cross-device collectives a compiled XLA program runs.

    Args:
        lines: ``canonical_hlo`` instruction lines.

    Returns:
        The number of instructions whose opcode is a collective (an async
        pair counts once, by its ``-start``).
    """
    return sum(1 for line in lines if _HLO_COLLECTIVE.search(line))


# The graphs Keras's TF trainer traces a training step into, and those of
# the control flow inside them; any other graph a reduction is made in
# never runs per step (Keras's shape-inference "scratch" graphs, a
# function traced only for its output structure).
_TF_STEP_GRAPHS = re.compile(
    r"^(one_step_on_data|one_step_on_iterator|multi_step)"
)
_TF_CONTROL_FLOW = re.compile(r"^(while|cond|body|true|false)", re.IGNORECASE)


def _tf_in_step_graph():
    """Whether ops built now go into a traced training step (``None``
    when eager)."""
    import tensorflow as tf

    if not tf.inside_function():
        return None
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        name = getattr(graph, "name", "")
        if _TF_STEP_GRAPHS.match(name):
            return True
        if not _TF_CONTROL_FLOW.match(name):
            return False
        graph = getattr(graph, "outer_graph", None)
    return False


class TFReductionCounter:
    """Counts the cross-replica reductions of a ``tf.distribute`` training
    step, by wrapping the public entry points: ``ReplicaContext.all_reduce``
    (gradient aggregation), ``Strategy.reduce`` and
    ``StrategyExtended.reduce_to`` / ``batch_reduce_to`` (reads of on-read
    variables such as metric state, on-write updates, per-replica
    outputs), one count per outermost call
    (https://www.tensorflow.org/api_docs/python/tf/distribute).

    ``traced``: calls made while tracing the training step (or the control
    flow in it, ``_tf_in_step_graph``): each is a reduction the step runs
    every time. ``eager``: calls made eagerly, each run once. On CPU,
    MirroredStrategy reduces by copies and AddN rather than collective ops,
    so counting the graph's op types would miss them.
    """

    def __init__(self):
        import threading

        self.traced = {"calls": 0, "tensors": 0}
        self.eager = {"calls": 0, "tensors": 0}
        # Per thread: MirroredStrategy runs each replica in a thread of its
        # own, and a call nests others (all_reduce -> batch_reduce_to).
        self._local = threading.local()
        self._saved = None

    def _counts(self) -> bool:
        """Whether a call made now is counted: the outermost one of this
        thread, and in replica context only replica 0's (every replica
        makes the same call for one reduction)."""
        import tensorflow as tf

        if getattr(self._local, "depth", 0):
            return False
        if tf.distribute.in_cross_replica_context():
            return True
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.get_static_value(replica) in (0, None)

    def _wrap(self, fn, tensors_of, pairs_at=None):
        counter = self

        def counted(*args, **kwargs):
            if pairs_at is not None and len(args) > pairs_at:
                # (value, destination) pairs may come as a generator, which
                # counting them would use up.
                args = (
                    *args[:pairs_at],
                    list(args[pairs_at]),
                    *args[pairs_at + 1 :],
                )
            if counter._counts():
                where = _tf_in_step_graph()
                bucket = {None: counter.eager, True: counter.traced}.get(where)
                if bucket is not None:
                    bucket["calls"] += 1
                    bucket["tensors"] += tensors_of(args)
            local = counter._local
            local.depth = getattr(local, "depth", 0) + 1
            try:
                return fn(*args, **kwargs)
            finally:
                local.depth -= 1

        return counted

    def __enter__(self):
        import tensorflow as tf

        ext, ctx = tf.distribute.StrategyExtended, tf.distribute.ReplicaContext
        strategy = tf.distribute.Strategy
        self._saved = (
            ext.reduce_to,
            ext.batch_reduce_to,
            ctx.all_reduce,
            strategy.reduce,
        )
        strategy.reduce = self._wrap(strategy.reduce, lambda a: 1)
        ext.reduce_to = self._wrap(ext.reduce_to, lambda a: 1)
        ext.batch_reduce_to = self._wrap(
            ext.batch_reduce_to, lambda a: len(a[2]), pairs_at=2
        )
        ctx.all_reduce = self._wrap(
            ctx.all_reduce, lambda a: len(tf.nest.flatten(a[2]))
        )
        return self

    def __exit__(self, *exc):
        import tensorflow as tf

        ext, ctx = tf.distribute.StrategyExtended, tf.distribute.ReplicaContext
        strategy = tf.distribute.Strategy
        (
            ext.reduce_to,
            ext.batch_reduce_to,
            ctx.all_reduce,
            strategy.reduce,
        ) = self._saved


def _digest(lines):
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def compiled_step(model, hlo_dump_dir):
    """The size and digest of ``model``'s compiled training step.

    * JAX: the XLA modules of the jitted ``train_step`` as compiled
      (``*train_step*after_optimizations.txt`` in ``hlo_dump_dir``),
      ``canonical_hlo``: ``ops`` counts instructions.
    * TensorFlow: the graphs of the ``tf.function``\ s that
      ``model.train_function`` closes over, with their function libraries:
      ``ops`` counts nodes, the digest covers the count of each op type
      (not the wiring).
    * torch (eager): ``None``.

    Returns:
        ``{"kind": str, "ops": int, "digest": str}`` or ``None``.
    """
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        lines = []
        pattern = os.path.join(hlo_dump_dir, "*train_step*.txt")
        for path in sorted(glob.glob(pattern)):
            if path.endswith("after_optimizations.txt"):
                with open(path) as f:
                    lines += canonical_hlo(f.read())
        return {
            "kind": "XLA HLO",
            "ops": len(lines),
            "digest": _digest(lines),
            "collectives": hlo_collectives(lines),
        }
    if backend == "tensorflow":
        ops = collections.Counter()
        for fn in _tf_functions(model.train_function, set()):
            for concrete in fn._list_all_concrete_functions():
                graph_def = concrete.graph.as_graph_def()
                ops.update(node.op for node in graph_def.node)
                for f in graph_def.library.function:
                    ops.update(node.op for node in f.node_def)
        lines = [f"{op} {n}" for op, n in sorted(ops.items())]
        return {
            "kind": "TF graph",
            "ops": sum(ops.values()),
            "digest": _digest(lines),
        }
    return None


def _tf_functions(fn, seen):
    """The ``tf.function``\ s reachable from ``fn`` through closures
    (Keras's TF trainer wraps them in plain Python functions)."""
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    if hasattr(fn, "_list_all_concrete_functions"):
        return [fn]
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value):
            found += _tf_functions(value, seen)
    return found


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


def _metrics(keras, opts, y):
    """``(targets, metrics)`` of a step case: with ``opts["metrics"]``, 0/1
    targets (``y > 0``) and binary accuracy and AUC (200 thresholds), else
    ``y`` and no metric."""
    if not opts.get("metrics"):
        return y, []
    metrics = ["binary_accuracy", keras.metrics.AUC(name="auc")]
    return (y > 0).astype("float32"), metrics


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
    build, x, y = _model_and_data(opts)
    steps = -(-opts["samples"] // opts["batch_size"])
    y, metrics = _metrics(keras, opts, y)
    times = []
    counter = CallCounter(enabled=opts.get("work", False))

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
        reductions = TFReductionCounter()
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
    graph = compiled_step(model, opts["hlo_dump_dir"])
    if graph is not None and isinstance(reductions, TFReductionCounter):
        # The step is traced once (the batches divide the samples).
        total_steps = steps * (opts["epochs"] + 1)
        graph["collectives"] = reductions.traced["calls"]
        graph["reduced_tensors"] = reductions.traced["tensors"]
        graph["eager_per_step"] = reductions.eager["calls"] / total_steps
    return _result(
        [], calls_per_step=[c / steps for c in counter.counts], graph=graph
    )


def ddp_step(opts, gate):
    """Mean step time (seconds) of each epoch after the first of a Keras
    model trained in a torch ``DistributedDataParallel`` loop
    (``data.torch_train``, the Keras guide's way to train on several
    devices with PyTorch: ``Model.fit`` has no multi-device mode there) by
    ``opts["processes"]`` gloo processes on 127.0.0.1, each feeding its part
    of every global batch of ``opts["batch_size"]``. Per epoch, the slower
    process's time (the all-reduce in ``backward`` keeps them in step);
    the peak memory is the larger of the processes'. With ``opts["work"]``,
    the calls per step of the process that makes more. In lockstep, rank 0
    holds the gate (``gate`` is not used here) and the processes meet at a
    barrier around each epoch, whose time is then the slower's."""
    _, result = _run_processes("_ddp_worker", opts)
    if opts.get("work"):
        result["graph"] = None
    return result


def _run_processes(target, opts):
    """Runs ``opts["processes"]`` workers of ``target`` (a function of this
    module) on 127.0.0.1; returns their results and the combined one: per
    epoch the slower process's seconds, the larger peak memory and, with
    ``opts["work"]``, per epoch the larger calls per step."""
    from integration_tests.harness import workers

    runs = workers.run_workers(
        f"keras_fork.bench.worker:{target}",
        world_size=opts["processes"],
        timeout=600,
        env={"BENCH_OPTS": json.dumps(opts)},
    )
    result = {
        "seconds": [max(times) for times in zip(*(r["seconds"] for r in runs))],
        "peak_mib": max(r["peak_mib"] for r in runs),
    }
    if opts.get("work"):
        result["calls_per_step"] = [
            max(calls) for calls in zip(*(r["calls_per_step"] for r in runs))
        ]
    return runs, result


def _ddp_worker(rank, world_size):
    """One process of ``ddp_step``; returns its step time per epoch and its
    peak memory (``_result``)."""
    import keras
    import torch

    from integration_tests.harness import data
    from integration_tests.harness import workers

    opts = json.loads(os.environ["BENCH_OPTS"])
    build, x, y = _model_and_data(opts)
    (x, y), batch_size = data.process_batches(
        (x, y), opts["batch_size"], (rank, world_size)
    )
    times = []
    clock = [0.0]  # when the current epoch started
    counter = CallCounter(enabled=opts.get("work", False))
    lockstep = "BENCH_GATE" in os.environ
    gate = Gate.from_env() if rank == 0 else Gate()

    def on_epoch_end(epoch):
        if lockstep:
            torch.distributed.barrier()
        times.append(time.perf_counter() - clock[0])
        if epoch:
            counter.stop()
            gate.report(times[-1] / steps)
        if epoch < opts["epochs"]:
            gate.wait()
            if lockstep:
                torch.distributed.barrier()
            counter.start()
            clock[0] = time.perf_counter()

    steps = -(-len(x) // batch_size)
    # Rank 1 waits at a barrier while rank 0 waits for its turn: as long as
    # the gate may take.
    with workers.torch_process_group(rank, world_size, GATE_TIMEOUT):
        model = build(keras)
        clock[0] = time.perf_counter()
        data.torch_train(
            model,
            keras.optimizers.SGD(),
            x,
            y,
            batch_size,
            opts["epochs"] + 1,
            ddp=True,
            on_epoch_end=on_epoch_end,
        )
        gate.close()
        if lockstep:
            torch.distributed.barrier()  # rank 1 exits after the round too
    return _result(
        [t / steps for t in times[1:]],
        calls_per_step=[c / steps for c in counter.counts],
    )


class TorchCollectiveCounter(CallCounter):
    """Counts the collectives of torch's process group run between
    ``start`` and ``stop``: the ``torch.profiler`` events that the
    process group records for each one it runs (``gloo:all_reduce``,
    ``nccl:all_gather``, ...), so DDP's gradient all-reduce and DTensor's
    redistributions count as well as direct ``torch.distributed`` calls.
    A counter made with ``enabled=False`` counts nothing.

    Attributes:
        counts: one ``{event name: count}`` per start/stop.
    """

    PREFIXES = ("gloo:", "nccl:")

    def start(self):
        if self.enabled:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            self._profile = torch.profiler.profile(activities=activities)
            self._profile.__enter__()

    def stop(self):
        if self.enabled:
            self._profile.__exit__(None, None, None)
            names = collections.Counter(
                e.name
                for e in self._profile.events()
                if e.name.startswith(self.PREFIXES)
            )
            self.counts.append(dict(names))


def dp_fit_step(opts, gate):
    """Mean step time (seconds) of each epoch after the first of Keras ``fit()``
    under ``keras.distribution.DataParallel`` over ``opts["processes"]``
    torch processes (gloo on 127.0.0.1, one CPU device each;
    keras-team/keras#23316, on master only), each process feeding its part
    of every global batch of ``opts["batch_size"]``
    (``data.process_batches``; no auto-sharding). Per epoch, the slower
    process's time. With ``opts["work"]``, the calls per step of the process
    that makes more, and ``graph``: the process group's collectives per step
    over the epochs after the first (``TorchCollectiveCounter``; the larger
    process's), as ``{"kind": "eager", "collectives": n, "by_kind":
    {...}}``. Options as ``fit_step`` (``model``, ``metrics``); with
    ``opts["input"] == "iterable"``, the same batches from a torch
    ``IterableDataset`` (no known length)."""
    return _processes_fit_step("_dp_fit_worker", opts)


def jax_procs_fit_step(opts, gate):
    """``dp_fit_step`` over ``opts["processes"]`` JAX processes (gloo on
    127.0.0.1, one CPU device each), under
    ``keras.distribution.DataParallel`` with ``auto_shard_dataset=False``:
    each process feeds its part of every global batch. With
    ``opts["work"]``, ``graph`` counts the gathers across processes that
    Keras runs on the host per step (``JAXGatherCounter``: the step-count
    comparisons of jax-unknown-steps), not the collectives compiled into
    the step. With ``opts["input"] == "tf.data-filter"``, the same batches
    from a ``tf.data.Dataset`` after ``filter()`` (no known length)."""
    return _processes_fit_step("_jax_procs_fit_worker", opts)


def _processes_fit_step(target, opts):
    """Runs ``target`` in each process (``_run_processes``); with
    ``opts["work"]``, ``graph`` is the process's that counted more
    collectives per step."""
    runs, result = _run_processes(target, opts)
    if opts.get("work"):
        result["graph"] = max(
            (r["graph"] for r in runs), key=lambda g: g["collectives"]
        )
    return result


def _dp_fit_worker(rank, world_size):
    """One process of ``dp_fit_step``: its step time per epoch, peak
    memory and, with ``work``, its counts (``_result``)."""
    import keras

    from integration_tests.harness import data
    from integration_tests.harness import devices
    from integration_tests.harness import workers

    opts = json.loads(os.environ["BENCH_OPTS"])
    build, x, y = _model_and_data(opts)
    y, metrics = _metrics(keras, opts, y)
    # Each process feeds its part of every global batch (arrays are not
    # auto-sharded).
    (x, y), batch_size = data.process_batches(
        (x, y), opts["batch_size"], (rank, world_size)
    )
    if opts.get("input") == "iterable":
        # The same batches from a torch `IterableDataset`: an input whose
        # length Keras cannot know before it runs out.
        x, y, batch_size = _iterable_batches(x, y, batch_size), None, None
    epochs = _DPEpochs(rank, opts.get("work", False))
    # Rank 1 waits at a barrier while rank 0 waits for its turn: as long as
    # the gate may take.
    with workers.torch_process_group(rank, world_size, GATE_TIMEOUT):
        distribution = devices.torch_processes(rank, world_size)
        distribution.auto_shard_dataset = False
        with distribution.scope():
            model = build(keras)
            model.compile(optimizer="sgd", loss="mse", metrics=metrics)
            model.fit(
                x,
                y,
                batch_size=batch_size,
                epochs=opts["epochs"] + 1,
                shuffle=True,
                verbose=0,
                callbacks=[epochs.callback(keras)],
            )
        epochs.gate.close()
    return epochs.result()


def _iterable_batches(x, y, batch_size):
    """A ``DataLoader`` of a torch ``IterableDataset`` that yields ``(x,
    y)`` in batches of ``batch_size`` rows, in order, each epoch: an input
    of unknown length (``num_batches`` is ``None``)."""
    import torch

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            for start in range(0, len(x), batch_size):
                end = start + batch_size
                yield x[start:end], y[start:end]

    return torch.utils.data.DataLoader(Batches(), batch_size=None)


def _torch_barrier():
    import torch

    torch.distributed.barrier()


def _jax_procs_fit_worker(rank, world_size):
    """One process of ``jax_procs_fit_step``: its step time per epoch,
    peak memory and, with ``work``, its counts (``_result``)."""
    from integration_tests.harness import data
    from integration_tests.harness import devices

    opts = json.loads(os.environ["BENCH_OPTS"])
    # Before any JAX computation.
    distribution = devices.jax_processes(rank, world_size)
    import keras
    from jax.experimental import multihost_utils

    build, x, y = _model_and_data(opts)
    with distribution.scope():
        # The metrics' variables too: a JAX variable made outside the scope
        # lives on this process's device alone.
        y, metrics = _metrics(keras, opts, y)
    (x, y), batch_size = data.process_batches(
        (x, y), opts["batch_size"], (rank, world_size)
    )
    if opts.get("input") == "tf.data-filter":
        x, y, batch_size = _filtered_batches(x, y, batch_size), None, None
    work = opts.get("work", False)
    epochs = _DPEpochs(
        rank,
        work,
        collectives=JAXGatherCounter(work),
        barrier=lambda: multihost_utils.sync_global_devices("bench epoch"),
    )
    with distribution.scope():
        model = build(keras)
        model.compile(optimizer="sgd", loss="mse", metrics=metrics)
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=opts["epochs"] + 1,
            shuffle=True,
            verbose=0,
            callbacks=[epochs.callback(keras)],
        )
    epochs.gate.close()
    return epochs.result()


def _filtered_batches(x, y, batch_size):
    """``(x, y)`` in batches of ``batch_size`` rows, in order, from a
    ``tf.data.Dataset`` after ``filter()``: an input of unknown length
    (cardinality -2), read anew each epoch."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.filter(lambda *row: True).batch(batch_size)


class JAXGatherCounter(CallCounter):
    """Counts the calls of ``jax.experimental.multihost_utils.
    process_allgather`` between ``start`` and ``stop``, from any thread:
    the gathers across JAX processes that Keras runs on the host (e.g. to
    compare the processes' batches), not those compiled into the step.
    A counter made with ``enabled=False`` counts nothing.

    Attributes:
        counts: one ``{"process_allgather": count}`` per start/stop.
    """

    def start(self):
        if self.enabled:
            from jax.experimental import multihost_utils

            calls = collections.Counter()
            gather = multihost_utils.process_allgather

            def counted(*args, **kwargs):
                calls["process_allgather"] += 1
                return gather(*args, **kwargs)

            self._restore = (gather, calls)
            multihost_utils.process_allgather = counted

    def stop(self):
        if self.enabled:
            from jax.experimental import multihost_utils

            gather, calls = self._restore
            multihost_utils.process_allgather = gather
            self.counts.append(dict(calls))


class _DPEpochs:
    """What a ``_dp_fit_worker`` (or ``_jax_procs_fit_worker``) process
    measures in each epoch: its time and steps and, after the first epoch,
    its Python calls and collectives (with ``work``; ``collectives``, a
    ``TorchCollectiveCounter`` by default); in lockstep (``BENCH_GATE``)
    rank 0 holds the gate and the processes meet at ``barrier`` (torch's
    by default) around each epoch."""

    def __init__(self, rank, work, collectives=None, barrier=None):
        self.calls = CallCounter(enabled=work)
        self.collectives = collectives or TorchCollectiveCounter(work)
        self._barrier_of_processes = barrier or _torch_barrier
        self.lockstep = "BENCH_GATE" in os.environ
        self.gate = Gate.from_env() if rank == 0 else Gate()
        self.times, self.steps = [], []
        self._start = 0.0

    def begin(self, epoch):
        self.steps.append(0)
        if epoch:
            self.gate.wait()
            self._barrier()
            # The counters nest: the profiler's start and stop, Python
            # code, are not counted as the step's calls.
            self.collectives.start()
            self.calls.start()
        self._start = time.perf_counter()

    def end(self, epoch):
        self._barrier()
        self.times.append(time.perf_counter() - self._start)
        if epoch:
            self.calls.stop()
            self.collectives.stop()
            self.gate.report(self.times[-1] / self.steps[-1])

    def _barrier(self):
        if self.lockstep:
            self._barrier_of_processes()

    def callback(self, keras):
        """A Keras callback that calls ``begin``/``end`` and counts steps."""
        epochs = self

        class Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                epochs.begin(epoch)

            def on_train_batch_end(self, batch, logs=None):
                epochs.steps[-1] += 1

            def on_epoch_end(self, epoch, logs=None):
                epochs.end(epoch)

        return Timer()

    def result(self):
        """``_result``: seconds per step of each epoch after the first,
        calls per step and the collectives per step (``graph``)."""
        steps = self.steps[1:]
        graph = None
        if self.collectives.enabled:
            kinds = collections.Counter()
            for count in self.collectives.counts:
                kinds.update(count)
            measured = sum(steps)
            graph = {
                "kind": "eager",
                "collectives": round(sum(kinds.values()) / measured, 4),
                "by_kind": {
                    k: round(v / measured, 4) for k, v in sorted(kinds.items())
                },
                "eager_per_step": 0,
            }
        return _result(
            [t / n for t, n in zip(self.times[1:], steps)],
            calls_per_step=[c / n for c, n in zip(self.calls.counts, steps)],
            graph=graph,
        )


def stateless_call(opts, gate):
    """Eager ``stateless_call`` (no gradient tracing, no ``training``):
    seconds per call, or with ``opts["work"]`` Python calls per call."""
    import keras
    import numpy as np

    model = _mlp(keras)
    x = np.ones((8, 32), "float32")
    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in model.non_trainable_variables]
    model.stateless_call(tv, ntv, x)
    out = []
    counter = CallCounter(enabled=opts.get("work", False))
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
        return _result(
            [],
            calls_per_step=[c / opts["calls"] for c in counter.counts],
            graph=None,
        )
    return out


WORKLOADS = {
    "shuffle": shuffle,
    "fit_step": fit_step,
    "ddp_step": ddp_step,
    "dp_fit_step": dp_fit_step,
    "jax_procs_fit_step": jax_procs_fit_step,
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
            # of the training step as compiled, for compiled_step.
            os.environ["XLA_FLAGS"] = (
                f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump_dir}"
                " --xla_dump_hlo_as_text"
                " --xla_dump_hlo_module_re=.*train_step.*"
            ).strip()
            opts["hlo_dump_dir"] = dump_dir
        gate = Gate.from_env()
        result = WORKLOADS[name](opts, gate)
        gate.close()
    if not isinstance(result, dict):
        result = _result(result)
    print(json.dumps(result))
