"""Proof of the uneven-steps fix of torch ``fit`` under DDP.

On Keras master, ``Model.fit`` on torch trains under
``DistributedDataParallel`` when ``torch.distributed`` is initialized,
alone (``torch/ddp-2``) or under ``keras.distribution.DataParallel``
(``torch/dp-2``, keras-team/keras#23316), and every step all-reduces the
gradients over the processes. ``DataParallel`` auto-shards a ``PyDataset``
by ``data_shard_id``: 5 batches over 2 processes give process 0 three
steps and process 1 two. On stock, process 0 enters its third step's
all-reduce alone while process 1 reduces the epoch's metrics: gloo aborts
both (a collective size mismatch, SIGABRT) or, as the CPU runs of these
tests show, a worker fails at the process group's timeout ("Timed out
waiting 15000ms for send [or recv] operation to complete") and the other
with "Connection closed by peer"; NCCL would wait forever. The same
happens when each process feeds arrays of its own size.

The fork compares the processes' step counts before the first step and
raises a ``ValueError`` in every process naming them. The tests check that
symptom first (both workers finish, each refused before its first step),
the fork's message after it. An even split trains
as before (checked in the same workers), and so does one process (guard).
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("torch-uneven-steps")
BATCH = 8
# The workers' collectives wait at most this long for the other process.
# The fork's processes meet within about a second (they start together and
# refuse before the first step); stock's mismatched ones wait it out.
GROUP_TIMEOUT_S = 15


class Batches(keras.utils.PyDataset):
    """``num_batches`` batches of ``BATCH`` rows."""

    def __init__(self, num_batches):
        super().__init__()
        rng = np.random.default_rng(23316)
        self.x = rng.normal(size=(num_batches * BATCH, 4)).astype("float32")
        self.y = rng.normal(size=(num_batches * BATCH, 1)).astype("float32")

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        rows = slice(i * BATCH, (i + 1) * BATCH)
        return self.x[rows], self.y[rows]


def _fit(scope, x):
    """Two epochs of ``fit`` on ``x`` (a ``PyDataset`` or arrays in batches
    of ``BATCH``) under ``scope``; returns ``"trained"`` with the number of
    steps of the last epoch, or the ``ValueError`` it raised with the
    number of steps that had run before it (any other exception
    propagates: the worker exits with it)."""
    with scope:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        steps = []  # the last epoch's
        ran = []  # every epoch's

        def batch_end(batch, logs):
            steps.append(batch)
            ran.append(batch)

        callback = keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: steps.clear(),
            on_train_batch_end=batch_end,
        )
        kwargs = (
            {}
            if isinstance(x, keras.utils.PyDataset)
            else {
                "y": np.zeros((len(x), 1), "float32"),
                "batch_size": BATCH,
            }
        )
        try:
            model.fit(x, epochs=2, verbose=0, callbacks=[callback], **kwargs)
        except ValueError as e:
            return {"error": str(e), "steps_run": len(ran)}
    return {"trained": len(steps)}


def _refused(rank, uneven):
    """Asserts, in the worker, that the uneven ``fit`` was refused before
    its first step. Checked as soon as ``fit`` returns: on stock the
    process with fewer steps finishes while the other waits in a
    collective, and this worker's failure ends the run at once
    (``workers.run_workers``) instead of at the group's timeout."""
    assert uneven.get("steps_run") == 0, f"process {rank}: {uneven}"
    return uneven


def _dp_runs(rank, world_size):
    """In a ``torch/dp-2`` worker: ``DataParallel`` auto-shards a
    ``PyDataset`` of 5 batches (3 and 2 per process), then of 4 (2 and
    2). The process group is started first, with a 15 s timeout on its
    collectives, so that stock's mismatched ones fail then rather than at
    the test's timeout (``keras.distribution.initialize`` keeps a started
    group)."""
    with workers.torch_process_group(rank, world_size, timeout=GROUP_TIMEOUT_S):
        distribution = devices.torch_processes(rank, world_size)
        uneven = _refused(rank, _fit(distribution.scope(), Batches(5)))
        return {
            "uneven": uneven,
            "even": _fit(distribution.scope(), Batches(4)),
        }


def _rows(rank, batches):
    return np.ones((batches[rank] * BATCH, 4), "float32")


def _ddp_runs(rank, world_size):
    """In a ``torch/ddp-2`` worker: a process group without a
    ``keras.distribution``, each process feeding arrays of its own size,
    3 and 2 batches, then 2 and 2. Stock's mismatched collectives fail at
    the group's 15 s timeout."""
    with workers.torch_process_group(rank, world_size, timeout=GROUP_TIMEOUT_S):
        nothing = contextlib.nullcontext
        uneven = _refused(rank, _fit(nothing(), _rows(rank, [3, 2])))
        return {"uneven": uneven, "even": _fit(nothing(), _rows(rank, [2, 2]))}


def _assert_refused_then_trained(target):
    """Both processes finish: each refuses the uneven split with a
    ``ValueError`` before its first step, then trains the even split 2
    steps an epoch; after that, the fork's message names the counts ``[3,
    2]``.

    Stock (the symptom this test fails on there): the processes meet in
    mismatched collectives: a worker that finishes fails its own check
    (``_refused``), or one fails at the process group's 15 s timeout
    (gloo: "Timed out waiting 15000ms for send [or recv] operation to
    complete"), the other then with "Connection closed by peer", or gloo
    aborts (a collective size mismatch, SIGABRT); ``run_workers`` raises.
    The workers need about 15 s on 2 CPU cores; 90 s bounds the whole run
    with room for a slow machine."""
    runs = workers.run_workers(f"{__name__}:{target}", world_size=2, timeout=90)
    for rank, run in enumerate(runs):
        assert run["even"] == {"trained": 2}, f"process {rank}: {run}"
    for rank, run in enumerate(runs):
        assert "[3, 2] training steps per epoch" in run["uneven"]["error"], (
            f"process {rank}: {run['uneven']}"
        )


@pytest.mark.topology("dp-2")
def test_dp_uneven_auto_shard_is_refused():
    """torch/dp-2: a ``PyDataset`` auto-sharded by ``DataParallel``."""
    _assert_refused_then_trained("_dp_runs")


@pytest.mark.topology("ddp-2")
def test_ddp_uneven_arrays_are_refused():
    """torch/ddp-2: arrays of different sizes per process."""
    _assert_refused_then_trained("_ddp_runs")


def _one_process_runs(rank, world_size):
    with workers.torch_process_group(rank, world_size):
        return _fit(contextlib.nullcontext(), _rows(0, [3]))


@pytest.mark.fix("torch-uneven-steps", role="guard")
@pytest.mark.topology("1")
def test_one_process_group_trains_any_batch_count():
    """torch/1, in a process group of one (``fit`` wraps the model in
    DDP): 3 batches train, nothing to compare."""
    (run,) = workers.run_workers(
        f"{__name__}:_one_process_runs", world_size=1, timeout=180
    )
    assert run == {"trained": 3}
