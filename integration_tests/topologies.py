"""Topologies of the proof matrix: how a test process sees its devices.

A topology is named per backend (``jax/8``, ``tensorflow/mirrored-2``...).
The runner (``keras_fork.prove``) puts ``env_for(...)`` into the environment
of a fresh process *before* the backend starts; inside that process
``current()`` builds the devices and returns a ``Topology`` whose ``scope()``
is the distribution context tests train under.

On a machine with GPUs (``PROOF_ACCELERATOR=gpu``) the multi-device
topologies use the real GPUs instead of virtual CPU devices.

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
        "device_count, or the local GPUs), keras.distribution.DataParallel",
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
    ("torch", "1"): (1, "one device"),
    ("torch", "ddp-2"): (
        2,
        "2 worker processes, torch.distributed gloo rendezvous on 127.0.0.1 "
        "(tests start them with integration_tests.multiprocess)",
    ),
}
# The upstream-style unit tests a fix's patches add, run with Keras's own
# test files on one device: stock runs only the added tests (they must fail),
# fork runs every test file the patches touch (all must pass).
UNIT = "unit"
for _backend in ("jax", "tensorflow", "torch"):
    TOPOLOGIES[(_backend, UNIT)] = (1, "upstream-style unit tests, 1 device")


def known(backend: str, topology: str) -> bool:
    return (backend, topology) in TOPOLOGIES


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
    if accelerator == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        if backend == "jax":
            env["JAX_PLATFORMS"] = "cpu"
            if replicas > 1:
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

    def scope(self):
        """Context under which a test creates, compiles and fits models."""
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
    gpu = os.environ.get("PROOF_ACCELERATOR", "cpu") == "gpu"
    replicas, _ = TOPOLOGIES[(backend, name)]
    strategy = None
    if backend == "jax":
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
