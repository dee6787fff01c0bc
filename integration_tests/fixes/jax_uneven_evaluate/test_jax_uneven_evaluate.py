"""Proof of the uneven-evaluate fix of JAX ``DataParallel`` over processes.

Over 2 JAX processes (``jax/procs-2``), process ``p`` feeds the batches
``p``, ``p + 2``, ... of a ``PyDataset``: itself (``auto_shard_dataset=
False``, on both bases) or, on Keras master, by ``DataParallel``'s
auto-sharding (Keras 3.15.1 refuses to auto-shard a ``PyDataset`` over
processes). With 5 batches process 0 runs 3 test steps and process 1
runs 2; each step is one computation over both processes, so stock
``evaluate()`` (and ``fit()``'s validation) runs process 0's third step
alone and waits there forever. The fork compares the step counts before
the first step (one gather of an integer per call) and raises the same
``ValueError`` in every process, naming the counts and the remedies (as
many batches in every process, or ``steps``).

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
# How the processes get their batches: each feeds its own (both bases), or
# master's DataParallel auto-shards one PyDataset.
FEEDS = [
    "per-process",
    pytest.param(
        "auto-sharded",
        marks=pytest.mark.fix(
            "jax-uneven-evaluate",
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


def _refused(rank, name, outcome, feed):
    """Asserts, in the worker, that ``outcome`` is the ``ValueError`` that
    names both processes' step counts (and, auto-sharded, a batch count
    that is a multiple of the process count).

    Checked in the worker, as soon as the call returns: on stock, process
    1 returns a loss after its 2 steps while process 0 waits in its third;
    the failed worker ends the run at once (``workers.run_workers``)."""
    texts = ["process 0: 3", "process 1: 2"]
    if feed == "auto-sharded":
        texts.append("a multiple")
    data.assert_value_error(outcome, texts, f"process {rank} {name}")


def _uneven(rank, world_size, feed="auto-sharded"):
    """In a ``jax/procs-2`` worker: ``evaluate`` on 5 batches (3 and 2 per
    process), refused; the remedy ``steps=2``, whose loss it returns;
    ``fit``'s validation on the 5 batches, refused."""
    import jax

    if feed == "auto-sharded":
        devices.jax_processes(rank, world_size)
        distribution = keras.distribution.DataParallel(
            devices=jax.devices(), auto_shard_dataset=True
        )
        rows = Rows
    else:
        distribution = devices.jax_processes(rank, world_size)
        rows = functools.partial(
            data.process_index_rows,
            rank,
            world_size,
            batch_size=BATCH,
            targets=True,
        )
    with distribution.scope():
        model = data.identity_mae_model()
        evaluated = data.outcome(lambda: model.evaluate(rows(5), verbose=0))
        _refused(rank, "evaluate", evaluated, feed)
        # Before fit trains the model: the mean of rows 0 to 7.
        capped = data.outcome(
            lambda: model.evaluate(rows(5), steps=2, verbose=0)
        )
        validated = data.outcome(
            lambda: (
                model.fit(
                    rows(4), validation_data=rows(5), epochs=1, verbose=0
                ).history
            )
        )
        _refused(rank, "fit", validated, feed)
    return capped


def _per_process_uneven(rank, world_size):
    return _uneven(rank, world_size, "per-process")


@pytest.mark.topology("procs-2")
@pytest.mark.parametrize("feed", FEEDS)
def test_uneven_evaluate_raises_in_every_process(feed):
    """jax/procs-2: ``evaluate()`` and ``fit(validation_data=...)`` on 5
    batches raise a ``ValueError`` naming 3 and 2 steps in both processes
    (and, auto-sharded, a batch count that is a multiple of the process
    count); ``steps=2`` evaluates batches 0 to 3 in both (the mean of rows
    0 to 7: the model is not trained yet).

    Stock: process 1 returns a loss from its 2 steps while process 0
    waits forever in its third; process 1's check fails and the run ends
    there. The workers need about 20 s on 2 CPU cores; 75 s bounds the
    run."""
    target = "_per_process_uneven" if feed == "per-process" else "_uneven"
    capped = workers.run_workers(
        f"{__name__}:{target}", world_size=2, timeout=75
    )
    assert capped == [3.5, 3.5], capped


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
        in_scope = data.identity_mae_model().evaluate(Rows(5), verbose=0)
    plain = data.identity_mae_model().evaluate(Rows(5), verbose=0)
    np.testing.assert_allclose([in_scope, plain], [4.5, 4.5], rtol=1e-6)
