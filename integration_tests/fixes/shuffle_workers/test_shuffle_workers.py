"""Proof of the shuffle-workers fix (keras-team/keras#20577, multi-process).

Under ``MultiWorkerMirroredStrategy`` Keras turns NumPy inputs into a
tf.data pipeline that every worker builds and shards: worker ``i`` takes
its part of every global batch. So all workers must shuffle with the same
order, or samples are skipped and repeated within an epoch. With
``keras.utils.set_random_seed(s)`` on every worker they do (guard). Without
it, stock 3.15.1 shuffles with unseeded ``tf.random.shuffle`` and each worker
draws its own order; the fork's shuffle seed comes from OS entropy per
worker, and the fix makes every worker adopt the first replica's seed (one
all-reduce of 4 integers per ``fit()``). Runs stay random across jobs.

The tests read the batches each worker gets from Keras's own epoch iterator
(what ``fit`` consumes), so the check is exact: every sample id once per
epoch across the workers, the same global order on both workers.
"""

import os

import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = [
    pytest.mark.fix("shuffle-workers"),
    pytest.mark.topology("multiworker-2"),
]

NUM_SAMPLES = 64
GLOBAL_BATCH = 8
EPOCHS = 2
TIMEOUT = 240


def worker(rank, world_size):
    """Sample ids each worker's replica sees per step, for ``EPOCHS``."""

    strategy = devices.multi_worker_strategy(rank)
    import keras
    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    if os.environ.get("SHUFFLE_SEED"):
        keras.utils.set_random_seed(int(os.environ["SHUFFLE_SEED"]))
    ids = np.arange(NUM_SAMPLES, dtype="float32")[:, None]
    iterator = TFEpochIterator(
        distribute_strategy=strategy,
        x=ids,
        y=ids,
        batch_size=GLOBAL_BATCH,
        shuffle=True,
    )
    epochs = []
    for _ in range(EPOCHS):
        steps = []
        with iterator.catch_stop_iteration():
            for _, _, batches in iterator:
                x, _ = next(batches)
                (local,) = strategy.experimental_local_results(x)
                steps.append(local.numpy()[:, 0].astype(int).tolist())
        epochs.append(steps)
    return epochs


def _check(per_worker, epochs_differ=True):
    for epoch in range(EPOCHS):
        seen = [i for w in per_worker for step in w[epoch] for i in step]
        counts = np.bincount(seen, minlength=NUM_SAMPLES)
        assert counts.tolist() == [1] * NUM_SAMPLES, (
            f"epoch {epoch}: ids seen 0 times: "
            f"{np.flatnonzero(counts == 0).tolist()}, more than once: "
            f"{np.flatnonzero(counts > 1).tolist()}"
        )
    if not epochs_differ:
        return
    # Epochs differ: two independent shuffles of 64 ids into 8 global
    # batches give the same batch sets with probability < 1e-40.
    first = [frozenset(sum(s, [])) for s in zip(*(w[0] for w in per_worker))]
    second = [frozenset(sum(s, [])) for s in zip(*(w[1] for w in per_worker))]
    assert first != second


def _run(topology, env):
    return workers.run_workers(
        f"{__name__}:worker", topology.num_replicas, TIMEOUT, env
    )


def test_workers_without_a_seed_see_each_sample_once_per_epoch(topology):
    _check(_run(topology, {"SHUFFLE_SEED": ""}))


@pytest.mark.fix("shuffle-workers", role="guard")
def test_workers_with_one_seed_see_each_sample_once_per_epoch(topology):
    # Stock repeats one order in every epoch when seeded (shuffle-epochs
    # proves that), so only the once-per-epoch property is guarded here.
    _check(_run(topology, {"SHUFFLE_SEED": "20577"}), epochs_differ=False)
