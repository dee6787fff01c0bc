"""Proof of accumulation-ema: conditional optimizer updates under replicas.

``gradient_accumulation_steps`` and ``ema_overwrite_frequency`` make an
optimizer update conditional on the step (``ops.cond``). Under a
``tf.distribute`` strategy with several replicas, stock Keras 3.15.1 puts
the gradient all-reduce and the mirrored-variable updates inside that
``tf.cond``: ``fit`` fails at the first step with "merge_call called while
defining a new graph" (keras-team/keras#20582). The fork all-reduces every
step in the replica context and takes the condition in the cross-replica
context. Proof: ``fit`` runs, and the weights follow one device trained on
the same global batches in the same process.

JAX (DataParallel over global arrays), torch and one TensorFlow device run
the base implementation unchanged: guards.
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("accumulation-ema")

GLOBAL_BATCH = 16  # divisible by every topology's replica count
NUM_SAMPLES = 64
EPOCHS = 2  # 8 steps

CONFIGS = {
    "accumulation": {"gradient_accumulation_steps": 2},
    "accumulation_clipnorm_weight_decay": {
        "gradient_accumulation_steps": 3,
        "global_clipnorm": 0.5,
        "weight_decay": 0.1,
    },
    "ema_overwrite": {
        "use_ema": True,
        "ema_momentum": 0.5,
        "ema_overwrite_frequency": 2,
    },
    "accumulation_and_ema_overwrite": {
        "gradient_accumulation_steps": 2,
        "use_ema": True,
        "ema_momentum": 0.5,
        "ema_overwrite_frequency": 2,
    },
}

# N replicas sum the same per-sample gradient terms as one device, in
# another order (per-replica partial sums, then the all-reduce): float32
# reassociation moves each of the 8 steps by a few ulps; 1e-5 relative
# leaves a wide margin (observed <= 1e-6). A wrong update (e.g. one
# replica's gradients accumulated, or a missed step) moves weights by
# 1e-2 or more.
RTOL, ATOL = 1e-5, 1e-6


def _data():
    rng = np.random.default_rng(20582)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    y = rng.normal(size=(NUM_SAMPLES, 1)).astype("float32")
    return x, y


def _model():
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, kernel_initializer="ones"),
            keras.layers.Dense(1, kernel_initializer="ones"),
        ]
    )


def _fit(scope, config, process=None):
    """Fits from fixed initial weights under ``scope``; flat weights.

    ``process=(rank, world_size)``: feed only that process's part of every
    global batch (a multi-process JAX job, see ``data.local_part``).
    """
    x, y = _data()
    (x, y), batch_size = data.process_batches((x, y), GLOBAL_BATCH, process)
    with scope:
        model = _model()
        model.compile(
            optimizer=keras.optimizers.SGD(
                0.01, momentum=0.5, **CONFIGS[config]
            ),
            loss="mse",
        )
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


# Upstream master overwrites the EMA weights under tf.distribute by itself
# (the TF optimizer's `_backend_maybe_overwrite_model_variables`, a
# `merge_call`; not in 3.15.1, in keras-nightly 3.16.0.dev2026102704), so
# EMA alone is a guard from 3.16 on; with accumulation it still fails there.
_EMA_UPSTREAM = pytest.mark.fix("accumulation-ema", guard_since="3.16.0.dev0")
# torch has no multi-device Model.fit: its multi-replica topologies are all
# multi-process.
_SINGLE_PROCESS = pytest.mark.topology(
    multi_process=False, reason="multi-process topologies run the worker test"
)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(c, marks=_EMA_UPSTREAM) if c == "ema_overwrite" else c
        for c in sorted(CONFIGS)
    ],
)
@_SINGLE_PROCESS
def test_conditional_updates_match_one_device(topology, config):
    """``fit`` with the optimizer ``config`` under the topology equals one
    device on the same global batches."""
    devices.skip_comparison_on_one_device(topology)
    expected = _fit(contextlib.nullcontext(), config)
    np.testing.assert_allclose(
        _fit(topology.scope(), config), expected, rtol=RTOL, atol=ATOL
    )


def _fit_loss_scaled(scope, accumulate):
    """Fits with a LossScaleOptimizer whose dynamic scale grows every 2
    steps from 2**15; flat weights and the final scale."""
    x, y = _data()
    with scope:
        model = _model()
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(
                0.01,
                momentum=0.5,
                gradient_accumulation_steps=2 if accumulate else None,
            ),
            initial_scale=2.0**15,
            dynamic_growth_steps=2,
        )
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(
            x,
            y,
            batch_size=GLOBAL_BATCH,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
    weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
    return weights, float(np.asarray(optimizer.dynamic_scale))


@pytest.mark.parametrize(
    "accumulate",
    [
        # LossScaleOptimizer alone already worked under replicas on stock.
        pytest.param(
            False, marks=pytest.mark.fix("accumulation-ema", role="guard")
        ),
        True,
    ],
)
@_SINGLE_PROCESS
def test_loss_scale_optimizer_matches_one_device(topology, accumulate):
    """LossScaleOptimizer (its skip-or-apply condition and its dynamic
    scale), also over gradient accumulation, equals one device."""
    devices.skip_comparison_on_one_device(topology)
    weights, scale = _fit_loss_scaled(topology.scope(), accumulate)
    expected_weights, expected_scale = _fit_loss_scaled(
        contextlib.nullcontext(), accumulate
    )
    # The scale is a power of two, doubled only after finite steps: exact.
    assert scale == expected_scale
    np.testing.assert_allclose(weights, expected_weights, rtol=RTOL, atol=ATOL)


def _assert_fits_match(runs, who):
    """Each worker's ``{config: [result, expected]}`` agree (``who``:
    "worker" or "process", for the message)."""
    for rank, fits in enumerate(runs):
        for config, (result, expected) in fits.items():
            np.testing.assert_allclose(
                result,
                expected,
                rtol=RTOL,
                atol=ATOL,
                err_msg=f"{who} {rank}: {config}",
            )


def _multiworker_fits(rank, world_size):
    """In each worker: every config, MultiWorkerMirrored vs one device."""
    strategy = devices.multi_worker_strategy(rank)
    return {
        config: [
            _fit(strategy.scope(), config).tolist(),
            _fit(contextlib.nullcontext(), config).tolist(),
        ]
        for config in sorted(CONFIGS)
    }


@pytest.mark.topology("multiworker-2")
def test_multiworker_conditional_updates_match_one_device():
    """Two workers (one replica each) against one device in each worker.

    On stock 3.15.1, ``fit`` under MultiWorkerMirroredStrategy fails before
    the first step for another reason too (fix multiworker-fit)."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_fits", world_size=2, timeout=300
    )
    _assert_fits_match(runs, "worker")


def _jax_process_fits(rank, world_size):
    """In each ``jax/procs-2`` worker: every config under DataParallel over
    both processes (each feeding its part of every global batch) and on
    this process's one device with the whole global batches."""
    distribution = devices.jax_processes(rank, world_size)
    return {
        config: [
            _fit(distribution.scope(), config, (rank, world_size)).tolist(),
            _fit(contextlib.nullcontext(), config).tolist(),
        ]
        for config in sorted(CONFIGS)
    }


@pytest.mark.fix("accumulation-ema", role="guard")
@pytest.mark.topology("procs-2")
def test_jax_processes_conditional_updates_match_one_device():
    """jax/procs-2: JAX computes the update on the global arrays, so the
    conditional updates were already right (guard of the N processes = 1
    device invariant)."""
    runs = workers.run_workers(
        f"{__name__}:_jax_process_fits", world_size=2, timeout=300
    )
    _assert_fits_match(runs, "process")


def _torch_loop(config, process=None):
    """A custom torch training loop (``data.torch_train``) with the
    Keras optimizer ``config``; flat final weights.

    ``process=(rank, world_size)``: this process's part of every global
    batch, under DDP; ``None``: the whole global batches, no DDP.
    """
    x, y = _data()
    (x, y), batch_size = data.process_batches((x, y), GLOBAL_BATCH, process)
    model = _model()
    optimizer = keras.optimizers.SGD(0.01, momentum=0.5, **CONFIGS[config])
    data.torch_train(
        model, optimizer, x, y, batch_size, EPOCHS, ddp=process is not None
    )
    # As fit() ends: EMA overwrites the weights when asked to.
    optimizer.finalize_variable_values(model.trainable_variables)
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def _ddp_fits(rank, world_size):
    """In each torch/ddp-2 worker: every config under DDP (this process's
    part of each global batch) and on one device (the whole batches)."""
    with workers.torch_process_group(rank, world_size):
        return {
            config: [
                _torch_loop(config, (rank, world_size)).tolist(),
                _torch_loop(config).tolist(),
            ]
            for config in sorted(CONFIGS)
        }


@pytest.mark.fix("accumulation-ema", role="guard")
@pytest.mark.topology("ddp-2")
def test_ddp_conditional_updates_match_one_device():
    """torch/ddp-2: DDP averages the gradients before the Keras optimizer
    sees them, so accumulation and EMA overwrites follow one device (guard
    of the N processes = 1 device invariant for a Keras model in a torch
    DDP loop)."""
    runs = workers.run_workers(
        f"{__name__}:_ddp_fits", world_size=2, timeout=300
    )
    _assert_fits_match(runs, "process")
