"""Proof of the BatchNormalization statistics fix of torch ``fit`` under DDP.

On Keras master, ``Model.fit`` on torch trains under
``DistributedDataParallel`` when ``torch.distributed`` is initialized,
alone (``torch/ddp-2``) or under ``keras.distribution.DataParallel``
(``torch/dp-2``, keras-team/keras#23316). ``BatchNormalization``
(``synchronized=False``, the default) normalizes each process's shard of
the global batch with that shard's statistics and updates its moving mean
and variance from them. Keras variables are module parameters, not
buffers, so DDP does not broadcast them: on stock every process ends
``fit`` with the statistics of its own shards, and the model that is saved
depends on the process that saves it (keras-team/keras#20695 for
``tf.distribute``).

The fork averages the moving statistics over the processes at the end of
each epoch of ``fit``, before validation and the epoch's callbacks. Moving
averages are linear, so that is the moving average of the mean over
processes of their batch statistics, as bn-replica-stats' expected values
(``_expected_statistics``) compute it.
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers
from ..bn_replica_stats import test_bn_replica_stats as bn_stats

pytestmark = pytest.mark.fix("torch-bn-stats")


def _process_fit(scope, rank):
    """``fit`` on this process's share of each global batch (rank ``rank``
    of bn-replica-stats' ``_replica_rows``), ``EPOCHS`` epochs of ``STEPS``
    steps; returns the moving mean and variance."""
    x = np.concatenate(
        [bn_stats._replica_rows(rank, s) for s in range(bn_stats.STEPS)]
    )
    x = x.astype("float32")
    with scope:
        model = bn_stats._model()
        model.fit(
            x,
            np.zeros((len(x), 1), "float32"),
            batch_size=bn_stats.PER_REPLICA,
            epochs=bn_stats.EPOCHS,
            shuffle=False,
            verbose=0,
        )
    bn = model.layers[0]
    return {
        "moving_mean": keras.ops.convert_to_numpy(bn.moving_mean).tolist(),
        "moving_variance": keras.ops.convert_to_numpy(
            bn.moving_variance
        ).tolist(),
    }


def _dp_fit(rank, world_size):
    """In a ``torch/dp-2`` worker: ``fit`` under ``DataParallel``, each
    process feeding its share (``auto_shard_dataset=False``)."""
    distribution = devices.torch_processes(rank, world_size)
    distribution.auto_shard_dataset = False
    return _process_fit(distribution.scope(), rank)


def _ddp_fit(rank, world_size):
    """In a ``torch/ddp-2`` (or one-process) worker: ``fit`` in a gloo
    process group without a ``keras.distribution``."""
    with workers.torch_process_group(rank, world_size):
        return _process_fit(contextlib.nullcontext(), rank)


def _assert_statistics(target, world_size):
    """Every process ends with the moving average of the mean over the
    processes of their batch statistics (tolerance: bn-replica-stats'
    ``STATS_RTOL``, float32 moments; stock is off by O(1), each process
    keeping its own shards' statistics)."""
    runs = workers.run_workers(
        f"{__name__}:{target}", world_size=world_size, timeout=300
    )
    expected = dict(
        zip(
            ("moving_mean", "moving_variance"),
            bn_stats._expected_statistics(world_size),
        )
    )
    for rank, run in enumerate(runs):
        for name, value in expected.items():
            np.testing.assert_allclose(
                run[name],
                value,
                rtol=bn_stats.STATS_RTOL,
                err_msg=f"process {rank}: {name}",
            )


@pytest.mark.topology("dp-2")
def test_dp_processes_average_batch_normalization_statistics():
    """torch/dp-2: ``fit`` under ``keras.distribution.DataParallel``."""
    _assert_statistics("_dp_fit", 2)


@pytest.mark.topology("ddp-2")
def test_ddp_processes_average_batch_normalization_statistics():
    """torch/ddp-2: ``fit`` in a gloo process group without a
    ``keras.distribution``."""
    _assert_statistics("_ddp_fit", 2)


@pytest.mark.fix("torch-bn-stats", role="guard")
@pytest.mark.topology("1")
def test_one_process_group_keeps_its_statistics():
    """torch/1, in a process group of one (``fit`` wraps the model in
    DDP): the statistics are the moving averages of its own batches."""
    _assert_statistics("_ddp_fit", 1)
