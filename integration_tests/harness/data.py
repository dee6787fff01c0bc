"""Data helpers of the proof tests: each process's part of the global
batches, a dataset whose rows say where they come from, an identity model
whose outputs and loss say which rows it saw, a call's outcome as a
value, and the custom torch training loop of Keras's DDP guide."""

from __future__ import annotations

import functools


def local_part(array, rank: int, world_size: int, global_batch: int):
    """Rows of ``array`` that process ``rank`` feeds in a multi-process job.

    Global batch ``b`` is rows ``[b * global_batch, (b + 1) * global_batch)``
    of ``array``; process ``rank`` feeds the ``rank``-th of its
    ``world_size`` equal parts, so that the processes' local batches, in
    process order, make up the global batch one device would see (JAX
    places them so: ``jax.make_array_from_process_local_data``).

    Args:
        array: NumPy array, ``(num_samples, ...)``; ``num_samples`` a
            multiple of ``global_batch``, itself a multiple of
            ``world_size``.

    Returns:
        NumPy array, ``(num_samples // world_size, ...)``.

    Raises:
        ValueError: the sizes do not divide.
    """
    import numpy as np

    if len(array) % global_batch or global_batch % world_size:
        raise ValueError(
            f"{len(array)} samples in global batches of {global_batch} do "
            f"not split evenly over {world_size} processes"
        )
    local = global_batch // world_size
    return np.concatenate(
        [
            array[start + rank * local : start + (rank + 1) * local]
            for start in range(0, len(array), global_batch)
        ]
    )


def process_batches(arrays, global_batch: int, process=None):
    """The data and batch size one process feeds to ``fit``.

    Args:
        arrays: NumPy arrays of the whole data, ``(num_samples, ...)``.
        global_batch: the global batch size.
        process: ``(rank, world_size)`` in a multi-process job, where each
            process feeds its part of every global batch (``local_part``);
            ``None`` for one process feeding everything.

    Returns:
        ``(arrays, batch_size)``: the process's rows and its batch size,
        ``global_batch // world_size`` (``global_batch`` without
        ``process``).

    Raises:
        ValueError: the sizes do not divide (see ``local_part``).
    """
    if process is None:
        return tuple(arrays), global_batch
    rank, world_size = process
    parts = tuple(local_part(a, rank, world_size, global_batch) for a in arrays)
    return parts, global_batch // world_size


def torch_train(
    model, optimizer, x, y, batch_size, epochs, ddp=False, on_epoch_end=None
):
    """Trains ``model`` in a custom torch loop, as in Keras's guide to
    distributed training with PyTorch: per batch, the mean squared error
    with the layers in training mode, ``backward()``, then the Keras
    ``optimizer`` applies the gradients to the trainable variables.

    Args:
        model: a Keras model (a ``torch.nn.Module`` on the torch backend).
        optimizer: a Keras optimizer, built here for the trainable
            variables.
        x, y: NumPy arrays, ``(samples, ...)`` and ``(samples, 1)``: this
            process's rows (see ``process_batches``), fed unshuffled.
        batch_size: rows per step (this process's part of a global batch).
        epochs: passes over ``x``.
        ddp: wrap the model in ``torch.nn.parallel.DistributedDataParallel``
            (needs a process group, e.g. ``workers.torch_process_group``),
            which averages the gradients over the processes in ``backward``.
        on_epoch_end: called with the epoch index after each epoch (the
            benchmark times epochs with it); ``None`` for nothing.
    """
    import torch

    variables = model.trainable_variables
    optimizer.build(variables)
    # Where Keras put the model: the CPU, or this process's GPU.
    device = variables[0].value.device
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    for epoch in range(epochs):
        for start in range(0, len(x), batch_size):
            xb = torch.as_tensor(x[start : start + batch_size], device=device)
            yb = torch.as_tensor(y[start : start + batch_size], device=device)
            loss = torch.mean((net(xb, training=True) - yb) ** 2)
            loss.backward()
            optimizer.apply([v.value.grad for v in variables], variables)
            for v in variables:
                v.value.grad = None
        if on_epoch_end is not None:
            on_epoch_end(epoch)


def index_rows(num_batches, batch_size, first=0, targets=False, stride=1):
    """A ``keras.utils.PyDataset`` whose rows say which they are: batch
    ``i`` holds the ``batch_size`` rows from ``first + i * stride *
    batch_size`` on, each the float32 value of its index, shape
    ``(batch_size, 1)``; with ``targets``, ``(x, zeros)``. Auto-sharded
    over processes, each process's output then shows which batches it
    read (the data-parallel ``predict`` and ``evaluate`` fixes); with
    ``first=p * batch_size, stride=n``, process ``p`` of ``n`` feeds the
    batches ``p``, ``p + n``, ... itself.

    Args:
        num_batches: ``len()`` of the dataset.
        batch_size: rows per batch.
        first: the index of the first row.
        targets: also yield targets of zero.
        stride: batch ``i`` is batch ``i * stride`` of the rows.
    """
    return _index_rows_class()(num_batches, batch_size, first, targets, stride)


@functools.cache
def _index_rows_class():
    """The ``PyDataset`` class of ``index_rows``, made once keras is
    imported (the harness imports no backend at module level)."""
    import keras
    import numpy as np

    class IndexRows(keras.utils.PyDataset):
        def __init__(self, num_batches, batch_size, first, targets, stride):
            super().__init__()
            # Not `num_batches`: `PyDataset` has a read-only property so
            # named.
            self.batches = num_batches
            self.rows = batch_size
            self.first = first
            self.targets = targets
            self.stride = stride

        def __len__(self):
            return self.batches

        def __getitem__(self, i):
            start = self.first + i * self.stride * self.rows
            x = np.arange(start, start + self.rows, dtype="float32")
            x = x[:, None]
            return (x, np.zeros_like(x)) if self.targets else x

    return IndexRows


def endless_rows(batch_size, first=0, stride=1):
    """``index_rows`` with targets and no end (``num_batches`` is ``None``,
    so ``steps`` says how many batches to run): batch ``i`` is batch
    ``first + i * stride`` of rows ``0, 1, ...`` in batches of
    ``batch_size``. With ``first=p, stride=n``, process ``p`` of ``n``
    feeds the batches ``p``, ``p + n``, ... itself, as auto-sharding reads
    them from ``endless_rows(batch_size)``.
    """
    return _endless_rows_class()(
        None, batch_size, first * batch_size, True, stride
    )


@functools.cache
def _endless_rows_class():
    """The ``PyDataset`` class of ``endless_rows``: ``index_rows``' with no
    number of batches."""

    class EndlessRows(_index_rows_class()):
        @property
        def num_batches(self):
            return None

    return EndlessRows


def outcome(run):
    """``run()``'s result, or the exception it raised, as ``"<type>:
    <message>"`` (what a worker returns where stock or the fork raises)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 (the outcome under test)
        return f"{type(e).__name__}: {e}"


def assert_close_by_key(actual, expected, rtol, atol, where=""):
    """Asserts that ``actual`` and ``expected`` (dicts of arrays, e.g.
    weights by path) have the same keys and allclose values under the
    caller's tolerances (justified where they are defined); ``where``
    starts the message, followed by the key."""
    import numpy as np

    assert actual.keys() == expected.keys(), (where, actual.keys())
    for key in expected:
        np.testing.assert_allclose(
            actual[key],
            expected[key],
            rtol=rtol,
            atol=atol,
            err_msg=f"{where}{key}",
        )


def assert_value_error(result, texts, where):
    """Asserts that ``result`` (an ``outcome``) is a ``ValueError`` whose
    message holds each of ``texts``; ``where`` (the process and the call)
    starts the assertion's message."""
    refused = isinstance(result, str) and result.startswith("ValueError")
    assert refused, f"{where}: {result}"
    for text in texts:
        assert text in result, f"{where}: {result}"


def identity_mae_model():
    """A ``Dense`` with a kernel of ones and no bias on rows of shape
    ``(1,)``, compiled with MAE and SGD: it predicts its input, so its loss
    against targets of zero is the mean of the rows it saw."""
    import keras

    ones = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = keras.Sequential([keras.Input((1,)), ones])
    model.compile(loss="mae", optimizer="sgd")
    return model


def ones_mlp():
    """A fresh ``Dense(3)`` then ``Dense(1)`` on rows of shape ``(4,)``,
    kernels of ones, biases of zeros: the same weights in every process
    and on every topology, with no seed."""
    import keras

    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, kernel_initializer="ones"),
            keras.layers.Dense(1, kernel_initializer="ones"),
        ]
    )


def identity_predictions(x, steps_per_execution=1, steps=None):
    """What ``predict`` returns for ``x`` (e.g. ``index_rows``) from a
    model whose two outputs are its input row and twice it (exact in
    float32): the first output's rows as a list, after checking the second
    against it; or the exception, as ``"<type>: <message>"``, where
    ``predict`` raises (what stock does in some data-parallel setups).

    Args:
        x: the input, rows of shape ``(1,)``.
        steps_per_execution: passed to ``compile``.
        steps: passed to ``predict``.
    """
    import keras
    import numpy as np

    inputs = keras.Input((1,))
    ones = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = keras.Model(inputs, [ones(inputs), 2.0 * ones(inputs)])
    model.compile(steps_per_execution=steps_per_execution)
    result = outcome(lambda: model.predict(x, steps=steps, verbose=0))
    if isinstance(result, str):
        return result
    first, second = result
    if not np.array_equal(second, 2.0 * first):
        return f"the outputs disagree: {first.tolist()} {second.tolist()}"
    return first[:, 0].tolist()


def process_index_rows(rank, world_size, num_batches, batch_size, **kwargs):
    """Process ``rank``'s part of ``index_rows(num_batches, batch_size)``,
    fed by the process itself (``auto_shard_dataset=False``): its batches
    ``rank``, ``rank + world_size``, ..., the ones auto-sharding reads for
    it on Keras master. The processes' batches of one step, in process
    order, make up the global batch.

    Args:
        rank, world_size: the process and the number of processes.
        num_batches, batch_size: the global dataset's, as ``index_rows``.
        **kwargs: ``targets``, passed to ``index_rows``.
    """
    own = len(range(rank, num_batches, world_size))
    return index_rows(
        own, batch_size, first=rank * batch_size, stride=world_size, **kwargs
    )
