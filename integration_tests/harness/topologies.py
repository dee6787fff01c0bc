"""Topologies of the proof matrix: how a test process sees its devices.

A topology is named per backend (``jax/8``, ``tensorflow/mirrored-2``...).
The runner (``keras_fork.proof``) puts ``env_for(...)`` into the
environment of a fresh process *before* the backend starts; inside that
process ``devices.current()`` builds the devices and returns a ``Topology``
whose ``scope()`` is the distribution context tests train under.

On a machine with GPUs (``PROOF_ACCELERATOR=gpu``) the multi-device
topologies use the real GPUs instead of virtual CPU devices, one GPU a
replica (``gpus_needed``), with TF32 off (``GPU_ENV``).

This module imports no backend at import time, so the runner can use it.
"""

from __future__ import annotations

import os

# The Keras backends, in the order every table lists them.
BACKENDS = ("jax", "tensorflow", "torch")
# The variables that name a run's topology and accelerator (``env_for``).
TOPOLOGY_ENV = "PROOF_TOPOLOGY"
ACCELERATOR_ENV = "PROOF_ACCELERATOR"

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
        "TF_CONFIG on 127.0.0.1 (tests start them with harness.workers; "
        "the test process itself is 1 device)",
    ),
    ("jax", "procs-2"): (
        2,
        "2 worker processes, jax.distributed on 127.0.0.1 (gloo CPU "
        "collectives, or one GPU each), keras.distribution.DataParallel over "
        "both processes' devices, each process feeding its part of every "
        "global batch (tests start them with harness.workers; the test "
        "process itself is 1 device)",
    ),
    ("torch", "1"): (1, "one device"),
    ("torch", "ddp-2"): (
        2,
        "2 worker processes, torch.distributed rendezvous on 127.0.0.1 "
        "(gloo on CPU, NCCL with one GPU each; tests start them with "
        "harness.workers)",
    ),
    ("torch", "dp-2"): (
        2,
        "2 worker processes, keras.distribution.initialize on 127.0.0.1 "
        "(torch.distributed: gloo on CPU, NCCL with one GPU each) and "
        "Model.fit under keras.distribution.DataParallel over both; master "
        "only (keras-team/keras#23316); tests start them with "
        "harness.workers",
    ),
}
# Topologies whose replicas are worker processes: the test process itself
# has one device and starts the workers (``integration_tests.harness.workers``).
MULTI_PROCESS = {
    ("jax", "procs-2"),
    ("tensorflow", "multiworker-2"),
    ("torch", "ddp-2"),
    ("torch", "dp-2"),
}
# The upstream-style unit tests of the patches are not a topology but a kind
# of test (``keras_fork.proof.cells.UNIT``), run on topology ``1``.


# With ``--accelerator gpu`` every replica is a GPU: a process-per-replica
# topology gives each worker one (``workers.run_workers``), mirrored-N
# mirrors over the first N, and jax/8 takes 8 GPUs, or the first 4 or 2
# where the machine has fewer (``jax_gpus``): a divisor of 8, so that every
# batch its tests split over 8 devices splits over them too. A cell whose
# topology needs more GPUs than the machine has is n/a
# (``keras_fork.proof.cells.short_of_gpus``).
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


def from_env() -> tuple[str, str]:
    """This process's ``(backend, topology)``: ``KERAS_BACKEND`` (default
    ``tensorflow``) and ``PROOF_TOPOLOGY`` (default ``1``), as ``env_for``
    set them."""
    return (
        os.environ.get("KERAS_BACKEND", "tensorflow"),
        os.environ.get(TOPOLOGY_ENV, "1"),
    )


def has_strategy(backend: str, topology: str) -> bool:
    """Whether the test process of a topology trains under a
    ``tf.distribute`` strategy: ``tensorflow/mirrored-N`` (a
    ``multiworker-2`` test process has none; its workers do)."""
    return backend == "tensorflow" and topology.startswith("mirrored-")


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


# One-GPU mode (``PROOF_ACCELERATOR=gpu-shared``): the workers of a torch
# process-per-replica topology all run on the one GPU this process sees,
# joined over gloo, since NCCL refuses two ranks on one GPU. It runs the
# CUDA code paths of the fixes (CUDA tensors in the collectives, CUDA
# generators), not N devices: a result there says nothing about
# communication between GPUs.
SHARED_GPU = "gpu-shared"
SHARED_GPU_TOPOLOGIES = {("torch", "ddp-2"), ("torch", "dp-2")}
ACCELERATORS = ("cpu", "gpu", SHARED_GPU)


def on_gpu() -> bool:
    """Whether this process runs a topology on GPUs
    (``PROOF_ACCELERATOR=gpu`` or ``gpu-shared``, set by ``env_for``)."""
    return os.environ.get(ACCELERATOR_ENV, "cpu") in ("gpu", SHARED_GPU)


def shared_gpu() -> bool:
    """Whether this process runs in one-GPU mode (``SHARED_GPU``): every
    worker on the same GPU, collectives over gloo."""
    return os.environ.get(ACCELERATOR_ENV, "cpu") == SHARED_GPU


def jax_gpus(visible: list[str]) -> list[str]:
    """The GPUs ``jax/8`` runs on: the first 8, 4 or 2 of ``visible``,
    the most there are (a divisor of 8); none below 2."""
    for n in JAX_8_GPUS:
        if len(visible) >= n:
            return visible[:n]
    return []


def env_for(
    backend: str, topology: str, accelerator: str, gpus=()
) -> dict[str, str]:
    """Environment a cell's process needs before its backend starts.

    Args:
        backend: ``jax``, ``tensorflow`` or ``torch``.
        topology: a topology name of that backend (see ``TOPOLOGIES``).
        accelerator: ``cpu``, ``gpu`` or ``gpu-shared`` (one-GPU mode,
            ``SHARED_GPU``: the first visible GPU for every worker).
        gpus: the GPUs this process may use, as ``CUDA_VISIBLE_DEVICES``
            names them (``run.visible_gpus``); read on GPUs only.

    Raises:
        KeyError: unknown (backend, topology).
        ValueError: ``gpu-shared`` for a topology not in
            ``SHARED_GPU_TOPOLOGIES``.
    """
    replicas, _ = TOPOLOGIES[(backend, topology)]
    env = {
        "KERAS_BACKEND": backend,
        TOPOLOGY_ENV: topology,
        ACCELERATOR_ENV: accelerator,
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    if accelerator == SHARED_GPU:
        if (backend, topology) not in SHARED_GPU_TOPOLOGIES:
            raise ValueError(
                f"one-GPU mode runs {sorted(SHARED_GPU_TOPOLOGIES)}, not "
                f"{backend}/{topology}"
            )
        env.update(GPU_ENV)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(list(gpus)[:1])
    if accelerator == "gpu":
        env.update(GPU_ENV)
        if (backend, topology) == ("jax", "8"):
            chosen = jax_gpus(list(gpus))
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
