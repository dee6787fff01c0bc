"""Proof of the predict fix of torch ``DataParallel`` over processes.

On Keras master, ``keras.distribution.DataParallel`` on torch over several
processes (``torch/dp-2``, keras-team/keras#23316) auto-shards a
``PyDataset`` by ``data_shard_id``: process 0 iterates over batches 0, 2,
4, ... and process 1 over 1, 3, .... Stock ``predict()`` returns only the
rows of the process's own batches: 5 batches of 2 rows give 6 rows in
process 0 and 4 in process 1, where one process returns all 10 in order
(and a process without batches fails). A ``tf.data.Dataset`` is
rebatched into per-process batches and sharded the same way. The fork
gathers the outputs after the last batch and returns every row, in input
order, in every process.

Checked with an identity model (a ``Dense`` with a kernel of ones, no
bias), so each prediction is its input row and the comparison is exact,
with two outputs (a structure) and ``steps_per_execution`` 1 and 2 (an
execution then holds several batches of one process).

Guards: under a bare process group (``torch/ddp-2``, no distribution) each
process feeds its own data and predicts its own rows, which the fork
leaves alone; one process (``torch/1``) returns every row.
"""

import functools

import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("torch-dp-predict")
BATCH = 2


Rows = functools.partial(data.index_rows, batch_size=BATCH)


_predict = data.identity_predictions


# Batch counts: odd (3 and 2 batches), even (2 and 2), one (1 and 0).
CASES = [(n, k) for n in (5, 4, 1) for k in (1, 2)]


def _dp_predictions(rank, world_size):
    """In a ``torch/dp-2`` worker: ``predict`` on auto-sharded
    ``PyDataset``s; the group's 30 s timeout bounds each collective."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        distribution = devices.torch_processes(rank, world_size)
        with distribution.scope():
            return [_predict(Rows(n), k) for n, k in CASES]


@pytest.mark.topology("dp-2")
def test_dp_predict_returns_every_row_in_order():
    """torch/dp-2: every process gets the ``2 * n`` rows, in order.

    Stock: each process's own rows (``[0, 1, 4, 5, 8, 9]`` and ``[2, 3,
    6, 7]`` for 5 batches), and an error in the process without a batch.
    The workers need about 20 s on 2 CPU cores; 120 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_dp_predictions", world_size=2, timeout=120
    )
    for rank, run in enumerate(runs):
        for (n, k), rows in zip(CASES, run):
            expected = list(range(BATCH * n))
            assert rows == expected, (
                f"process {rank}, {n} batches, steps_per_execution={k}: {rows}"
            )


def _ddp_predictions(rank, world_size):
    """In a ``torch/ddp-2`` worker: no distribution, each process predicts
    its own 3 or 2 batches (rows from ``10 * rank``)."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        return _predict(Rows([3, 2][rank], first=10 * rank), 1)


@pytest.mark.fix("torch-dp-predict", role="guard")
@pytest.mark.topology("ddp-2")
def test_ddp_predict_returns_each_process_its_own_rows():
    """torch/ddp-2: nothing is auto-sharded, so nothing is gathered."""
    runs = workers.run_workers(
        f"{__name__}:_ddp_predictions", world_size=2, timeout=120
    )
    assert runs == [list(range(6)), list(range(10, 14))], runs


def _one_process_predictions(rank, world_size):
    with workers.torch_process_group(rank, world_size):
        distribution = devices.torch_processes(rank, world_size)
        with distribution.scope():
            dp = [_predict(Rows(n), k) for n, k in CASES]
        return dp, _predict(Rows(5), 1)


@pytest.mark.fix("torch-dp-predict", role="guard")
@pytest.mark.topology("1")
def test_one_process_predicts_every_row():
    """torch/1: ``DataParallel`` over one process, and no distribution."""
    (run,) = workers.run_workers(
        f"{__name__}:_one_process_predictions", world_size=1, timeout=180
    )
    dp, plain = run
    assert dp == [list(range(BATCH * n)) for n, _ in CASES], dp
    assert plain == list(range(10)), plain


def _dp_tf_data_predictions(rank, world_size):
    """In a ``torch/dp-2`` worker: a ``tf.data.Dataset`` of rows 0 to 9 in
    global batches of 4, which ``DataParallel`` rebatches into per-process
    batches of 2 and shards (the last global batch, 2 rows, goes whole to
    process 0)."""
    import tensorflow as tf

    with workers.torch_process_group(rank, world_size, timeout=30):
        distribution = devices.torch_processes(rank, world_size)
        rows = np.arange(10, dtype="float32")[:, None]
        dataset = tf.data.Dataset.from_tensor_slices(rows).batch(4)
        with distribution.scope():
            return [_predict(dataset, k) for k in (1, 2)]


@pytest.mark.topology("dp-2")
def test_dp_predict_tf_data_returns_every_row_in_order():
    """torch/dp-2: the same for a ``tf.data.Dataset``. Stock: ``[0, 1, 4,
    5, 8, 9]`` and ``[2, 3, 6, 7]``. TensorFlow's import makes the
    workers take about 45 s on 2 CPU cores; 150 s bounds the run. Where
    TensorFlow is not installed (a torch-only machine) there is no
    ``tf.data`` to predict on: skipped."""
    pytest.importorskip(
        "tensorflow", reason="not applicable: tf.data needs TensorFlow"
    )
    runs = workers.run_workers(
        f"{__name__}:_dp_tf_data_predictions", world_size=2, timeout=150
    )
    for rank, run in enumerate(runs):
        assert run == [list(range(10))] * 2, f"process {rank}: {run}"
