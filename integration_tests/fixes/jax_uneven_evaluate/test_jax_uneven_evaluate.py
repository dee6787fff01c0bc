"""Proof of the uneven-evaluate fix of JAX ``DataParallel`` over processes.

On Keras master, ``keras.distribution.DataParallel(auto_shard_dataset=
True)`` over 2 JAX processes (``jax/procs-2``) gives process ``p`` the
batches ``p``, ``p + 2``, ... of a ``PyDataset``. With 5 batches process 0
runs 3 test steps and process 1 runs 2; each step is one computation over
both processes, so stock ``evaluate()`` (and ``fit()``'s validation) waits
forever in process 0's third step. The fork compares the step counts
before the first step (one gather of an integer per call) and raises the
same ``ValueError`` in every process, naming the counts and the remedies
(a batch count that is a multiple of the process count, or ``steps``).

Checked with an identity model (a ``Dense`` with a kernel of ones, no
bias) and targets of zero, so the mean absolute error is the mean of the
rows evaluated.

Guard: one process (``jax/1``) evaluates every batch, with and without
``DataParallel``; the fork adds no collective there.
"""

import functools

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("jax-uneven-evaluate")
BATCH = 2


Rows = functools.partial(data.index_rows, batch_size=BATCH, targets=True)


def _identity_model():
    """Predicts its input: the loss (MAE, targets 0) is the mean row."""
    ones = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = keras.Sequential([keras.Input((1,)), ones])
    model.compile(loss="mae", optimizer="sgd")
    return model


def _outcome(run):
    """The call's result, or its error as ``"Type: message"``."""
    try:
        return run()
    except Exception as e:  # the fork: ValueError before the first step
        return f"{type(e).__name__}: {e}"


def _uneven(rank, world_size):
    """In a ``jax/procs-2`` worker: ``evaluate`` on 5 auto-sharded batches
    (3 and 2 per process), the remedy ``steps=2``, then ``fit``'s
    validation on the 5 batches."""
    import jax

    devices.jax_processes(rank, world_size)
    distribution = keras.distribution.DataParallel(
        devices=jax.devices(), auto_shard_dataset=True
    )
    with distribution.scope():
        model = _identity_model()
        evaluated = _outcome(lambda: model.evaluate(Rows(5), verbose=0))
        capped = _outcome(lambda: model.evaluate(Rows(5), steps=2, verbose=0))
        validated = _outcome(
            lambda: (
                model.fit(
                    Rows(4), validation_data=Rows(5), epochs=1, verbose=0
                ).history
            )
        )
    return evaluated, validated, capped


@pytest.mark.topology("procs-2")
def test_uneven_evaluate_raises_in_every_process():
    """jax/procs-2: ``evaluate()`` and ``fit(validation_data=...)`` on 5
    batches raise a ``ValueError`` naming 3 and 2 steps in both processes;
    ``steps=2`` evaluates batches 0 to 3 in both (the mean of rows 0 to
    7: the model is not trained yet).

    Stock: process 0 waits forever in its third test step. The workers
    need about 20 s on 2 CPU cores; 75 s bounds the run."""
    runs = workers.run_workers(f"{__name__}:_uneven", world_size=2, timeout=75)
    for rank, (evaluated, validated, capped) in enumerate(runs):
        for name, outcome in (("evaluate", evaluated), ("fit", validated)):
            assert isinstance(outcome, str), f"{rank} {name}: {outcome}"
            assert outcome.startswith("ValueError"), f"{rank}: {outcome}"
            for text in ("process 0: 3", "process 1: 2", "a multiple"):
                assert text in outcome, f"process {rank} {name}: {outcome}"
        assert isinstance(capped, float), f"process {rank}: {capped}"
    assert runs[0][2] == runs[1][2] == 3.5, runs


@pytest.mark.fix("jax-uneven-evaluate", role="guard")
@pytest.mark.topology("1")
def test_one_process_evaluates_every_batch():
    """jax/1: one process evaluates all 5 batches (the mean of 0 to 9),
    with and without ``DataParallel``."""
    import jax

    distribution = keras.distribution.DataParallel(
        devices=jax.devices(), auto_shard_dataset=True
    )
    with distribution.scope():
        in_scope = _identity_model().evaluate(Rows(5), verbose=0)
    plain = _identity_model().evaluate(Rows(5), verbose=0)
    np.testing.assert_allclose([in_scope, plain], [4.5, 4.5], rtol=1e-6)
