"""Topologies of the proof matrix: how a test process sees its devices.

A topology is named per backend (``jax/8``, ``tensorflow/mirrored-2``...).
The runner (``keras_fork.prove``) puts ``env_for(...)`` into the environment
of a fresh process *before* the backend starts; inside that process
``current()`` builds the devices and returns a ``Topology`` whose ``scope()``
is the distribution context tests train under.

On a machine with GPUs (``PROOF_ACCELERATOR=gpu``) the multi-device
topologies use the real GPUs instead of virtual CPU devices, one GPU a
replica (``gpus_needed``), with TF32 off (``GPU_ENV``).

This module imports no backend at import time, so the runner can use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

# (backend, topology) -> (replicas on CPU, description)
TOPOLOGIES = {
    ("jax", "1"): (1, "one device"),
    ("jax", "8"): (
        8,
        "8 devices (virtual CPU devices via --xla_force_host_platform_"
        "device_count, or 8, 4 or 2 GPUs), keras.distribution.DataParallel",
    ),
    ("tensorflow", "1"): (1, "one device, default strategy"),
    ("tensorflow", "mirrored-2"): (
        2,
        "tf.distribute.MirroredStrategy over 2 logical CPUs (or 2 GPUs)",
    ),
    ("tensorflow", "mirrored-4"): (
        4,
        "tf.distribute.MirroredStrategy over 4 logical CPUs (or 4 GPUs)",
    ),
    ("tensorflow", "multiworker-2"): (
        2,
        "2 worker processes, tf.distribute.MultiWorkerMirroredStrategy with "
        "TF_CONFIG on 127.0.0.1 (tests start them with "
        "integration_tests.multiprocess; the test process itself is 1 device)",
    ),
    ("jax", "procs-2"): (
        2,
        "2 worker processes, jax.distributed on 127.0.0.1 (gloo CPU "
        "collectives, or one GPU each), keras.distribution.DataParallel over "
        "both processes' devices, each process feeding its part of every "
        "global batch (tests start them with integration_tests.multiprocess; "
        "the test process itself is 1 device)",
    ),
    ("torch", "1"): (1, "one device"),
    ("torch", "ddp-2"): (
        2,
        "2 worker processes, torch.distributed rendezvous on 127.0.0.1 "
        "(gloo on CPU, NCCL with one GPU each; tests start them with "
        "integration_tests.multiprocess)",
    ),
}
# Topologies whose replicas are worker processes: the test process itself
# has one device and starts the workers (``integration_tests.multiprocess``).
MULTI_PROCESS = {
    ("jax", "procs-2"),
    ("tensorflow", "multiworker-2"),
    ("torch", "ddp-2"),
}
# The upstream-style unit tests a fix's patches add, run with Keras's own
# test files on one device: stock runs only the added tests (they must fail),
# fork runs every test file the patches touch (all must pass).
UNIT = "unit"
for _backend in ("jax", "tensorflow", "torch"):
    TOPOLOGIES[(_backend, UNIT)] = (1, "upstream-style unit tests, 1 device")


# With ``--accelerator gpu`` every replica is a GPU: a process-per-replica
# topology gives each worker one (``multiprocess.run_workers``), mirrored-N
# mirrors over the first N, and jax/8 takes 8 GPUs, or the first 4 or 2
# where the machine has fewer (``jax_gpus``): a divisor of 8, so that every
# batch its tests split over 8 devices splits over them too. A cell whose
# topology needs more GPUs than the machine has is n/a
# (``keras_fork.prove.short_of_gpus``).
JAX_8_GPUS = (8, 4, 2)

# The environment of every process on GPUs, for two reasons.
# Arithmetic: the proof tests compare N replicas with one device at float32
# reassociation tolerances (about 1e-5 relative: a few ulps per step, each
# test says why). GPUs would run float32 matmuls and convolutions in TF32
# by default (TensorFlow, XLA, cuDNN under torch: a 10-bit mantissa, about
# 1e-3 relative per product), which no such tolerance covers. With TF32
# off (NVIDIA_TF32_OVERRIDE=0 for cuBLAS and cuDNN, and JAX's "highest"
# matmul precision) every topology keeps the tolerances its tests declare
# for CPU. Memory: GPUs are shared by processes (a test process and its
# workers; the stock and fork workers of a benchmark), so each allocates
# on demand instead of JAX's 75% and TensorFlow's whole-GPU preallocation.
# Sources: https://www.tensorflow.org/api_docs/python/tf/config/experimental/
# enable_tensor_float_32_execution (TF32 is on by default),
# https://docs.jax.dev/en/latest/gpu_memory_allocation.html,
# https://www.tensorflow.org/guide/gpu#limiting_gpu_memory_growth.
GPU_ENV = {
    "NVIDIA_TF32_OVERRIDE": "0",
    "JAX_DEFAULT_MATMUL_PRECISION": "highest",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
}


def known(backend: str, topology: str) -> bool:
    return (backend, topology) in TOPOLOGIES


def gpus_needed(backend: str, topology: str) -> int:
    """GPUs a topology needs with ``--accelerator gpu``: one per replica
    (``jax/8`` needs 2 and takes up to 8, ``jax_gpus``).

    Raises:
        KeyError: unknown (backend, topology).
    """
    replicas, _ = TOPOLOGIES[(backend, topology)]
    if (backend, topology) == ("jax", "8"):
        return min(JAX_8_GPUS)
    return replicas


def gpu_shortfall(backend: str, topology: str, gpus: int) -> str | None:
    """Why a topology cannot run on a machine with ``gpus`` GPUs
    (``"needs N GPUs; this machine has M"``), or ``None`` when it can
    (``gpus_needed``).

    Raises:
        KeyError: unknown (backend, topology).
    """
    need = gpus_needed(backend, topology)
    if need <= gpus:
        return None
    return f"needs {need} GPUs; this machine has {gpus}"


def on_gpu() -> bool:
    """Whether this process runs a topology on GPUs
    (``PROOF_ACCELERATOR=gpu``, set by ``env_for``)."""
    return os.environ.get("PROOF_ACCELERATOR", "cpu") == "gpu"


def jax_gpus(visible: list[str]) -> list[str]:
    """The GPUs ``jax/8`` runs on: the first 8, 4 or 2 of ``visible``,
    the most there are (a divisor of 8); none below 2."""
    for n in JAX_8_GPUS:
        if len(visible) >= n:
            return visible[:n]
    return []


def visible_gpus() -> list[str]:
    """The GPUs this process may use, named as ``CUDA_VISIBLE_DEVICES``
    names them: that variable's entries where it is set (set but empty:
    none), else the indices of the GPUs ``nvidia-smi -L`` lists (none
    without ``nvidia-smi``)."""
    import shutil
    import subprocess

    if "CUDA_VISIBLE_DEVICES" in os.environ:
        names = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        return [n.strip() for n in names if n.strip()]
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    out = subprocess.run(
        [exe, "-L"], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        return []
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")]
    return [str(i) for i in range(len(lines))]


def env_for(backend: str, topology: str, accelerator: str) -> dict[str, str]:
    """Environment a cell's process needs before its backend starts.

    Args:
        backend: ``jax``, ``tensorflow`` or ``torch``.
        topology: a topology name of that backend (see ``TOPOLOGIES``).
        accelerator: ``cpu`` or ``gpu``.

    Raises:
        KeyError: unknown (backend, topology).
    """
    replicas, _ = TOPOLOGIES[(backend, topology)]
    env = {
        "KERAS_BACKEND": backend,
        "PROOF_TOPOLOGY": topology,
        "PROOF_ACCELERATOR": accelerator,
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    if accelerator == "gpu":
        env.update(GPU_ENV)
        if (backend, topology) == ("jax", "8"):
            chosen = jax_gpus(visible_gpus())
            if chosen:  # else the cell is n/a (needs 2)
                env["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    if accelerator == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        if backend == "jax":
            env["JAX_PLATFORMS"] = "cpu"
            if replicas > 1 and (backend, topology) not in MULTI_PROCESS:
                env["XLA_FLAGS"] = (
                    f"--xla_force_host_platform_device_count={replicas}"
                )
    return env


@dataclasses.dataclass
class Topology:
    """The devices of this process and how to train on them.

    Attributes:
        backend: the Keras backend.
        name: the topology name, e.g. ``"mirrored-2"``.
        num_replicas: number of data-parallel replicas (devices).
        strategy: the ``tf.distribute`` strategy (TensorFlow), else None.
    """

    backend: str
    name: str
    num_replicas: int
    strategy: object = None

    @property
    def multi_process(self) -> bool:
        """Whether the replicas are worker processes (``MULTI_PROCESS``):
        the test process itself has one device and starts the workers."""
        return (self.backend, self.name) in MULTI_PROCESS

    def scope(self):
        """Context under which a test creates, compiles and fits models.

        Raises:
            RuntimeError: a multi-process topology: the test process has
                one device, so a model trained there would silently be a
                1-device run; train in the workers instead.
        """
        if self.multi_process:
            raise RuntimeError(
                f"{self.backend}/{self.name}: the test process has one "
                "device; train in workers (multiprocess.run_workers)"
            )
        if self.strategy is not None:
            return self.strategy.scope()
        if self.backend == "jax" and self.num_replicas > 1:
            return _jax_data_parallel()
        return contextlib.nullcontext()


@contextlib.contextmanager
def _jax_data_parallel():
    import jax
    from keras import distribution

    previous = distribution.distribution()
    distribution.set_distribution(
        distribution.DataParallel(devices=jax.devices())
    )
    try:
        yield
    finally:
        distribution.set_distribution(previous)


def multi_worker_strategy(rank: int):
    """In a ``multiworker-2`` worker: TF_CONFIG for ``rank``, the strategy.

    Call first thing in a worker started by
    ``multiprocess.run_workers`` (before any TensorFlow op). Collectives
    run over gRPC on 127.0.0.1, on CPU (or the worker's GPU).

    Returns:
        A ``tf.distribute.MultiWorkerMirroredStrategy`` over all workers.
    """
    from integration_tests import multiprocess

    os.environ["TF_CONFIG"] = multiprocess.tf_config(rank)
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def jax_processes(rank: int, world_size: int):
    """In a ``jax/procs-2`` worker: joins the job, returns the distribution.

    Call first thing in a worker started by ``multiprocess.run_workers``
    (before any JAX computation). ``keras.distribution.initialize`` starts
    ``jax.distributed`` with the coordinator at ``MASTER_ADDR:MASTER_PORT``
    (127.0.0.1) and agrees on one Keras seed across the processes (it sums
    a seed drawn by each). On CPU, cross-process collectives use gloo
    (https://docs.jax.dev/en/latest/multi_process.html); on GPU, each worker
    sees the one GPU ``run_workers`` gives it.

    Returns:
        ``keras.distribution.DataParallel`` over every process's devices,
        with ``auto_shard_dataset=False``: in Keras 3.15.1 a multi-process
        JAX job is fed per-process NumPy data, each process its part of
        every global batch (see ``local_part``).
    """
    import jax

    if not on_gpu():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras

    keras.distribution.initialize(
        job_addresses=(
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        ),
        num_processes=world_size,
        process_id=rank,
    )
    return keras.distribution.DataParallel(
        devices=jax.devices(), auto_shard_dataset=False
    )


def local_part(array, rank: int, world_size: int, global_batch: int):
    """Rows of ``array`` that process ``rank`` feeds in a multi-process job.

    Global batch ``b`` is rows ``[b * global_batch, (b + 1) * global_batch)``
    of ``array``; process ``rank`` feeds the ``rank``-th of its
    ``world_size`` equal parts, so that the processes' local batches, in
    process order, make up the global batch one device would see (JAX
    places them so: ``jax.make_array_from_process_local_data``).

    Args:
        array: NumPy array, ``(num_samples, ...)``; ``num_samples`` a
            multiple of ``global_batch``, itself a multiple of
            ``world_size``.

    Returns:
        NumPy array, ``(num_samples // world_size, ...)``.

    Raises:
        ValueError: the sizes do not divide.
    """
    import numpy as np

    if len(array) % global_batch or global_batch % world_size:
        raise ValueError(
            f"{len(array)} samples in global batches of {global_batch} do "
            f"not split evenly over {world_size} processes"
        )
    local = global_batch // world_size
    return np.concatenate(
        [
            array[start + rank * local : start + (rank + 1) * local]
            for start in range(0, len(array), global_batch)
        ]
    )


def process_batches(arrays, global_batch: int, process=None):
    """The data and batch size one process feeds to ``fit``.

    Args:
        arrays: NumPy arrays of the whole data, ``(num_samples, ...)``.
        global_batch: the global batch size.
        process: ``(rank, world_size)`` in a multi-process job, where each
            process feeds its part of every global batch (``local_part``);
            ``None`` for one process feeding everything.

    Returns:
        ``(arrays, batch_size)``: the process's rows and its batch size,
        ``global_batch // world_size`` (``global_batch`` without
        ``process``).

    Raises:
        ValueError: the sizes do not divide (see ``local_part``).
    """
    if process is None:
        return tuple(arrays), global_batch
    rank, world_size = process
    parts = tuple(local_part(a, rank, world_size, global_batch) for a in arrays)
    return parts, global_batch // world_size


def torch_train(
    model, optimizer, x, y, batch_size, epochs, ddp=False, on_epoch_end=None
):
    """Trains ``model`` in a custom torch loop, as in Keras's guide to
    distributed training with PyTorch: per batch, the mean squared error
    with the layers in training mode, ``backward()``, then the Keras
    ``optimizer`` applies the gradients to the trainable variables.

    Args:
        model: a Keras model (a ``torch.nn.Module`` on the torch backend).
        optimizer: a Keras optimizer, built here for the trainable
            variables.
        x, y: NumPy arrays, ``(samples, ...)`` and ``(samples, 1)``: this
            process's rows (see ``process_batches``), fed unshuffled.
        batch_size: rows per step (this process's part of a global batch).
        epochs: passes over ``x``.
        ddp: wrap the model in ``torch.nn.parallel.DistributedDataParallel``
            (needs a process group, e.g. ``multiprocess.torch_process_group``),
            which averages the gradients over the processes in ``backward``.
        on_epoch_end: called with the epoch index after each epoch (the
            benchmark times epochs with it); ``None`` for nothing.
    """
    import torch

    variables = model.trainable_variables
    optimizer.build(variables)
    # Where Keras put the model: the CPU, or this process's GPU.
    device = variables[0].value.device
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    for epoch in range(epochs):
        for start in range(0, len(x), batch_size):
            xb = torch.as_tensor(x[start : start + batch_size], device=device)
            yb = torch.as_tensor(y[start : start + batch_size], device=device)
            loss = torch.mean((net(xb, training=True) - yb) ** 2)
            loss.backward()
            optimizer.apply([v.value.grad for v in variables], variables)
            for v in variables:
                v.value.grad = None
        if on_epoch_end is not None:
            on_epoch_end(epoch)


_CURRENT = None


def current() -> Topology:
    """Sets up (once) and returns the topology named by the environment.

    Reads ``KERAS_BACKEND``, ``PROOF_TOPOLOGY`` (default ``1``) and
    ``PROOF_ACCELERATOR`` (default ``cpu``). TensorFlow logical devices are
    configured here, so call it before the first TensorFlow op.

    Raises:
        RuntimeError: the process does not have the devices the topology
            needs (e.g. XLA_FLAGS was set too late).
    """
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    name = os.environ.get("PROOF_TOPOLOGY", "1")
    gpu = on_gpu()
    replicas, _ = TOPOLOGIES[(backend, name)]
    strategy = None
    if (backend, name) in MULTI_PROCESS:
        pass  # the workers set up their own devices
    elif backend == "jax":
        import jax

        devices = jax.devices()
        if replicas > 1 and not gpu and len(devices) != replicas:
            raise RuntimeError(
                f"jax/{name} needs {replicas} devices, found {len(devices)}: "
                "XLA_FLAGS must be set before jax starts"
            )
        replicas = len(devices) if replicas > 1 else 1
    elif backend == "tensorflow" and name.startswith("mirrored-"):
        import tensorflow as tf

        if gpu:
            gpus = tf.config.list_logical_devices("GPU")[:replicas]
            if len(gpus) < replicas:
                raise RuntimeError(f"{name} needs {replicas} GPUs")
            devices = [d.name for d in gpus]
        else:
            (cpu,) = tf.config.list_physical_devices("CPU")
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
            )
            devices = [f"/cpu:{i}" for i in range(replicas)]
        strategy = tf.distribute.MirroredStrategy(devices)
        replicas = strategy.num_replicas_in_sync
    _CURRENT = Topology(backend, name, replicas, strategy)
    return _CURRENT
