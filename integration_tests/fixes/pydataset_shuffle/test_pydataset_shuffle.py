"""Proof of the pydataset-shuffle fix (keras-team/keras#20577, PyDataset path).

``fit(x=PyDataset, shuffle=True)`` permutes the order of the dataset's
batches every epoch. Stock Keras 3.15.1 draws that permutation from Python's
global ``random``: fitting advances the user's global RNG, any unrelated
``random`` call changes the batch order (so one ``set_random_seed`` does not
make a run reproducible), and ``fit(initial_epoch=k)`` cannot replay the
order of epoch ``k``. The fork draws it from a private generator seeded by
(Keras seed, absolute epoch), as for arrays.

The test records which batch indices ``fit`` asks the dataset for in each
epoch (``__getitem__`` calls between ``on_epoch_begin`` callbacks; the
peeks Keras makes to build the model come before ``on_train_begin`` and are
ignored). Orders are compared exactly: they are integer indices.
"""

import contextlib
import random

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("pydataset-shuffle")

NUM_BATCHES = 12  # a repeated order by chance: probability 1 / 12!
GLOBAL_BATCH = 8  # divisible by every topology's replica count (1, 2, 4, 8)
EPOCHS = 3


class RecordingDataset(keras.utils.PyDataset):
    """``NUM_BATCHES`` fixed batches; records each requested index."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(20577)
        n = NUM_BATCHES * GLOBAL_BATCH
        self.x = rng.normal(size=(n, 4)).astype("float32")
        self.y = rng.normal(size=(n, 1)).astype("float32")
        self.requests = [[]]

    @property
    def num_batches(self):
        return NUM_BATCHES

    def __getitem__(self, idx):
        self.requests[-1].append(int(idx))
        rows = slice(idx * GLOBAL_BATCH, (idx + 1) * GLOBAL_BATCH)
        return self.x[rows], self.y[rows]


class EpochMarks(keras.callbacks.Callback):
    """Starts a new record of requests at each epoch."""

    def __init__(self, dataset):
        super().__init__()
        self.dataset = dataset
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)
        self.dataset.requests.append([])


def _orders(topology, initial_epoch=0, rng_states=None):
    """Fits a small model; returns ``{epoch: batch indices in order}``.

    ``rng_states``, a list, receives Python's ``random`` state just before
    and just after ``fit`` (building the model may draw default seeds from
    it; that is not the shuffle)."""
    dataset = RecordingDataset()
    marks = EpochMarks(dataset)
    with topology.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        if rng_states is not None:
            rng_states.append(random.getstate())
        model.fit(
            dataset,
            epochs=EPOCHS,
            initial_epoch=initial_epoch,
            shuffle=True,
            verbose=0,
            callbacks=[marks],
        )
    if rng_states is not None:
        rng_states.append(random.getstate())
    return dict(zip(marks.epochs, dataset.requests[1:]))


# torch's multi-replica topologies (ddp-2, dp-2): torch has no multi-device
# Model.fit in one process.
_SINGLE_PROCESS = pytest.mark.topology(
    exclude=("multiworker-2", "ddp-2", "dp-2"),
    reason="single-process test (the test process is 1 device)",
)


# Master (3.16) orders batches with `random.Random(epoch)`: global state is
# untouched on stock there; what it lacks is the seed and the absolute epoch.
@pytest.mark.fix("pydataset-shuffle", guard_since="3.16.0.dev0")
@_SINGLE_PROCESS
def test_fit_reads_and_advances_no_global_rng(topology):
    """The user's Python RNG state is the same before and after ``fit``
    (stock: ``random.shuffle`` advances it every epoch)."""
    keras.utils.set_random_seed(1)
    states = []
    orders = _orders(topology, rng_states=states)
    assert states[0] == states[1]
    for epoch, order in orders.items():
        assert sorted(order) == list(range(NUM_BATCHES)), (epoch, order)
    # Each epoch has its own order.
    assert orders[0] != orders[1] != orders[2]


@_SINGLE_PROCESS
def test_one_seed_gives_one_order_whatever_else_draws(topology):
    """After ``set_random_seed``, unrelated draws from Python's ``random``
    (user code, augmentation...) do not change the batch order, and
    another seed gives another order (master, 3.16, ignores the seed).
    Exact comparison: the orders are indices; two independent orders of
    the 3 epochs' batches coincide with probability (1 / NUM_BATCHES!)**3.
    """
    keras.utils.set_random_seed(2)
    expected = _orders(topology)
    keras.utils.set_random_seed(2)
    random.random()
    random.shuffle(list(range(10)))
    assert _orders(topology) == expected
    keras.utils.set_random_seed(3)
    assert _orders(topology) != expected, "the seed does not decide the order"


@_SINGLE_PROCESS
def test_resumed_fit_replays_the_epoch_order(topology):
    """``fit(initial_epoch=2)`` (e.g. after ``BackupAndRestore``) sees the
    order epoch 2 had in the uninterrupted run."""
    keras.utils.set_random_seed(3)
    expected = _orders(topology)
    keras.utils.set_random_seed(3)
    resumed = _orders(topology, initial_epoch=2)
    assert resumed == {2: expected[2]}


class _Worker:
    """A ``torch/dp-2`` worker's scope: the distribution is set globally."""

    def scope(self):
        return contextlib.nullcontext()


def _dp_worker(rank, world_size):
    """In each ``torch/dp-2`` worker: the batch indices this process trains
    on, per epoch, for seed 3, seed 4, and seed 3 resumed at epoch 2."""
    keras.distribution.set_distribution(
        devices.torch_processes(rank, world_size)
    )
    runs = {}
    for name, seed, initial_epoch in (
        ("seed-3", 3, 0),
        ("seed-4", 4, 0),
        ("resumed", 3, 2),
    ):
        keras.utils.set_random_seed(seed)
        orders = _orders(_Worker(), initial_epoch=initial_epoch)
        runs[name] = [orders[e] for e in sorted(orders)]
    return runs


@pytest.mark.topology("dp-2")
def test_processes_share_one_order_by_seed_and_absolute_epoch(topology):
    """torch/dp-2 (master: ``Model.fit`` on torch under
    ``keras.distribution.DataParallel``, keras-team/keras#23316): each
    process trains on every other batch of the epoch's order
    (``data_shard_id``), so the processes must draw the same order: each
    batch is then trained on once per epoch. The seed must decide that
    order, and ``fit(initial_epoch=2)`` must replay epoch 2. Stock master
    orders by the epoch alone: the processes agree, but every seed gives
    one order and a resumed ``fit`` restarts at epoch 0's. Exact
    comparisons: the orders are indices; the two processes' shards of two
    independent orders coincide with probability 1 / NUM_BATCHES!."""
    per_process = workers.run_workers(
        f"{__name__}:_dp_worker", topology.num_replicas, timeout=240
    )
    for epoch in range(EPOCHS):
        seen = sorted(i for p in per_process for i in p["seed-3"][epoch])
        assert seen == list(range(NUM_BATCHES)), (
            f"epoch {epoch}: batches trained on across the processes: {seen}"
        )
    job = [[p[run][0] for p in per_process] for run in ("seed-3", "seed-4")]
    assert job[0] != job[1], "the seed does not decide the order"
    for rank, p in enumerate(per_process):
        assert p["resumed"] == p["seed-3"][2:], (
            f"process {rank}: fit(initial_epoch=2) did not replay epoch 2"
        )
