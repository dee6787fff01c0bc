"""Proof of the predict fix of JAX ``DataParallel`` over processes.

Over 2 JAX processes (``jax/procs-2``), process ``p`` feeds the batches
``p``, ``p + 2``, ... of a ``PyDataset``: itself (``auto_shard_dataset=
False``, on both bases) or, on Keras master, by ``DataParallel``'s
auto-sharding (Keras 3.15.1 refuses to auto-shard a ``PyDataset`` over
processes). Each step's outputs are global arrays over the devices of
both processes. Stock ``predict()`` concatenates them with NumPy, which
cannot read a global array: it fails with ``RuntimeError: Fetching value
for jax.Array that spans non-addressable devices``, for any number of
batches. The fork gathers each output once per call and returns every
row, in input order, in every process; when the processes would run
different numbers of steps (5 batches: 3 and 2) it raises the same
``ValueError`` in every process before the first step, naming the counts
and the remedies, where stock runs a step in one process alone and then
fails.

Checked with an identity model (a ``Dense`` with a kernel of ones, no
bias), so each prediction is its input row and the comparison is exact,
with two outputs (a structure) and ``steps_per_execution`` 1 and 2.

Guard: one process (``jax/1``) returns every row, with and without
``DataParallel``; the fork adds no collective there.
"""

import functools

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("jax-dp-predict")
BATCH = 2
# How the processes get their batches: each feeds its own (both bases), or
# master's DataParallel auto-shards one PyDataset.
FEEDS = [
    "per-process",
    pytest.param(
        "auto-sharded",
        marks=pytest.mark.fix(
            "jax-dp-predict",
            absent_before={
                "jax": (
                    "3.16.0.dev0",
                    "Keras 3.15.1 refuses to auto-shard a PyDataset over "
                    "processes (the per-process case feeds the same batches)",
                )
            },
        ),
    ),
]


Rows = functools.partial(data.index_rows, batch_size=BATCH)


_predict = data.identity_predictions


# Even batch counts (2 and 2, 1 and 1), steps_per_execution 1 and 2.
CASES = [(n, k) for n in (4, 2) for k in (1, 2)]


def _auto_sharded(rank, world_size):
    """Joins the ``jax/procs-2`` job; ``DataParallel`` with auto-sharding
    (the harness's default distribution feeds per-process arrays)."""
    import jax

    devices.jax_processes(rank, world_size)
    return keras.distribution.DataParallel(
        devices=jax.devices(), auto_shard_dataset=True
    )


def _joined(rank, world_size, feed):
    """Joins the ``jax/procs-2`` job; returns the distribution and
    ``rows(n)``, what this process predicts on for ``n`` global batches
    of ``Rows``: its own batches, or the ``PyDataset`` to auto-shard."""
    if feed == "auto-sharded":
        return _auto_sharded(rank, world_size), Rows
    rows = functools.partial(
        data.process_index_rows, rank, world_size, batch_size=BATCH
    )
    return devices.jax_processes(rank, world_size), rows


def _dp_predictions(rank, world_size, feed="auto-sharded"):
    """In a ``jax/procs-2`` worker: ``predict`` on ``PyDataset``s of an
    even number of batches."""
    distribution, rows = _joined(rank, world_size, feed)
    with distribution.scope():
        return [_predict(rows(n), k) for n, k in CASES]


def _per_process_predictions(rank, world_size):
    return _dp_predictions(rank, world_size, "per-process")


@pytest.mark.topology("procs-2")
@pytest.mark.parametrize("feed", FEEDS)
def test_dp_predict_returns_every_row_in_order(feed):
    """jax/procs-2: every process gets the ``2 * n`` rows, in order.

    Stock: ``RuntimeError: Fetching value for jax.Array that spans
    non-addressable devices`` in every case. The workers need about 20 s
    on 2 CPU cores; 90 s bounds the run."""
    target = (
        "_per_process_predictions"
        if feed == "per-process"
        else "_dp_predictions"
    )
    runs = workers.run_workers(f"{__name__}:{target}", world_size=2, timeout=90)
    for rank, run in enumerate(runs):
        for (n, k), rows in zip(CASES, run):
            expected = list(range(BATCH * n))
            assert rows == expected, (
                f"process {rank}, {n} batches, steps_per_execution={k}: {rows}"
            )


def _dp_uneven_predictions(rank, world_size, feed="auto-sharded"):
    """In a ``jax/procs-2`` worker: 5 batches (3 and 2 per process), then
    the remedy ``steps=2`` (batches 0 to 3)."""
    distribution, rows = _joined(rank, world_size, feed)
    with distribution.scope():
        return _predict(rows(5), 1), _predict(rows(5), 1, steps=2)


def _per_process_uneven_predictions(rank, world_size):
    return _dp_uneven_predictions(rank, world_size, "per-process")


@pytest.mark.topology("procs-2")
@pytest.mark.parametrize("feed", FEEDS)
def test_dp_predict_refuses_uneven_step_counts(feed):
    """jax/procs-2: 5 batches give the processes 3 and 2 steps; the fork
    raises a ``ValueError`` in both before the first step, naming the
    counts and the remedy ``steps`` (and, auto-sharded, a batch count
    that is a multiple of the process count), and ``steps=2`` predicts 8
    rows in order.

    Stock: process 0 runs its third step alone, then both fail to fetch
    the global arrays (``RuntimeError``). 90 s bounds the run."""
    target = (
        "_per_process_uneven_predictions"
        if feed == "per-process"
        else "_dp_uneven_predictions"
    )
    runs = workers.run_workers(f"{__name__}:{target}", world_size=2, timeout=90)
    texts = ["process 0: 3", "process 1: 2", "steps"]
    if feed == "auto-sharded":
        texts.append("a multiple")
    for rank, (uneven, capped) in enumerate(runs):
        assert isinstance(uneven, str), f"process {rank}: {uneven}"
        assert uneven.startswith("ValueError"), f"process {rank}: {uneven}"
        for text in texts:
            assert text in uneven, f"process {rank}: {uneven}"
        assert capped == list(range(8)), f"process {rank}: {capped}"


@pytest.mark.fix("jax-dp-predict", role="guard")
@pytest.mark.topology("1")
def test_one_process_predicts_every_row():
    """jax/1: one process, with and without ``DataParallel``, any number
    of batches."""
    import jax

    distribution = keras.distribution.DataParallel(
        devices=jax.devices(), auto_shard_dataset=True
    )
    with distribution.scope():
        dp = [_predict(Rows(n), k) for n, k in CASES + [(5, 1)]]
    expected = [list(range(BATCH * n)) for n, _ in CASES + [(5, 1)]]
    assert dp == expected, dp
    assert _predict(Rows(5), 1) == list(range(10))


def _dp_tf_data_predictions(rank, world_size):
    """In a ``jax/procs-2`` worker: a ``tf.data.Dataset`` of rows 0 to 9 in
    global batches of 4, which ``DataParallel`` rebatches into batches of
    2 and shards: process 0 gets rows 0-1, 4-5 and 8-9, process 1 rows
    2-3 and 6-7 (3 and 2 steps, which only the outputs show: the rebatched
    dataset has no known length). With ``drop_remainder=True`` the
    processes get 2 steps each, rows 0 to 7."""
    import tensorflow as tf

    with _auto_sharded(rank, world_size).scope():
        rows = tf.data.Dataset.from_tensor_slices(
            np.arange(10, dtype="float32")[:, None]
        )
        return [
            _predict(rows.batch(4, drop_remainder=drop), k)
            for drop in (True, False)
            for k in (1, 2)
        ]


@pytest.mark.topology("procs-2")
def test_dp_predict_tf_data_returns_every_row_in_order():
    """jax/procs-2: the same for a ``tf.data.Dataset``: rows 0 to 7, in
    order, in both processes; with the remainder kept (3 and 2 steps), a
    ``ValueError`` in both after the last step, where the collective would
    fail. Stock: the ``RuntimeError`` in every case. TensorFlow's import
    makes the workers take about 45 s on 2 CPU cores; 150 s bounds the
    run. Where TensorFlow is not installed there is no ``tf.data`` to
    predict on: skipped."""
    pytest.importorskip(
        "tensorflow", reason="not applicable: tf.data needs TensorFlow"
    )
    runs = workers.run_workers(
        f"{__name__}:_dp_tf_data_predictions", world_size=2, timeout=150
    )
    for rank, (*even, uneven_1, uneven_2) in enumerate(runs):
        assert even == [list(range(8))] * 2, f"process {rank}: {even}"
        for uneven in (uneven_1, uneven_2):
            assert isinstance(uneven, str), f"process {rank}: {uneven}"
            assert uneven.startswith("ValueError"), f"process {rank}: {uneven}"
            assert "drop_remainder" in uneven, f"process {rank}: {uneven}"
