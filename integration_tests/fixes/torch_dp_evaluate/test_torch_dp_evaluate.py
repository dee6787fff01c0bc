"""Proof of the uneven-evaluate fix of torch DDP and ``DataParallel``.

On Keras master, every torch test step sums the metric variables over the
processes of ``torch.distributed`` (``get_metrics_result()``), alone
(``torch/ddp-2``) or under ``keras.distribution.DataParallel``
(``torch/dp-2``, keras-team/keras#23316). ``DataParallel`` auto-shards a
``PyDataset`` by ``data_shard_id``: 5 batches over 2 processes give
process 0 three test steps and process 1 two. Stock ``evaluate()`` then
enters a reduction in one process only: gloo closes the connection
("Connection closed by peer"; NCCL would hang). ``fit(validation_data=
...)`` runs the same steps. The same happens when each process feeds
arrays of its own size under a bare process group.

The fork gathers the step counts before the first test step and a
process with fewer steps runs the reductions it lacks: every process
reports the metrics of all batches, as one process does. A model that
overrides ``test_step()`` gets a ``ValueError`` in every process instead.

The model is the identity (a ``Dense`` with a kernel of ones, no bias)
and the targets are 0, so the loss (MAE) is the mean of the rows and the
MSE metric the mean of their squares: every partial sum is a small
integer, exact in float32, so the comparisons are exact.

Guards (pass on stock too): an even split (4 batches) gives one
process's built-in metrics and a metric whose state has
``aggregation="mean"``; arrays and a ``DataLoader`` are refused under
auto-sharding; a ``DataLoader`` under a bare process group is not
re-sampled (no padded duplicates); one process evaluates every batch.
"""

import functools
import time

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("torch-dp-evaluate")
BATCH = 2
# The bound for an evaluate over 2 processes, in each process.
LIMIT_S = 60
# Rows 0 to 9, targets 0: MAE 45 / 10, MSE 285 / 10.
ALL_ROWS = {"loss": 4.5, "mse": 28.5}


Rows = functools.partial(data.index_rows, batch_size=BATCH, targets=True)


class CustomTestStep(keras.Sequential):
    def test_step(self, data):
        return super().test_step(data)


def _identity(model_class=keras.Sequential):
    ones = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = model_class([keras.Input((1,)), ones])
    model.compile(
        optimizer=keras.optimizers.SGD(0.0), loss="mae", metrics=["mse"]
    )
    return model


def _timed(call):
    """``call()``'s result (or its error) and its wall time."""
    start = time.monotonic()
    try:
        result = call()
    except Exception as e:
        result = {"error": f"{type(e).__name__}: {e}"}
    return {"result": result, "seconds": time.monotonic() - start}


def _uneven_runs(x, train_x, **kwargs):
    """``evaluate``, ``fit``'s validation, and a custom ``test_step``'s
    ``evaluate`` on ``x`` (a ``PyDataset`` or arrays: ``kwargs``)."""
    model = _identity()
    custom = _identity(CustomTestStep)
    evaluate = dict(kwargs, verbose=0, return_dict=True)
    if not isinstance(x, keras.utils.PyDataset):
        x, evaluate["y"] = x, np.zeros_like(x)
        train_kwargs = dict(kwargs, y=np.zeros_like(train_x))
        validation = (x, evaluate["y"])
    else:
        train_kwargs, validation = dict(kwargs), x

    def fit():
        history = model.fit(
            train_x, validation_data=validation, verbose=0, **train_kwargs
        )
        return {
            k[4:]: v[-1]
            for k, v in history.history.items()
            if k.startswith("val_")
        }

    evaluated = _timed(lambda: model.evaluate(x, **evaluate))
    # Checked here, as soon as it returns: on stock the process with fewer
    # steps returns its own batches' metrics while the other waits in a
    # reduction; this worker's failure then ends the run at once
    # (``workers.run_workers``) instead of at the collectives' timeout.
    assert evaluated["result"] == ALL_ROWS, f"evaluate: {evaluated}"
    return {
        "evaluate": evaluated,
        "validation": _timed(fit),
        "custom": _timed(lambda: custom.evaluate(x, **evaluate)),
    }


def _dp_runs(rank, world_size):
    """In a ``torch/dp-2`` worker: 5 auto-sharded batches (3 and 2 per
    process), training on 4. The process group is started first, with a
    30 s timeout on its collectives, so stock's mismatched ones end then
    (``keras.distribution.initialize`` keeps a started group)."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        distribution = devices.torch_processes(rank, world_size)
        with distribution.scope():
            return _uneven_runs(Rows(5), Rows(4))


def _ddp_runs(rank, world_size):
    """In a ``torch/ddp-2`` worker: no distribution; process 0 feeds rows
    0 to 5 (3 batches), process 1 rows 6 to 9 (2), training on 2 batches
    each."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        rows = np.arange(10, dtype="float32")[:, None]
        own = rows[:6] if rank == 0 else rows[6:]
        return _uneven_runs(own, rows[:4], batch_size=BATCH)


def _assert_all_batches_in_every_process(target):
    """Both processes report the metrics of rows 0 to 9 from ``evaluate``
    and ``fit``'s validation, each within ``LIMIT_S``, and the custom
    ``test_step`` raises the ``ValueError`` naming ``[3, 2]`` in both.

    Stock: a process fails its own check of ``evaluate``'s metrics
    (``_uneven_runs``), or gloo closes the connection in one process and
    the other's collectives time out (30 s each) or the worker dies. The
    workers need about 25 s on 2 CPU cores; 150 s bounds the whole run."""
    runs = workers.run_workers(
        f"{__name__}:{target}", world_size=2, timeout=150
    )
    for rank, run in enumerate(runs):
        for name in ("evaluate", "validation"):
            assert run[name]["result"] == ALL_ROWS, f"process {rank}: {run}"
        error = run["custom"]["result"].get("error", "")
        assert "ValueError" in error and "[3, 2] test steps" in error, (
            f"process {rank}: {run['custom']}"
        )
        for name, call in run.items():
            assert call["seconds"] < LIMIT_S, f"process {rank}: {name} {call}"


@pytest.mark.topology("dp-2")
def test_dp_uneven_evaluate_reports_all_batches():
    """torch/dp-2: a ``PyDataset`` auto-sharded by ``DataParallel``."""
    _assert_all_batches_in_every_process("_dp_runs")


@pytest.mark.topology("ddp-2")
def test_ddp_uneven_evaluate_reports_all_batches():
    """torch/ddp-2: arrays of 3 and 2 batches per process."""
    _assert_all_batches_in_every_process("_ddp_runs")


class MeanOfStates(keras.metrics.Metric):
    """The mean prediction, from two states with ``aggregation="mean"``."""

    def __init__(self, name="mean_of_states"):
        super().__init__(name=name)
        self.total = self.add_variable(
            (), "zeros", aggregation="mean", name="total"
        )
        self.count = self.add_variable(
            (), "zeros", aggregation="mean", name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(y_pred))
        self.count.assign_add(keras.ops.cast(keras.ops.size(y_pred), "float32"))

    def result(self):
        return self.total / self.count


class Labelled(keras.utils.PyDataset):
    """``num_batches`` batches of 4 rows of 3 features, labels 0 or 1."""

    def __init__(self, num_batches):
        super().__init__()
        rng = np.random.default_rng(39)
        self.x = rng.normal(size=(4 * num_batches, 3)).astype("float32")
        self.y = (rng.random((4 * num_batches, 1)) < 0.5).astype("float32")

    def __len__(self):
        return len(self.x) // 4

    def __getitem__(self, i):
        return self.x[4 * i : 4 * i + 4], self.y[4 * i : 4 * i + 4]


def _metrics_model():
    # Named: a second model's metrics would be `auc_1`, ...
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(
                1,
                activation="sigmoid",
                kernel_initializer=keras.initializers.Constant(0.3),
                bias_initializer=keras.initializers.Constant(-0.1),
            ),
        ]
    )
    model.compile(
        loss="binary_crossentropy",
        metrics=[
            "accuracy",
            keras.metrics.AUC(num_thresholds=50, name="auc"),
            keras.metrics.Precision(name="precision"),
            keras.metrics.Recall(name="recall"),
            keras.metrics.F1Score(threshold=0.5, name="f1"),
            keras.metrics.R2Score(name="r2"),
            keras.metrics.MeanSquaredError(name="mse"),
            MeanOfStates(),
        ],
    )
    return model


def _evaluate_metrics(x):
    logs = _metrics_model().evaluate(x, verbose=0, return_dict=True)
    return {k: np.asarray(v).tolist() for k, v in logs.items()}


def _refusal(call):
    try:
        call()
    except ValueError as e:
        return str(e)
    return "not refused"


def _dp_even_runs(rank, world_size):
    """In a ``torch/dp-2`` worker: 4 batches (2 and 2) with the built-in
    metrics, then arrays and a ``DataLoader``, which are refused."""
    import torch

    with workers.torch_process_group(rank, world_size, timeout=30):
        distribution = devices.torch_processes(rank, world_size)
        x = np.zeros((4, 3), "float32")
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.zeros(4, 3)), batch_size=2
        )
        with distribution.scope():
            model = _metrics_model()
            return {
                "metrics": _evaluate_metrics(Labelled(4)),
                "arrays": _refusal(lambda: model.evaluate(x, x[:, :1])),
                "loader": _refusal(lambda: model.predict(loader)),
            }


@pytest.mark.fix("torch-dp-evaluate", role="guard")
@pytest.mark.topology("dp-2")
def test_dp_even_evaluate_matches_one_process():
    """torch/dp-2: the built-in metrics' states are sums over samples, so
    the per-step sum over the processes gives one process's metrics; so
    does a metric whose two states have ``aggregation="mean"`` (summed on
    stock, averaged with torch-metric-aggregation: their ratio is the
    same). Suspicion (a) of issue 39 is refuted for every built-in metric
    here (custom metrics: torch-metric-aggregation). rtol 1e-5: the
    processes' partial sums are added in another order (float32), and AUC
    interpolates between thresholds."""
    runs = workers.run_workers(
        f"{__name__}:_dp_even_runs", world_size=2, timeout=150
    )
    expected = _evaluate_metrics(Labelled(4))
    for rank, run in enumerate(runs):
        assert run["metrics"].keys() == expected.keys(), run
        for name, value in expected.items():
            np.testing.assert_allclose(
                run["metrics"][name],
                value,
                rtol=1e-5,
                err_msg=f"process {rank}: {name}",
            )
        for name in ("arrays", "loader"):
            assert "auto-sharding" in run[name], f"process {rank}: {run}"


def _ddp_loader_runs(rank, world_size):
    """In a ``torch/ddp-2`` worker: a ``DataLoader`` of rows 0 to 4 in
    batches of 2 (the last of 1) under a bare process group."""
    import torch

    with workers.torch_process_group(rank, world_size, timeout=30):
        rows = torch.arange(5, dtype=torch.float32)[:, None]
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(rows, torch.zeros(5, 1)),
            batch_size=2,
        )
        model = _identity()
        logs = model.evaluate(loader, verbose=0, return_dict=True)
        return {"logs": logs, "rows": model.predict(loader, verbose=0).size}


@pytest.mark.fix("torch-dp-evaluate", role="guard")
@pytest.mark.topology("ddp-2")
def test_ddp_data_loader_is_not_resampled():
    """torch/ddp-2: Keras injects a ``DistributedSampler`` only under an
    auto-sharding distribution (where multi-process refuses a
    ``DataLoader``, above), so under a bare process group each process
    evaluates the whole loader: 5 rows, no padded duplicates, and the sum
    over the processes gives one process's metrics (MAE 10 / 5, MSE
    30 / 5). Suspicion (b) of issue 39 is refuted."""
    runs = workers.run_workers(
        f"{__name__}:_ddp_loader_runs", world_size=2, timeout=150
    )
    for rank, run in enumerate(runs):
        assert run == {"logs": {"loss": 2.0, "mse": 6.0}, "rows": 5}, (
            f"process {rank}: {run}"
        )


def _one_process_runs(rank, world_size):
    with workers.torch_process_group(rank, world_size):
        distribution = devices.torch_processes(rank, world_size)
        with distribution.scope():
            return [
                model.evaluate(Rows(5), verbose=0, return_dict=True)
                for model in (_identity(), _identity(CustomTestStep))
            ]


@pytest.mark.fix("torch-dp-evaluate", role="guard")
@pytest.mark.topology("1")
def test_one_process_evaluates_every_batch():
    """torch/1: in a process group of one, 5 batches, custom step too."""
    (run,) = workers.run_workers(
        f"{__name__}:_one_process_runs", world_size=1, timeout=180
    )
    assert run == [ALL_ROWS, ALL_ROWS], run
