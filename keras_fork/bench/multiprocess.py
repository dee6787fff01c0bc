"""Step workloads over several processes on 127.0.0.1 (torch DDP and
``DataParallel``, JAX processes), each process feeding its part of every
global batch. ``run_processes`` starts them (``workers.run_workers``) and
combines their results.
"""

import collections
import json
import os
import time

from keras_fork.bench import counters
from keras_fork.bench import models
from keras_fork.bench import protocol


def ddp_step(opts, gate):
    """Mean step time (seconds) of each epoch after the first of a Keras
    model trained in a torch ``DistributedDataParallel`` loop
    (``data.torch_train``, the Keras guide's way to train on several
    devices with PyTorch: ``keras.Model.fit`` has no multi-device mode
    there) by ``opts["processes"]`` gloo processes on 127.0.0.1, each
    feeding its part of every global batch of ``opts["batch_size"]``. Per
    epoch, the slower process's time (the all-reduce in ``backward`` keeps
    them in step); the peak memory is the larger of the processes'. With
    ``opts["work"]``, the calls per step of the process that makes more. In
    lockstep, rank 0 holds the gate (``gate`` is not used here) and the
    processes meet at a barrier around each epoch, whose time is then the
    slower's."""
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
        f"keras_fork.bench.multiprocess:{target}",
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
    peak memory (``protocol.measurement``)."""
    import keras
    import torch

    from integration_tests.harness import data
    from integration_tests.harness import workers

    opts = json.loads(os.environ["BENCH_OPTS"])
    build, x, y = models.model_and_data(opts)
    (x, y), batch_size = data.process_batches(
        (x, y), opts["batch_size"], (rank, world_size)
    )
    times = []
    clock = [0.0]  # when the current epoch started
    counter = counters.CallCounter(enabled=opts.get("work", False))
    lockstep = "BENCH_GATE" in os.environ
    gate = protocol.Gate.from_env() if rank == 0 else protocol.Gate()

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
    with workers.torch_process_group(rank, world_size, protocol.GATE_TIMEOUT):
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
    return protocol.measurement(
        [t / steps for t in times[1:]],
        calls_per_step=[c / steps for c in counter.counts],
    )


def dp_fit_step(opts, gate):
    """Mean step time (seconds) of each epoch after the first of Keras ``fit()``
    under ``keras.distribution.DataParallel`` over ``opts["processes"]``
    torch processes (gloo on 127.0.0.1, one CPU device each;
    keras-team/keras#23316, on master only), each process feeding its part
    of every global batch of ``opts["batch_size"]``
    (``data.process_batches``; no auto-sharding). Per epoch, the slower
    process's time. With ``opts["work"]``, the calls per step of the process
    that makes more, and ``graph``: the process group's collectives per step
    over the epochs after the first (``counters.TorchCollectiveCounter``;
    the larger process's), as ``{"kind": "eager", "collectives": n,
    "by_kind": {...}}``. Options as ``fit_step`` (``model``, ``metrics``); with
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
    memory and, with ``work``, its counts (``protocol.measurement``)."""
    import keras

    from integration_tests.harness import data
    from integration_tests.harness import devices
    from integration_tests.harness import workers

    opts = json.loads(os.environ["BENCH_OPTS"])
    build, x, y = models.model_and_data(opts)
    y, metrics = models.step_metrics(keras, opts, y)
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
    with workers.torch_process_group(rank, world_size, protocol.GATE_TIMEOUT):
        distribution = devices.torch_processes(rank, world_size)
        distribution.auto_shard_dataset = False
        with distribution.scope():
            _fit(keras, build(keras), metrics, (x, y, batch_size), opts, epochs)
        epochs.gate.close()
    return epochs.result()


def _fit(keras, model, metrics, data, opts, epochs):
    """Compiles ``model`` (SGD, MSE, ``metrics``) and fits it on ``data``,
    ``(x, y, batch_size)``, for ``opts["epochs"]`` epochs after the first,
    each measured by ``epochs`` (a ``_DPEpochs``)."""
    x, y, batch_size = data
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
    peak memory and, with ``work``, its counts (``protocol.measurement``)."""
    from integration_tests.harness import data
    from integration_tests.harness import devices

    opts = json.loads(os.environ["BENCH_OPTS"])
    # Before any JAX computation.
    distribution = devices.jax_processes(rank, world_size)
    import keras
    from jax.experimental import multihost_utils

    build, x, y = models.model_and_data(opts)
    with distribution.scope():
        # The metrics' variables too: a JAX variable made outside the scope
        # lives on this process's device alone.
        y, metrics = models.step_metrics(keras, opts, y)
    (x, y), batch_size = data.process_batches(
        (x, y), opts["batch_size"], (rank, world_size)
    )
    if opts.get("input") == "tf.data-filter":
        x, y, batch_size = _filtered_batches(x, y, batch_size), None, None
    work = opts.get("work", False)
    epochs = _DPEpochs(
        rank,
        work,
        collectives=counters.JAXGatherCounter(work),
        barrier=lambda: multihost_utils.sync_global_devices("bench epoch"),
    )
    with distribution.scope():
        _fit(keras, build(keras), metrics, (x, y, batch_size), opts, epochs)
    epochs.gate.close()
    return epochs.result()


def _filtered_batches(x, y, batch_size):
    """``(x, y)`` in batches of ``batch_size`` rows, in order, from a
    ``tf.data.Dataset`` after ``filter()``: an input of unknown length
    (cardinality -2), read anew each epoch."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.filter(lambda *row: True).batch(batch_size)


class _DPEpochs:
    """What a ``_dp_fit_worker`` (or ``_jax_procs_fit_worker``) process
    measures in each epoch: its time and steps and, after the first epoch,
    its Python calls and collectives (with ``work``; ``collectives``, a
    ``counters.TorchCollectiveCounter`` by default); in lockstep
    (``BENCH_GATE``) rank 0 holds the gate and the processes meet at
    ``barrier`` (torch's by default) around each epoch."""

    def __init__(self, rank, work, collectives=None, barrier=None):
        self.calls = counters.CallCounter(enabled=work)
        self.collectives = collectives or counters.TorchCollectiveCounter(work)
        self._barrier_of_processes = barrier or _torch_barrier
        self.lockstep = "BENCH_GATE" in os.environ
        self.gate = protocol.Gate.from_env() if rank == 0 else protocol.Gate()
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
        """``protocol.measurement``: seconds per step of each epoch after
        the first, calls per step and the collectives per step
        (``graph``)."""
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
        return protocol.measurement(
            [t / n for t, n in zip(self.times[1:], steps)],
            calls_per_step=[c / n for c, n in zip(self.calls.counts, steps)],
            graph=graph,
        )
