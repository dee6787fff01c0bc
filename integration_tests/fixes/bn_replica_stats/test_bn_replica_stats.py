"""Proof of bn-replica-stats: BatchNormalization statistics across replicas.

Under a ``tf.distribute`` strategy, ``BatchNormalization(synchronized=False)``
(the default) normalizes each replica's share of the global batch with its
own batch statistics, so each replica updates its own copy of the moving mean
and variance. Stock Keras 3.15.1 creates them with the default aggregation
``"none"`` (the default since 3.8.0, keras-team/keras#20695): the copies
diverge, ``get_weights()`` and ``.keras`` saving read replica 0's copy, while
``evaluate()``/``predict()`` under the strategy normalize each replica's
inputs with its own copy. The model that is saved is not the model that was
evaluated. (tf-keras 2 created them ``ON_READ``/``MEAN``; Keras 3.7.0 kept
them consistent with aggregation ``"mean"``.)

The fork creates them with ``synchronization="on_read"`` and
``aggregation="mean"``: each replica still updates its own copy (no
per-step communication), reads outside the replicas (``get_weights()``,
saving) give the mean of the copies, and the TensorFlow trainer assigns that
mean back to every copy at the end of each ``fit`` epoch and before
``evaluate()``/``predict()``. Moving averages are linear, so the mean of the
replicas' moving averages is the moving average of the mean of their batch
statistics, whenever it is taken.

Guards: ``synchronized=True`` already gives every replica the statistics of
the global batch on stock; JAX ``DataParallel`` computes the statistics of
the global batch (one global array); one device is unchanged.
"""

import contextlib
import os

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("bn-replica-stats")
PER_REPLICA = 4  # rows of each replica's share of a global batch
STEPS = 2  # global batches per epoch
EPOCHS = 2
MOMENTUM = 0.5
FEATURES = 4


def _model(**bn_kwargs):
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.BatchNormalization(momentum=MOMENTUM, **bn_kwargs),
            keras.layers.Dense(1, kernel_initializer="ones"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def _replica_rows(replica, step):
    """The rows replica ``replica`` gets at global step ``step``: a share
    whose mean and spread depend on the replica (``10 r + 3 s + k (1 + r)``
    plus the feature index, ``k = 0..3``)."""
    k = np.arange(PER_REPLICA, dtype="float64")[:, None]
    rows = 10 * replica + 3 * step + k * (1 + replica)
    return rows + np.arange(FEATURES)


def _data(replicas):
    """Global batches in order: ``fit(shuffle=False)`` splits each one into
    consecutive shares, replica 0 first."""
    x = np.concatenate(
        [_replica_rows(r, s) for s in range(STEPS) for r in range(replicas)]
    ).astype("float32")
    return x, np.zeros((len(x), 1), "float32")


def _expected_statistics(replicas):
    """The moving mean and variance after ``EPOCHS`` epochs: the moving
    average (float64) of the mean over replicas of each replica's batch
    mean and (biased) variance."""
    mean, variance = np.zeros(FEATURES), np.ones(FEATURES)
    for _ in range(EPOCHS):
        for s in range(STEPS):
            shares = [_replica_rows(r, s) for r in range(replicas)]
            batch_mean = np.mean([x.mean(axis=0) for x in shares], axis=0)
            batch_var = np.mean([x.var(axis=0) for x in shares], axis=0)
            mean = MOMENTUM * mean + (1 - MOMENTUM) * batch_mean
            variance = MOMENTUM * variance + (1 - MOMENTUM) * batch_var
    return mean, variance


def _fit(topology, replicas=None, **bn_kwargs):
    """Fits on the batches of ``_data(replicas)`` (default: the topology's
    replica count), one global batch per step."""
    replicas = replicas or topology.num_replicas
    x, y = _data(replicas)
    with topology.scope():
        model = _model(**bn_kwargs)
        model.fit(
            x,
            y,
            batch_size=PER_REPLICA * replicas,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
    return model


def _test_data():
    # 32 rows: divisible by every replica count (1, 2, 4, 8).
    x = np.random.default_rng(20695).normal(size=(32, FEATURES)) * 10 + 20
    return x.astype("float32"), np.zeros((32, 1), "float32")


def _replica_copies(topology, variable):
    return [
        np.asarray(t)
        for t in topology.strategy.experimental_local_results(variable.value)
    ]


# Float32 rounding: each batch moment is computed in float32 (relative error
# ~1e-7 of values up to ~60), then 4 moving-average updates and a mean over
# up to 4 replicas; 1e-5 relative leaves a wide margin. Stock's errors are
# O(1) (e.g. replica 0's mean is off by 10 from the mean of the copies).
STATS_RTOL = 1e-5


_MULTI_REPLICA_STRATEGY = pytest.mark.topology(
    strategy=True,
    multi_replica=True,
    reason="tf.distribute multi-replica topology only",
)


@_MULTI_REPLICA_STRATEGY
def test_moving_statistics_are_the_replica_mean(topology):
    """Every replica's copy, and ``get_weights()``, hold the mean of the
    replicas' moving statistics (stock: each replica its own; the weights
    read replica 0's)."""
    model = _fit(topology)
    bn = model.layers[0]
    expected_mean, expected_variance = _expected_statistics(
        topology.num_replicas
    )
    for copy in _replica_copies(topology, bn.moving_mean):
        np.testing.assert_allclose(copy, expected_mean, rtol=STATS_RTOL)
    for copy in _replica_copies(topology, bn.moving_variance):
        np.testing.assert_allclose(copy, expected_variance, rtol=STATS_RTOL)
    weights = {w.name: v for w, v in zip(bn.weights, bn.get_weights())}
    np.testing.assert_allclose(
        weights["moving_mean"], expected_mean, rtol=STATS_RTOL
    )
    np.testing.assert_allclose(
        weights["moving_variance"], expected_variance, rtol=STATS_RTOL
    )


@_MULTI_REPLICA_STRATEGY
def test_saved_model_reproduces_inference_under_strategy(topology, tmp_path):
    """``predict()`` and ``evaluate()`` under the strategy equal those of a
    one-device model loaded from the ``.keras`` file saved after ``fit``
    (and of one given ``get_weights()``).

    Tolerances: ``predict`` runs the same per-row float32 arithmetic on
    every device (1e-6 relative for kernel differences between devices);
    the ``evaluate`` loss is a mean over replicas, reassociated (1e-5
    relative). Stock differs by O(1) in the outputs (over 10 here)."""
    model = _fit(topology)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    given = _model()
    given.set_weights(model.get_weights())

    x, y = _test_data()
    predicted = model.predict(x, batch_size=len(x), verbose=0)
    evaluated = model.evaluate(x, y, batch_size=len(x), verbose=0)
    for reference in (loaded, given):
        np.testing.assert_allclose(
            predicted,
            reference.predict(x, batch_size=len(x), verbose=0),
            rtol=1e-6,
            atol=1e-5,
        )
        np.testing.assert_allclose(
            evaluated,
            reference.evaluate(x, y, batch_size=len(x), verbose=0),
            rtol=1e-5,
        )


@_MULTI_REPLICA_STRATEGY
def test_validation_in_fit_uses_the_saved_statistics(topology):
    """``fit(validation_data=...)`` evaluates with the mean statistics:
    its ``val_loss`` equals a one-device model's loss with the weights
    ``fit`` ends with (one epoch, so those are the validation weights).
    Tolerance: a mean over replicas, reassociated (1e-5 relative)."""
    replicas = topology.num_replicas
    x, y = _data(replicas)
    x_val, y_val = _test_data()
    with topology.scope():
        model = _model()
        history = model.fit(
            x,
            y,
            batch_size=PER_REPLICA * replicas,
            epochs=1,
            shuffle=False,
            validation_data=(x_val, y_val),
            validation_batch_size=len(x_val),
            verbose=0,
        )
    reference = _model()
    reference.set_weights(model.get_weights())
    np.testing.assert_allclose(
        history.history["val_loss"][0],
        reference.evaluate(x_val, y_val, batch_size=len(x_val), verbose=0),
        rtol=1e-5,
    )


def _multiworker_fit(rank, world_size):
    """In each worker: fit under MultiWorkerMirroredStrategy (one replica
    per worker), then report the worker's copy of the moving mean, the
    saved (aggregated) weights, and predictions under the strategy and by a
    one-device model given those weights."""
    strategy = devices.multi_worker_strategy(rank)
    x, y = _data(world_size)
    with strategy.scope():
        model = _model()
    model.fit(
        x,
        y,
        batch_size=PER_REPLICA * world_size,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
    )
    bn = model.layers[0]
    copies = strategy.experimental_local_results(bn.moving_mean.value)
    weights = model.get_weights()
    reference = _model()
    reference.set_weights(weights)
    x_test, _ = _test_data()
    return {
        "copy": np.asarray(copies[0]).tolist(),
        "moving_mean": np.asarray(
            weights[[w.name for w in model.weights].index("moving_mean")]
        ).tolist(),
        "predicted": model.predict(
            x_test, batch_size=len(x_test), verbose=0
        ).tolist(),
        "expected": reference.predict(
            x_test, batch_size=len(x_test), verbose=0
        ).tolist(),
    }


@pytest.mark.topology("multiworker-2")
def test_multiworker_statistics_are_consistent():
    """Two workers (one replica each): every worker ends with the same
    moving mean, the mean of the replicas' (the moving average of the
    global batches' means, which does not depend on how a global batch is
    split, so the check holds whatever share each worker gets), and
    ``predict()`` under the strategy equals a one-device model given the
    saved weights.

    On stock 3.15.1, ``fit`` under MultiWorkerMirroredStrategy fails
    before the first step (fix multiworker-fit), so this cell also fails
    there for that reason; with that fix alone the workers' copies differ
    (each keeps the statistics of its own shares). Tolerances as in the
    single-process tests (float32 moments, a mean over replicas)."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker_fit", world_size=2, timeout=300
    )
    expected_mean, _ = _expected_statistics(2)
    for rank, run in enumerate(runs):
        for name in ("copy", "moving_mean"):
            np.testing.assert_allclose(
                run[name],
                expected_mean,
                rtol=STATS_RTOL,
                err_msg=f"worker {rank}: {name}",
            )
        np.testing.assert_allclose(
            run["predicted"], run["expected"], rtol=1e-6, atol=1e-5
        )


@pytest.mark.fix("bn-replica-stats", role="guard")
@_MULTI_REPLICA_STRATEGY
def test_synchronized_statistics_match_one_device(topology):
    """``synchronized=True``: every replica holds the moving statistics of
    the global batch, as one device trained on the same batches (stock is
    right; guard).

    Tolerance: the global moments are all-reduced sums over replicas
    (reassociated float32; observed <= 2e-6 relative), 1e-5 relative."""
    model = _fit(topology, synchronized=True)
    one_device = _fit(
        _one_device(topology), topology.num_replicas, synchronized=True
    )
    bn, expected_bn = model.layers[0], one_device.layers[0]
    for name in ("moving_mean", "moving_variance"):
        expected = np.asarray(getattr(expected_bn, name).numpy())
        for copy in _replica_copies(topology, getattr(bn, name)):
            np.testing.assert_allclose(copy, expected, rtol=STATS_RTOL)


@pytest.mark.fix("bn-replica-stats", role="guard")
@pytest.mark.topology(
    backend="jax", multi_replica=True, reason="JAX DataParallel topology only"
)
@pytest.mark.topology(
    multi_process=False, reason="multi-process topologies run the worker test"
)
def test_data_parallel_statistics_match_one_device(topology):
    """JAX ``DataParallel``: the layer computes the statistics of the global
    batch (a global array), as one device does (guard).

    Tolerance: the global moments are reduced across 8 device shards
    (reassociated float32), 1e-5 relative."""
    model = _fit(topology)
    one_device = _fit(_one_device(topology), topology.num_replicas)
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(
            getattr(model.layers[0], name).numpy(),
            getattr(one_device.layers[0], name).numpy(),
            rtol=STATS_RTOL,
        )


def _jax_process_statistics(rank, world_size):
    """In each jax/procs-2 worker: the moving statistics after ``fit`` under
    DataParallel over both processes (each feeding its replica's share of
    every global batch), and after ``fit`` on this process's one device
    with the whole global batches."""
    distribution = devices.jax_processes(rank, world_size)
    x, y = _data(world_size)
    results = []
    for scope, process in (
        (distribution.scope(), (rank, world_size)),
        (contextlib.nullcontext(), None),
    ):
        (xs, ys), batch_size = data.process_batches(
            (x, y), PER_REPLICA * world_size, process
        )
        with scope:
            model = _model()
            model.fit(
                xs,
                ys,
                batch_size=batch_size,
                epochs=EPOCHS,
                shuffle=False,
                verbose=0,
            )
        bn = model.layers[0]
        results.append(
            [
                np.asarray(bn.moving_mean).tolist(),
                np.asarray(bn.moving_variance).tolist(),
            ]
        )
    return results


@pytest.mark.fix("bn-replica-stats", role="guard")
@pytest.mark.topology("procs-2")
def test_jax_processes_statistics_match_one_device():
    """jax/procs-2: the layer computes the statistics of the global batch
    (one global array over both processes), as one device does, and both
    processes hold them (guard). Tolerance as for jax/8."""
    runs = workers.run_workers(
        f"{__name__}:_jax_process_statistics", world_size=2, timeout=300
    )
    for rank, (fitted, expected) in enumerate(runs):
        np.testing.assert_allclose(
            fitted, expected, rtol=STATS_RTOL, err_msg=f"process {rank}"
        )


@pytest.mark.fix("bn-replica-stats", role="guard")
@pytest.mark.topology(multi_replica=False, reason="one-device topology only")
def test_one_device_statistics_and_saved_model(topology, tmp_path):
    """One device: the moving statistics are the moving average of the
    batch moments and the saved model predicts as the trained one (stock
    numerics; the fork's one-device trajectory is bit-identical to stock,
    checked outside this suite). Tolerance as for the replica mean."""
    model = _fit(topology)
    expected_mean, expected_variance = _expected_statistics(1)
    bn = model.layers[0]
    np.testing.assert_allclose(
        bn.moving_mean.numpy(), expected_mean, rtol=STATS_RTOL
    )
    np.testing.assert_allclose(
        bn.moving_variance.numpy(), expected_variance, rtol=STATS_RTOL
    )
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    x, _ = _test_data()
    np.testing.assert_array_equal(
        model.predict(x, verbose=0),
        keras.saving.load_model(path).predict(x, verbose=0),
    )


def _one_device(topology):
    """The same backend on one device, no strategy or distribution."""
    return devices.Topology(topology.backend, "1", 1)
