"""Proof of multiworker-bfloat16-predict: ``predict()`` of a bfloat16 model
under ``MultiWorkerMirroredStrategy``.

The workers of a ``MultiWorkerMirroredStrategy`` gather ``predict()``'s
outputs with ``strategy.gather``, whose collective takes float16, float32,
float64, int32 and int64 only. A model under the ``mixed_bfloat16`` policy
outputs bfloat16, and stock Keras raises ``TypeError: Value passed to
parameter 'input' has DataType bfloat16 not in list of allowed values`` in
every worker. The fork gathers bfloat16 outputs as float32, which holds
every bfloat16 value exactly, and casts them back. Proof: 2 workers
predict 16 rows (2 batches of 8, each split over the workers); the rows
come back in order, bfloat16, equal to one device's.
"""

import contextlib

import keras
import numpy as np
import pytest

from ...harness import devices
from ...harness import workers

pytestmark = pytest.mark.fix("multiworker-bfloat16-predict")

GLOBAL_BATCH = 8
NUM_SAMPLES = 16


def _predict(scope):
    """The rows and dtype of ``predict()`` of a fixed bfloat16 model on the
    same 16 rows (both workers feed them all: the strategy shards them)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(NUM_SAMPLES, 4)).astype("float32")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        with scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            model.set_weights(
                [
                    np.arange(8, dtype="float32").reshape(4, 2) / 8,
                    np.zeros(2, "float32"),
                ]
            )
            rows = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    finally:
        keras.config.set_dtype_policy(previous)
    return {
        "dtype": str(rows.dtype),
        "rows": np.asarray(rows, "float32").tolist(),
    }


def _multiworker(rank, world_size):
    strategy = devices.multi_worker_strategy(rank)
    return [_predict(strategy.scope), _predict(contextlib.nullcontext)]


@pytest.mark.topology("multiworker-2")
def test_multiworker_predicts_bfloat16_rows_in_order():
    """tensorflow/multiworker-2. Every worker gets every row, in order, as
    one device computes them: the same bfloat16 products of the same
    weights, so equal (the gather moves values, it adds nothing). The
    workers need about 15 s on 2 CPU cores; 120 s bounds the run."""
    runs = workers.run_workers(
        f"{__name__}:_multiworker", world_size=2, timeout=120
    )
    for rank, (distributed, one_device) in enumerate(runs):
        assert distributed["dtype"] == "bfloat16", f"worker {rank}"
        np.testing.assert_array_equal(
            distributed["rows"], one_device["rows"], err_msg=f"worker {rank}"
        )
