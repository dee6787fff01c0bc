"""Pytest hooks the proof runs share: the check that a run imported the
keras variant it was started for (``PROOF_KERAS_DIR``,
``PROOF_KERAS_VERSION``), after the topology's devices are set up.

The proof suite's conftest and the unit runs' generated conftest
(``keras_fork.proof.runner``) both import ``pytest_configure`` from here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from integration_tests.harness import devices


def pytest_configure(config):
    # Before any backend op: TensorFlow logical devices are fixed at start.
    devices.current()
    import keras

    expected_dir = os.environ.get("PROOF_KERAS_DIR")
    if expected_dir:
        where = Path(keras.__file__).resolve()
        if Path(expected_dir).resolve() not in where.parents:
            raise pytest.UsageError(
                f"keras imported from {where}, expected under {expected_dir}"
            )
    expected_version = os.environ.get("PROOF_KERAS_VERSION")
    if expected_version and keras.__version__ != expected_version:
        raise pytest.UsageError(
            f"keras {keras.__version__} imported, expected {expected_version}"
        )
