"""What a workload counts with ``"work": true``: Python calls, the compiled
step and the collectives per step.

Counts do not depend on the machine's load, so a difference of a few calls
per step is resolved where a timing is not.
"""

import collections
import cProfile
import glob
import hashlib
import os
import pstats
import re


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
    step, by wrapping the public entry points:
    ``tf.distribute.ReplicaContext.all_reduce`` (gradient aggregation),
    ``tf.distribute.Strategy.reduce`` and
    ``tf.distribute.StrategyExtended.reduce_to`` / ``batch_reduce_to``
    (reads of on-read variables such as metric state, on-write updates,
    per-replica outputs), one count per outermost call
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
