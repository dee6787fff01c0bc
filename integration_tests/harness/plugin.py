"""Pytest hooks the proof runs share: the ``fix`` and ``topology`` markers'
declaration (``markers.register``); the check that a run imported the
keras variant it was started for (``PROOF_KERAS_DIR``,
``PROOF_KERAS_VERSION``), after the topology's devices are set up; and
``freeze_heap``, which the proof suite's conftest calls.

The proof suite's conftest and the unit runs' generated conftest
(``keras_fork.proof.runner``) both import ``pytest_configure`` from here.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from . import devices
from . import markers

# ``PROOF_GC_FREEZE=0``: no ``gc.freeze``; only ``bench-matrix`` sets it,
# to measure what that cost.
GC_FREEZE_ENV = "PROOF_GC_FREEZE"
# The keras a run must import: its folder and its version (the runner sets
# them for each variant).
KERAS_DIR_ENV = "PROOF_KERAS_DIR"
KERAS_VERSION_ENV = "PROOF_KERAS_VERSION"


def freeze_heap() -> None:
    """Moves every object alive now into the garbage collector's permanent
    generation, which ``gc.collect()`` no longer walks (``gc.freeze``,
    https://docs.python.org/3/library/gc.html#gc.freeze), unless
    ``PROOF_GC_FREEZE=0``.

    ``clear_session`` runs ``gc.collect()`` before and after every test.
    Unfrozen, each collection walks the whole heap, the backend's modules
    and what earlier tests left in caches included; frozen after
    collection and after each test's last collection, it walks only what
    the running test made (what that saves: ``bench-matrix``,
    docs/test-run.md). Frozen objects were all reachable then; one that
    becomes garbage later stays in memory.
    """
    if os.environ.get(GC_FREEZE_ENV, "1") != "0":
        gc.freeze()


def pytest_configure(config):
    markers.register(config)
    # Before any backend op: TensorFlow logical devices are fixed at start.
    devices.current()
    import keras

    expected_dir = os.environ.get(KERAS_DIR_ENV)
    if expected_dir:
        where = Path(keras.__file__).resolve()
        if Path(expected_dir).resolve() not in where.parents:
            raise pytest.UsageError(
                f"keras imported from {where}, expected under {expected_dir}"
            )
    expected_version = os.environ.get(KERAS_VERSION_ENV)
    if expected_version and keras.__version__ != expected_version:
        raise pytest.UsageError(
            f"keras {keras.__version__} imported, expected {expected_version}"
        )
