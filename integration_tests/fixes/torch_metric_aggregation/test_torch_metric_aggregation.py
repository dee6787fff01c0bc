"""Proof of the metric-aggregation fix of torch DDP and ``DataParallel``.

On Keras master, ``get_metrics_result()`` of the torch backend adds every
metric variable up over the processes of ``torch.distributed``, alone
(``torch/ddp-2``) or under ``keras.distribution.DataParallel``
(``torch/dp-2``, keras-team/keras#23316), whatever the variable's
``aggregation``, and computes the results from the sums in a
``StatelessScope``. So, over 2 processes (issue 39's suspicion (a)):

- a running mean kept in states declared ``aggregation="mean"`` reads the
  sum of the processes' means, twice one process's value; states declared
  ``"only_first_replica"`` are added up too (``tf.distribute`` averages
  the first and takes the first replica's for the second);
- a ``result()`` that returns its state variable, as ``Metric``'s
  docstring example does, is read after the scope: each process reports
  its own count.

The built-in metrics keep sums in ``"sum"`` states and return tensors:
they match one process on stock already (torch-dp-evaluate's guard).

The fork reduces each variable by its aggregation (``"mean"``: the sum
over the number of processes; ``"only_first_replica"``: process 0's
value; ``"sum"`` and ``"none"``: the sum) and reads the results inside
the scope.

The model is the identity (a ``Dense`` with a kernel of ones, no bias)
on rows ``0, 1, ..., 7`` (batches of 2), so every metric is a sum or a
running mean of small integers, divided by powers of 2: exact in
float32, so the comparisons are exact.

Guard (passes on stock too): in a process group of one, every metric
reads what one process reads.
"""

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("torch-metric-aggregation")
BATCH = 2
NUM_BATCHES = 4
# One process over rows 0 to 7: a mean of 3.5, 7 positive rows.
ONE_PROCESS = {"running_mean": 3.5, "positives": 7.0}


class Rows(keras.utils.PyDataset):
    """Batches of ``BATCH`` rows, row ``i`` holding ``i``, target 0."""

    def __init__(self):
        super().__init__()

    def __len__(self):
        return NUM_BATCHES

    def __getitem__(self, i):
        x = np.arange(i * BATCH, (i + 1) * BATCH, dtype="float32")[:, None]
        return x, np.zeros_like(x)


class RunningMean(keras.metrics.Metric):
    """The mean prediction, kept as a running mean: both states are the
    same kind of average in every process (``aggregation="mean"``)."""

    def __init__(self):
        super().__init__(name="running_mean")
        self.mean = self.add_variable((), "zeros", aggregation="mean")
        self.count = self.add_variable((), "zeros", aggregation="mean")

    def update_state(self, y_true, y_pred, sample_weight=None):
        n = keras.ops.cast(keras.ops.size(y_pred), "float32")
        count = self.count + n
        total = keras.ops.sum(y_pred)
        self.mean.assign(self.mean + (total - n * self.mean) / count)
        self.count.assign(count)

    def result(self):
        return keras.ops.convert_to_tensor(self.mean)


class Positives(keras.metrics.Metric):
    """The number of positive predictions; ``result()`` returns the state
    variable itself, as ``Metric``'s docstring example does."""

    def __init__(self):
        super().__init__(name="positives")
        self.total = self.add_variable((), "zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        positive = keras.ops.cast(y_pred > 0, "float32")
        self.total.assign(self.total + keras.ops.sum(positive))

    def result(self):
        return self.total


class Total(keras.metrics.Metric):
    """The sum of the predictions, in one state of ``aggregation``."""

    def __init__(self, aggregation):
        super().__init__(name=f"total_{aggregation}")
        self.total = self.add_variable((), "zeros", aggregation=aggregation)

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign(self.total + keras.ops.sum(y_pred))

    def result(self):
        return keras.ops.convert_to_tensor(self.total)


AGGREGATIONS = ("sum", "mean", "only_first_replica", "none")


def _runs(x, **kwargs):
    """The logs of ``evaluate`` and ``fit`` (in order, learning rate 0) of
    the identity with every metric above, on ``x`` (``kwargs``: ``y``,
    ``batch_size`` for arrays)."""
    ones = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = keras.Sequential([keras.Input((1,)), ones])
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss="mae",
        metrics=[RunningMean(), Positives()]
        + [Total(aggregation) for aggregation in AGGREGATIONS],
    )
    logs = model.evaluate(x, verbose=0, return_dict=True, **kwargs)
    history = model.fit(x, shuffle=False, verbose=0, **kwargs)
    return {
        "evaluate": {k: float(v) for k, v in logs.items()},
        "fit": {k: v[-1] for k, v in history.history.items()},
    }


def _dp_runs(rank, world_size):
    """In a ``torch/dp-2`` or ``torch/1`` worker: the 4 batches,
    auto-sharded (process 0 gets rows 0, 1, 4, 5 and process 1 rows 2,
    3, 6, 7)."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        distribution = devices.torch_processes(rank, world_size)
        with distribution.scope():
            return _runs(Rows())


def _ddp_runs(rank, world_size):
    """In a ``torch/ddp-2`` worker: no distribution; process 0 feeds rows
    0 to 3 and process 1 rows 4 to 7."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        x = np.arange(4 * rank, 4 * rank + 4, dtype="float32")[:, None]
        return _runs(x, y=np.zeros_like(x), batch_size=BATCH)


def _assert_reduced_by_aggregation(target, first_process_total):
    """Every process reports one process's running mean and positives,
    and each ``Total`` reduced as its aggregation says: of 28 over both
    processes, the sum, the mean 14, process 0's ``first_process_total``,
    and ``"none"`` added up as ``"sum"``.

    Stock: the running mean reads 7.0 (the sum of the processes' means),
    positives each process's own count, every ``Total`` 28. The workers
    need about 25 s on 2 CPU cores; 150 s bounds the whole run."""
    runs = workers.run_workers(
        f"{__name__}:{target}", world_size=2, timeout=150
    )
    expected = dict(
        ONE_PROCESS,
        total_sum=28.0,
        total_mean=14.0,
        total_only_first_replica=first_process_total,
        total_none=28.0,
    )
    for rank, run in enumerate(runs):
        for call, logs in run.items():
            actual = {name: logs[name] for name in expected}
            assert actual == expected, f"process {rank}, {call}: {logs}"


@pytest.mark.topology("dp-2")
def test_dp_metrics_are_reduced_by_their_aggregation():
    """torch/dp-2: a ``PyDataset`` auto-sharded by ``DataParallel``;
    process 0's rows 0, 1, 4, 5 add up to 10."""
    _assert_reduced_by_aggregation("_dp_runs", first_process_total=10.0)


@pytest.mark.topology("ddp-2")
def test_ddp_metrics_are_reduced_by_their_aggregation():
    """torch/ddp-2: arrays of 2 batches per process; process 0's rows 0
    to 3 add up to 6."""
    _assert_reduced_by_aggregation("_ddp_runs", first_process_total=6.0)


@pytest.mark.fix("torch-metric-aggregation", role="guard")
@pytest.mark.topology("1")
def test_one_process_metrics_are_unchanged():
    """torch/1: in a process group of one, every aggregation reads the
    process's own total, 28, as without a process group."""
    (run,) = workers.run_workers(
        f"{__name__}:_dp_runs", world_size=1, timeout=150
    )
    expected = dict(ONE_PROCESS, **{f"total_{a}": 28.0 for a in AGGREGATIONS})
    for call, logs in run.items():
        actual = {name: logs[name] for name in expected}
        assert actual == expected, f"{call}: {logs}"
