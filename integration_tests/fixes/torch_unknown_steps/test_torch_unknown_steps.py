"""Proof of the unknown-length fix of torch DDP and ``DataParallel``.

On Keras master, every torch training step all-reduces the gradients over
the processes of ``torch.distributed`` and every step sums the metric
variables over them (keras-team/keras#23316), alone (``torch/ddp-2``) or
under ``keras.distribution.DataParallel`` (``torch/dp-2``). Here each
process's input has no known length: a Python generator or a torch
``IterableDataset`` of its own batches (process ``p`` feeds batches ``p``,
``p + 2``, ... of rows ``0, 1, ...`` in batches of 2), or, auto-sharded
by ``DataParallel``, a ``tf.data.Dataset`` after ``filter()`` in global
batches of 4 (rebatched to 2 and sharded, the same batches). With 5
batches process 0 has 3 and process 1 has 2. Stock ``evaluate()`` then
runs process 0's third reduction alone: one process crashes in the
collective or waits, the other returns the metrics of its own batches.

The fork compares the processes' numbers of batches before each step:
``evaluate()`` (and ``fit``'s validation) reports the metrics of rows 0
to 9 in every process, as one process does (a process without a batch
runs the reduction of the step, adding no samples); ``fit()`` and a model
that overrides ``test_step()`` raise the same ``ValueError`` in every
process before step 2, where process 1 has no batch.

The model is the identity (a ``Dense`` with a kernel of ones, no bias)
and the targets are 0, so the loss (MAE) is the mean of the rows: every
partial sum is a small integer, exact in float32, so the comparisons are
exact.

Guard: one process evaluates every batch of such an input.
"""

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("torch-unknown-steps")
BATCH = 2
# Rows 0 to 9, and rows 0 to 7, targets 0: their mean absolute values.
ALL_ROWS, EIGHT_ROWS = 4.5, 3.5
DDP_KINDS = ["generator", "iterable-dataset"]
DP_KINDS = ["tf.data-filter", "generator"]


def _skip_without_tensorflow(kind):
    if kind == "tf.data-filter":
        pytest.importorskip(
            "tensorflow", reason="not applicable: tf.data needs TensorFlow"
        )


def _batches(kind, num_batches, first=0, stride=1):
    """Batches ``first``, ``first + stride``, ... (fewer than
    ``num_batches``) of rows ``0, 1, ...`` in batches of ``BATCH``, with
    targets of zero, as an input of unknown length of ``kind``. A
    ``tf.data-filter`` input is the whole dataset in global batches of
    ``2 * BATCH``, for ``DataParallel`` to rebatch and shard."""
    rows = [
        np.arange(i * BATCH, (i + 1) * BATCH, dtype="float32")[:, None]
        for i in range(first, num_batches, stride)
    ]
    if kind == "generator":
        return ((x, np.zeros_like(x)) for x in rows)
    if kind == "iterable-dataset":
        import torch

        class Batches(torch.utils.data.IterableDataset):
            def __iter__(self):
                return ((x, np.zeros_like(x)) for x in rows)

        return torch.utils.data.DataLoader(Batches(), batch_size=None)
    import tensorflow as tf

    x = np.arange(num_batches * BATCH, dtype="float32")[:, None]
    dataset = tf.data.Dataset.from_tensor_slices((x, np.zeros_like(x)))
    # `filter()` makes the length unknown (cardinality -2).
    return dataset.filter(lambda *row: True).batch(2 * BATCH)


class CustomTestStep(keras.Sequential):
    def test_step(self, data):
        return super().test_step(data)


def _identity(model_class=keras.Sequential, steps_per_execution=1):
    """The identity, trained with a learning rate of 0: ``fit`` keeps it."""
    ones = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = model_class([keras.Input((1,)), ones])
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss="mae",
        steps_per_execution=steps_per_execution,
    )
    return model


def _refused(rank, name, outcome):
    """Asserts that ``outcome`` is the ``ValueError`` of step 2, where
    process 1 has no batch."""
    texts = ("step 2", "process 0: 1 batch", "process 1: no batch")
    data.assert_value_error(outcome, texts, f"process {rank} {name}")


def _runs(rank, world_size, kind):
    """In a worker: ``evaluate`` on 5 batches of unknown length (3 and 2
    per process), also with ``steps=3``, with ``steps_per_execution=2``
    and as ``fit``'s validation, each the mean of rows 0 to 9; of 1 batch,
    which process 1 lacks: a generator refused in every process, else the
    mean of rows 0 and 1; ``predict``, every row in order where
    auto-sharded, else each process's own; ``fit`` and a custom
    ``test_step``'s ``evaluate`` on them, each refused; ``evaluate`` on 4
    (2 and 2), whose loss it returns. Each outcome is checked as soon as
    it returns: on stock the process with fewer batches returns its own
    batches' loss while the other waits in a reduction, and the failed
    check ends the run at once (``workers.run_workers``)."""
    if kind == "tf.data-filter":

        def own(num_batches):
            return _batches(kind, num_batches)
    else:

        def own(num_batches):
            return _batches(kind, num_batches, rank, world_size)

    model = _identity()
    evaluated = data.outcome(lambda: model.evaluate(own(5), verbose=0))
    assert evaluated == ALL_ROWS, f"process {rank} evaluate: {evaluated}"
    capped = data.outcome(lambda: model.evaluate(own(5), steps=3, verbose=0))
    assert capped == ALL_ROWS, f"process {rank} evaluate(steps=3): {capped}"
    # Steps of 2 batches: process 1 has none for the second step.
    stepped = _identity(steps_per_execution=2)
    two = data.outcome(lambda: stepped.evaluate(own(5), verbose=0))
    assert two == ALL_ROWS, f"process {rank} steps_per_execution=2: {two}"
    if kind == "tf.data-filter":
        # One batch in all: process 1 has none, and still reports it.
        one = data.outcome(lambda: model.evaluate(own(1), verbose=0))
        assert one == 0.5, f"process {rank} evaluate of 1 batch: {one}"
        # `predict()` runs no collective in its steps; auto-sharded, its
        # outputs are gathered once at the end (torch-dp-predict): every
        # row, in input order, in every process.
        rows = data.outcome(lambda: model.predict(own(5), verbose=0))
        rows = rows if isinstance(rows, str) else rows[:, 0].tolist()
        assert rows == list(range(10)), f"process {rank} predict: {rows}"
    else:
        # Of 1 batch, process 1's input has none. A generator's adapter
        # refuses it there, before any step, and the other process raises
        # too; an `IterableDataset` is read step by step, and both report
        # the mean of rows 0 and 1.
        one = data.outcome(lambda: model.evaluate(own(1), verbose=0))
        one_validated = data.outcome(
            lambda: model.fit(
                own(4), validation_data=own(1), verbose=0
            ).history["val_loss"]
        )
        # Not auto-sharded, `predict()` runs no collective: each process
        # returns the rows of its own batches, in order.
        rows = data.outcome(lambda: model.predict(own(5), verbose=0))
        rows = rows if isinstance(rows, str) else rows[:, 0].tolist()
        own_rows = [r for i in range(rank, 5, 2) for r in (2 * i, 2 * i + 1)]
        assert rows == own_rows, f"process {rank} predict: {rows}"
        where = f"process {rank} of 1 batch"
        if kind == "generator":
            data.assert_value_error(one, (), f"{where}: evaluate")
            data.assert_value_error(one_validated, (), f"{where}: validation")
        else:
            runs = [one, one_validated]
            assert runs == [0.5, [0.5]], f"{where}: {runs}"
    validated = data.outcome(
        lambda: model.fit(own(4), validation_data=own(5), verbose=0).history[
            "val_loss"
        ]
    )
    assert validated == [ALL_ROWS], f"process {rank} validation: {validated}"
    _refused(rank, "fit", data.outcome(lambda: model.fit(own(5), verbose=0)))
    custom = _identity(CustomTestStep)
    _refused(
        rank,
        "custom test_step",
        data.outcome(lambda: custom.evaluate(own(5), verbose=0)),
    )
    # An endless `PyDataset` runs `steps` in every process: rows 0 to 11
    # over 3 steps (auto-sharded: batches p, p + 2, ... by Keras).
    endless = (
        data.endless_rows(BATCH)
        if kind == "tf.data-filter"
        else data.endless_rows(BATCH, rank, world_size)
    )
    endless_loss = model.evaluate(endless, steps=3, verbose=0)
    assert endless_loss == 5.5, f"process {rank} PyDataset: {endless_loss}"
    return model.evaluate(own(4), verbose=0)


def _ddp(kind, rank, world_size):
    """In a ``torch/ddp-2`` worker: a bare process group, whose collectives
    end after 30 s (stock's mismatched ones)."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        return _runs(rank, world_size, kind)


def _dp(kind, rank, world_size):
    """In a ``torch/dp-2`` worker: ``DataParallel``, auto-sharding the
    ``tf.data`` input; each process feeds its own generator's batches."""
    with workers.torch_process_group(rank, world_size, timeout=30):
        distribution = devices.torch_processes(rank, world_size)
        distribution.auto_shard_dataset = kind == "tf.data-filter"
        with distribution.scope():
            return _runs(rank, world_size, kind)


def _ddp_generator(rank, world_size):
    return _ddp("generator", rank, world_size)


def _ddp_iterable_dataset(rank, world_size):
    return _ddp("iterable-dataset", rank, world_size)


def _dp_tf_data_filter(rank, world_size):
    return _dp("tf.data-filter", rank, world_size)


def _dp_generator(rank, world_size):
    return _dp("generator", rank, world_size)


def _assert_every_process_ends_alike(target):
    """Both processes report the mean of rows 0 to 9 where they evaluate 5
    batches, refuse ``fit`` and the custom ``test_step`` at step 2, and
    report the mean of rows 0 to 7 on 4 batches.

    Stock: a process fails its check of ``evaluate()``'s loss, or gloo
    closes the connection in one process and the other's collectives time
    out (30 s). The workers need about 25 s on 2 CPU cores (45 s with
    TensorFlow's import); 150 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:{target}", world_size=2, timeout=150
    )
    assert runs == [EIGHT_ROWS, EIGHT_ROWS], runs


@pytest.mark.topology("ddp-2")
@pytest.mark.parametrize("kind", DDP_KINDS)
def test_ddp_unknown_length_ends_alike_in_every_process(kind):
    """torch/ddp-2: a generator, a ``DataLoader`` of an
    ``IterableDataset``."""
    _assert_every_process_ends_alike(f"_ddp_{kind.replace('-', '_')}")


@pytest.mark.topology("dp-2")
@pytest.mark.parametrize("kind", DP_KINDS)
def test_dp_unknown_length_ends_alike_in_every_process(kind):
    """torch/dp-2: an auto-sharded ``tf.data.Dataset`` after ``filter()``,
    a generator of each process's own batches."""
    _skip_without_tensorflow(kind)
    target = {
        "tf.data-filter": "_dp_tf_data_filter",
        "generator": "_dp_generator",
    }
    _assert_every_process_ends_alike(target[kind])


def _one_process_runs(rank, world_size):
    with workers.torch_process_group(rank, world_size):
        return [
            model.evaluate(_batches(kind, 5), verbose=0)
            for kind in DDP_KINDS
            for model in (_identity(), _identity(CustomTestStep))
        ]


@pytest.mark.fix("torch-unknown-steps", role="guard")
@pytest.mark.topology("1")
def test_one_process_evaluates_every_batch():
    """torch/1: in a process group of one, a generator and an
    ``IterableDataset`` of 5 batches, custom ``test_step`` too."""
    (run,) = workers.run_workers(
        f"{__name__}:_one_process_runs", world_size=1, timeout=180
    )
    assert run == [ALL_ROWS] * 4, run
