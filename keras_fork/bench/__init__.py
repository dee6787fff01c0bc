"""Measurement, not tests: fork/stock step time, shuffle cost and work
per step, measured in the same run (``python -m keras_fork bench``).
``worker`` is the process that imports one keras variant and measures."""
