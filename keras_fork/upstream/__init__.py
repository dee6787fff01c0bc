"""Where upstream stands: each series against its base and the newest
keras-nightly (``python -m keras_fork status``)."""
