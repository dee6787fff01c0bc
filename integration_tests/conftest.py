"""Harness of the proof suite.

Every test is marked ``@pytest.mark.fix("<fix id>")`` (ids in
``fixes/<id>/fix.toml``), optionally with ``role="guard"`` (or
``guard_on=(backends)`` for a guard on those backends only): a proof test (the
default) must fail on stock where its cell is ``proven``; a guard test
documents behavior that stock already has and must pass on both. The runner
starts one pytest process per base, variant, backend and topology with
``PROOF_FIX`` naming its fixes; only their tests are collected
(``harness.selection``). Outside the runner (a developer running pytest
by hand) every test runs on the topology of ``PROOF_TOPOLOGY`` (default ``1``)
with whichever keras is importable.
"""

from __future__ import annotations

import gc
import os

import pytest

from integration_tests.harness import devices
from integration_tests.harness import selection
from integration_tests.harness.plugin import pytest_configure  # noqa: F401

# The fix selection and the per-case fix and role properties.
pytest_collection_modifyitems = selection.pytest_collection_modifyitems
_proof_properties = selection.proof_properties


@pytest.fixture
def topology():
    """The ``devices.Topology`` of this process."""
    return devices.current()


# ``PROOF_GC_FREEZE=0``: no ``gc.freeze``, as before 2026-11-26; only
# ``bench-matrix`` sets it, to measure what that cost.
GC_FREEZE_ENV = "PROOF_GC_FREEZE"


def _freeze() -> None:
    """Moves every object alive now into the garbage collector's permanent
    generation, which ``gc.collect()`` no longer walks (``gc.freeze``,
    https://docs.python.org/3/library/gc.html#gc.freeze), unless
    ``PROOF_GC_FREEZE=0``.

    ``clear_session`` runs ``gc.collect()`` before and after every test.
    Unfrozen, each collection walks the whole heap, the backend's modules
    and what earlier tests left in caches included (180,000 to 410,000
    objects): 0.1 to 0.5 s, about 1 s a test on TensorFlow. Frozen after
    collection and after each test's last collection, it walks only what
    the running test made: a few ms. Frozen objects were all reachable
    then; one that becomes garbage later stays in memory (a TensorFlow
    ``mirrored-2`` run peaked at 1.2 GB either way).
    """
    if os.environ.get(GC_FREEZE_ENV, "1") != "0":
        gc.freeze()


def pytest_collection_finish(session):
    """Freezes what collection imported (``_freeze``), after collecting."""
    gc.collect()
    _freeze()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Keras's global state (layer names, seeds, TensorFlow's default graph,
    torch's dynamo caches) reset and garbage collected before and after
    each test; what survives is frozen (``_freeze``)."""
    import keras

    keras.backend.clear_session()
    yield
    keras.backend.clear_session()
    _freeze()
