"""In-process device set-up of the proof topologies.

``current()`` builds this process's devices from the environment that
``topologies.env_for`` gave it (before the backend starts) and returns a
``Topology`` whose ``scope()`` is the distribution context tests train
under. ``multi_worker_strategy`` and ``jax_processes`` set up a worker
process started by ``workers.run_workers``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from . import markers
from . import topologies
from . import workers
from .topologies import MULTI_PROCESS
from .topologies import TOPOLOGIES
from .topologies import on_gpu
from .topologies import shared_gpu


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

    @property
    def one_device(self) -> bool:
        """Whether ``scope()`` trains on this process's one device with no
        strategy and no distribution: what the tests call the one-device
        reference."""
        return (
            not self.multi_process
            and self.strategy is None
            and self.num_replicas == 1
        )

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
                "device; train in workers (workers.run_workers)"
            )
        if self.strategy is not None:
            return self.strategy.scope()
        if self.backend == "jax" and self.num_replicas > 1:
            return _jax_data_parallel()
        return contextlib.nullcontext()


ONE_DEVICE_REFERENCE = (
    f"{markers.NOT_APPLICABLE}: one device: training under the topology is "
    "the one-device reference itself, so comparing the two cannot fail"
)


def skip_comparison_on_one_device(topology: Topology) -> None:
    """Skips a test that compares training under ``topology.scope()`` with
    the one-device reference, where the topology is that one device.

    Both runs are then the same computation in the same process: the
    comparison passes on any keras, stock or fork, right or wrong, so it
    proves and guards nothing (a test that cannot fail is a defect: the
    developers' guide, hard rule 2). A fix whose tests on a one-device
    topology are all such comparisons says so in its cells
    (``n/a: @one-device-reference``, ``fixes/reasons.toml``).

    Raises:
        pytest.skip.Exception: ``topology.one_device``.
    """
    if topology.one_device:
        import pytest

        pytest.skip(ONE_DEVICE_REFERENCE)


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


def one_replica_strategy():
    """A ``tf.distribute.MirroredStrategy`` over this process's first device.

    The first GPU when the tests run on GPUs, else ``/cpu:0``: the device a
    run without a strategy places its ops on. It trains as one device (its
    cross-replica reductions are identities) while ``fit()`` takes the code
    paths of a strategy, e.g. the symbolic build that draws one batch first.
    """
    import tensorflow as tf

    device = "/cpu:0"
    if on_gpu():
        gpus = tf.config.list_logical_devices("GPU")
        device = gpus[0].name if gpus else device
    return tf.distribute.MirroredStrategy([device])


def multi_worker_strategy(rank: int):
    """In a ``multiworker-2`` worker: TF_CONFIG for ``rank``, the strategy.

    Call first thing in a worker started by
    ``workers.run_workers`` (before any TensorFlow op). Collectives
    run over gRPC on 127.0.0.1, on CPU (or the worker's GPU).

    Returns:
        A ``tf.distribute.MultiWorkerMirroredStrategy`` over all workers.
    """
    os.environ["TF_CONFIG"] = workers.tf_config(rank)
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def jax_processes(rank: int, world_size: int):
    """In a ``jax/procs-2`` worker: joins the job, returns the distribution.

    Call first thing in a worker started by ``workers.run_workers``
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


def torch_processes(rank: int, world_size: int):
    """In a ``torch/dp-2`` worker: joins the job, returns the distribution.

    Call first thing in a worker started by ``workers.run_workers``.
    ``keras.distribution.initialize`` starts ``torch.distributed`` with the
    rendezvous at ``MASTER_ADDR:MASTER_PORT`` (127.0.0.1): gloo on CPU,
    NCCL on the one GPU ``run_workers`` gives each worker. Only Keras
    master has it on torch (keras-team/keras#23316).

    In one-GPU mode (``topologies.shared_gpu``) the process group is
    made first, over gloo: ``initialize`` would pick NCCL for a CUDA
    device, which refuses two ranks on one GPU, and it keeps a group that
    exists.

    Returns:
        ``keras.distribution.DataParallel`` over every process's devices
        (auto-sharding: ``fit`` on a ``PyDataset`` trains each process on
        every ``world_size``-th batch of the epoch's order, by
        ``data_shard_id``).
    """
    import keras

    if shared_gpu():
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=rank, world_size=world_size)

    keras.distribution.initialize(
        job_addresses=(
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        ),
        num_processes=world_size,
        process_id=rank,
    )
    return keras.distribution.DataParallel()


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
    backend, name = topologies.from_env()
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
    elif topologies.has_strategy(backend, name):
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
