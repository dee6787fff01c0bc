"""Proof of bn-synchronized: ``BatchNormalization(synchronized=True)``
follows one device on the JAX and PyTorch backends.

``synchronized=True`` normalizes with the statistics of the global batch
when each device or process holds a part of it. Stock Keras 3.15.1
implements it for TensorFlow only (keras-team/keras#18667): on JAX and
PyTorch the layer raises a ValueError, so a Keras model in a torch
``DistributedDataParallel`` loop (the Keras guide's way to train on several
devices with PyTorch) can only normalize each process's part with that
part's statistics, and the processes' models drift apart.

The fork all-reduces the moments over the default ``torch.distributed``
process group (differentiably, so the gradient follows the global
statistics) and accepts the flag on JAX, where ``keras.distribution`` lays
a batch out as one global array whose moments are the global batch's.

Proof: trained on the same global batches, the synchronized model under
the topology ends with the weights and moving statistics of one device
(unsynchronized, the whole global batch in one place). The processes' or
devices' parts of each global batch are drawn from distributions with
different means (rows ``k`` of a global batch are centered on ``3 k``), so
per-part statistics would miss by O(1).

TensorFlow had ``synchronized=True`` before (its mirrored-2/-4 equivalence
with one device is a guard of bn-replica-stats); one device is the unit
cells' (batch_normalization_test.py).
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("bn-synchronized")

GLOBAL_BATCH = 16  # 2 rows per device on jax/8, 8 per process on 2
NUM_SAMPLES = 32  # 2 steps per epoch
EPOCHS = 2
FEATURES = 3
MOMENTUM = 0.5

# The topologies split each global batch into parts whose sums are
# all-reduced (processes) or reduced across shards (JAX devices), in float32
# and in another order than one device: the moments, and through them
# every gradient, move by a few ulps per step. After 4 SGD steps the
# weights and statistics differ from one device by at most 1.2e-6 relative
# (observed: jax/8 1.1e-6, ddp-2 5.7e-7, procs-2 1.9e-7, on values above
# 1e-3); 1e-5 relative (1e-6 absolute, for weights near 0) leaves a margin.
# Per-part statistics under DDP (synchronized=False) miss by up to 60
# (75% relative) on the moving variance.
RTOL, ATOL = 1e-5, 1e-6


def _data():
    """``NUM_SAMPLES`` rows; row ``k`` of each global batch is centered on
    ``3 k``, so each part of a global batch has its own mean."""
    rng = np.random.default_rng(18667)
    noise = rng.normal(size=(NUM_SAMPLES, FEATURES))
    offset = 3.0 * (np.arange(NUM_SAMPLES) % GLOBAL_BATCH)[:, None]
    x = (noise + offset).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return x, y


def _model(synchronized):
    """Dense -> BatchNormalization -> Dense from fixed initial weights (the
    same in every process: a NumPy generator, not the Keras seed)."""
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(4),
            keras.layers.BatchNormalization(
                momentum=MOMENTUM, synchronized=synchronized
            ),
            keras.layers.Dense(1),
        ]
    )
    rng = np.random.default_rng(0)
    model.set_weights(
        [
            w if "moving" in v.path else rng.normal(size=w.shape) / 2
            for v, w in zip(model.weights, model.get_weights())
        ]
    )
    return model


def _weights(model):
    """Every weight (kernels, biases, gamma, beta and the moving
    statistics) by position and name: the paths of two models differ."""
    return {
        f"{i}:{v.name}": np.asarray(w)
        for i, (v, w) in enumerate(zip(model.weights, model.get_weights()))
    }


def _fit(scope, synchronized, process=None):
    """``Model.fit`` under ``scope``; ``process=(rank, world_size)``: feed
    that process's part of every global batch (``data.local_part``)."""
    x, y = _data()
    (x, y), batch_size = data.process_batches((x, y), GLOBAL_BATCH, process)
    with scope:
        model = _model(synchronized)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
    return _weights(model)


def _assert_weights_match(actual, expected, who=""):
    data.assert_close_by_key(actual, expected, RTOL, ATOL, who)


def _assert_workers_match_one_device(worker):
    """Runs ``worker`` in 2 processes; each returns ``[fitted, expected]``
    weights (``_weights`` as lists), which must match."""
    runs = workers.run_workers(
        f"{__name__}:{worker}", world_size=2, timeout=300
    )
    for rank, (fitted, expected) in enumerate(runs):
        _assert_weights_match(
            {k: np.asarray(v) for k, v in fitted.items()},
            {k: np.asarray(v) for k, v in expected.items()},
            f"process {rank}: ",
        )


@pytest.mark.topology("8")
def test_data_parallel_matches_one_device(topology):
    """jax/8: ``fit`` under DataParallel with ``synchronized=True`` ends
    where one device does (stock: ValueError, JAX is not TensorFlow)."""
    _assert_weights_match(
        _fit(topology.scope(), synchronized=True),
        _fit(contextlib.nullcontext(), synchronized=False),
    )


def _jax_process_fits(rank, world_size):
    """In each jax/procs-2 worker: DataParallel over both processes (each
    feeding its part of every global batch) and this process's one device
    with the whole global batches."""
    distribution = devices.jax_processes(rank, world_size)
    fitted = _fit(distribution.scope(), True, (rank, world_size))
    expected = _fit(contextlib.nullcontext(), False)
    return [
        {k: v.tolist() for k, v in weights.items()}
        for weights in (fitted, expected)
    ]


@pytest.mark.topology("procs-2")
def test_jax_processes_match_one_device():
    """jax/procs-2: two processes, each feeding half of every global
    batch, end where one device does."""
    _assert_workers_match_one_device("_jax_process_fits")


def _torch_loop(synchronized, process=None):
    """A custom torch training loop (``data.torch_train``) with a
    Keras SGD. ``process=(rank, world_size)``: this process's part of every
    global batch, under DDP; ``None``: the whole global batches, no DDP."""
    x, y = _data()
    (x, y), batch_size = data.process_batches((x, y), GLOBAL_BATCH, process)
    model = _model(synchronized)
    data.torch_train(
        model,
        keras.optimizers.SGD(0.1),
        x,
        y,
        batch_size,
        EPOCHS,
        ddp=process is not None,
    )
    return {k: v.tolist() for k, v in _weights(model).items()}


def _ddp_fits(rank, world_size):
    """In each torch/ddp-2 worker: the synchronized model under DDP (this
    process's part of each global batch) and the unsynchronized one on the
    whole global batches, no DDP."""
    with workers.torch_process_group(rank, world_size):
        return [
            _torch_loop(True, (rank, world_size)),
            _torch_loop(False),
        ]


@pytest.mark.topology("ddp-2")
def test_ddp_matches_one_device():
    """torch/ddp-2: with ``synchronized=True`` both processes hold the
    model one device trains on the whole global batches: weights through
    the all-reduced statistics' gradient, and the moving statistics of the
    global batches (stock: ValueError, PyTorch is not TensorFlow)."""
    _assert_workers_match_one_device("_ddp_fits")
