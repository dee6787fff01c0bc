import numpy as np
from integration_tests.harness import data, devices


def local_dp(rank, world_size):
    import jax
    import keras
    devices.jax_processes(rank, world_size)
    local = keras.distribution.DataParallel(devices=jax.local_devices(), auto_shard_dataset=False)
    with local.scope():
        model = data.identity_mae_model()
        x = np.arange(2 * (3 - rank), dtype="float32")[:, None]
        return data.outcome(lambda: model.evaluate(x, np.zeros_like(x), batch_size=2, verbose=0))
