"""Proof of the unknown-length fix of JAX ``DataParallel`` over processes.

Over 2 JAX processes (``jax/procs-2``), each process feeds its own batches
(``auto_shard_dataset=False``): process ``p`` the batches ``p``, ``p + 2``,
... of rows ``0, 1, ...`` in batches of 2, from an input whose length is
unknown before the first step: a ``tf.data.Dataset`` after ``filter()``,
or a Python generator (and, in the generator's run, a grain
``IterDataset`` and an endless ``PyDataset`` with ``steps``). With 5
batches process 0 has 3 and process 1 has 2; each step is one
computation over both processes. Stock ``evaluate()`` and ``fit()`` then
run process 0's third step alone: one process crashes
in the collective or waits forever, and the other returns a result.
Stock ``predict()`` cannot read the outputs at all (jax-dp-predict). The
fork compares the processes' batches before each step: at step 2 every
process stops and raises the same ``ValueError``, naming each process's
batch and the remedies.

With 4 batches (2 each) the processes stop together: ``evaluate()`` gives
the mean of rows 0 to 7, as one process does over all of them.

Checked with an identity model (a ``Dense`` with a kernel of ones, no
bias) and targets of zero, so the mean absolute error is the mean of the
rows evaluated.

Guard: one process (``jax/1``) evaluates every batch of such an input,
with and without ``DataParallel``; the fork adds no collective there.
"""

import keras
import numpy as np
import pytest

from ...harness import data
from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("jax-unknown-steps")
BATCH = 2
KINDS = ["tf.data-filter", "generator"]


def _skip_without_tensorflow(kind):
    if kind == "tf.data-filter":
        pytest.importorskip(
            "tensorflow", reason="not applicable: tf.data needs TensorFlow"
        )


def _batches(kind, num_batches, first=0, stride=1, targets=True):
    """Batches ``first``, ``first + stride``, ... (fewer than
    ``num_batches``) of rows ``0, 1, ...`` in batches of ``BATCH``, as an
    input of unknown length of ``kind`` (``KINDS``, or ``"grain"``: a
    ``grain.IterDataset``, whose length Keras never knows)."""
    indices = range(first, num_batches, stride)
    rows = [
        np.arange(i * BATCH, (i + 1) * BATCH, dtype="float32")[:, None]
        for i in indices
    ]
    if kind == "generator":

        def generate():
            for x in rows:
                yield (x, np.zeros_like(x)) if targets else (x,)

        return generate()
    if kind == "grain":
        import grain

        batches = [(x, np.zeros_like(x)) if targets else x for x in rows]
        return grain.MapDataset.source(batches).to_iter_dataset()
    import tensorflow as tf

    x = np.concatenate(rows)
    slices = (x, np.zeros_like(x)) if targets else x
    dataset = tf.data.Dataset.from_tensor_slices(slices)
    # `filter()` makes the length unknown (cardinality -2).
    return dataset.filter(lambda *row: True).batch(BATCH)


def _refused(rank, name, outcome):
    """Asserts, in the worker, that ``outcome`` is the ``ValueError`` of
    step 2, where process 1 has no batch. Checked as soon as the call
    returns: on stock, one process returns a result while the other
    crashes or waits, and the failed check ends the run at once
    (``workers.run_workers``)."""
    texts = ("step 2", "process 0: 2 rows", "process 1: no batch")
    data.assert_value_error(outcome, texts, f"process {rank} {name}")


def _unknown(rank, world_size, kind):
    """In a ``jax/procs-2`` worker: ``evaluate``, ``predict`` and ``fit``
    on 5 batches of unknown length (3 and 2 per process), each refused, and
    ``evaluate`` on 4 (2 and 2), whose loss it returns; then ``evaluate``
    with ``steps=3`` on the 5, and ``fit`` with ``steps_per_epoch=2`` over
    2 epochs on 5 batches of known length, each refused (generator: also
    ``evaluate``, ``predict`` and ``fit`` on 1 batch, which process 1
    lacks, each refused in every process)."""
    distribution = devices.jax_processes(rank, world_size)

    def own(num_batches, targets=True):
        return _batches(kind, num_batches, rank, world_size, targets)

    with distribution.scope():
        model = data.identity_mae_model()
        evaluated = data.outcome(lambda: model.evaluate(own(5), verbose=0))
        _refused(rank, "evaluate", evaluated)
        predicted = data.outcome(
            lambda: model.predict(own(5, targets=False), verbose=0)
        )
        _refused(rank, "predict", predicted)
        # Before fit could train the model: the mean of rows 0 to 7.
        even = data.outcome(lambda: model.evaluate(own(4), verbose=0))
        trained = data.outcome(lambda: model.fit(own(5), verbose=0).history)
        _refused(rank, "fit", trained)
        # `steps` does not make the length known: compared before each step.
        capped = data.outcome(
            lambda: model.evaluate(own(5), steps=3, verbose=0)
        )
        _refused(rank, "evaluate(steps=3)", capped)
        # Known counts (3 and 2) with `steps_per_epoch=2`: each epoch runs
        # 2 steps, but the second would run out in process 1 first, so
        # `fit()` compares the numbers of batches before its first step.
        known = data.process_index_rows(
            rank, world_size, 5, batch_size=BATCH, targets=True
        )
        epochs = data.outcome(
            lambda: model.fit(known, steps_per_epoch=2, epochs=2, verbose=0)
        )
        data.assert_value_error(
            epochs,
            ["process 0: 3, process 1: 2"],
            f"process {rank} fit(steps_per_epoch=2)",
        )
        if kind == "generator":
            # The other kinds of input with no known length, once a run:
            # a grain `IterDataset` (3 and 2 batches) is refused alike; an
            # endless `PyDataset` runs `steps` in every process (rows 0 to
            # 11 over 3 steps: their mean, from a model `fit` has not
            # trained).
            grained = data.outcome(
                lambda: model.evaluate(
                    _batches("grain", 5, rank, world_size), verbose=0
                )
            )
            _refused(rank, "evaluate(grain)", grained)
            endless = data.identity_mae_model().evaluate(
                data.endless_rows(BATCH, rank, world_size), steps=3, verbose=0
            )
            assert endless == 5.5, f"process {rank} PyDataset: {endless}"
            # Of 1 batch, process 1's generator has none: its adapter
            # refuses it there, before any step, and process 0 raises too.
            for name, run in (
                ("evaluate", model.evaluate),
                ("predict", model.predict),
                ("fit", model.fit),
            ):
                empty = data.outcome(lambda: run(own(1), verbose=0))
                where = f"process {rank} {name} of 1 batch"
                data.assert_value_error(empty, (), where)
    return even


@pytest.mark.topology("procs-2")
@pytest.mark.parametrize("kind", KINDS)
def test_unknown_length_ends_alike_in_every_process(kind):
    """jax/procs-2: on 5 batches of unknown length, ``evaluate()``,
    ``predict()``, ``fit()`` and ``evaluate(steps=3)`` raise the
    ``ValueError`` of step 2 in both processes; on 4, ``evaluate()`` gives
    the mean of rows 0 to 7 in both; ``fit(steps_per_epoch=2, epochs=2)``
    on 3 and 2 batches of known length is refused before its first step.

    Stock: at the third step of ``evaluate()`` process 0 runs alone;
    process 1 returns a loss, fails its check and ends the run. The workers
    need about 20 s on 2 CPU cores (45 s with TensorFlow's import); 150 s
    bounds the run."""
    _skip_without_tensorflow(kind)
    target = {"tf.data-filter": "_tf_data_filter", "generator": "_generator"}
    runs = workers.run_workers(
        f"{__name__}:{target[kind]}", world_size=2, timeout=150
    )
    assert runs == [3.5, 3.5], runs


def _tf_data_filter(rank, world_size):
    return _unknown(rank, world_size, "tf.data-filter")


def _generator(rank, world_size):
    return _unknown(rank, world_size, "generator")


@pytest.mark.fix("jax-unknown-steps", role="guard")
@pytest.mark.topology("1")
@pytest.mark.parametrize("kind", KINDS)
def test_one_process_evaluates_every_batch(kind):
    """jax/1: one process evaluates all 5 batches (the mean of rows 0 to
    9), with and without ``DataParallel``."""
    import jax

    _skip_without_tensorflow(kind)
    distribution = keras.distribution.DataParallel(
        devices=jax.devices(), auto_shard_dataset=False
    )
    with distribution.scope():
        in_scope = data.identity_mae_model().evaluate(
            _batches(kind, 5), verbose=0
        )
    plain = data.identity_mae_model().evaluate(_batches(kind, 5), verbose=0)
    np.testing.assert_allclose([in_scope, plain], [4.5, 4.5], rtol=1e-6)
