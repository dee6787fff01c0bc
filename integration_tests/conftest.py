"""Harness of the proof suite.

Every test is marked ``@pytest.mark.fix("<fix id>")`` (ids in
``fixes/<id>/fix.toml``), optionally with ``role="guard"`` (or
``guard_on=(backends)`` for a guard on those backends only): a proof test (the
default) must fail on stock where its cell is ``proven``; a guard test
documents behavior that stock already has and must pass on both. The runner
starts one pytest process per base, variant, backend and topology with
``PROOF_FIX`` naming its fixes; only their tests are collected
(``harness.selection``). A test that runs on some topologies only says so
with ``@pytest.mark.topology(...)``; elsewhere it is skipped at collection,
with a reason in one of three categories (``harness.markers``). Outside
the runner (a developer running pytest by hand) every test runs on the
topology of ``PROOF_TOPOLOGY`` (default ``1``) with whichever keras is
importable.
"""

from __future__ import annotations

import gc

import pytest

from .harness import devices
from .harness import markers
from .harness import plugin
from .harness import selection
from .harness.plugin import pytest_configure  # noqa: F401


def pytest_collection_modifyitems(config, items):
    """The fix selection and each case's fix and role properties
    (``selection``), then the skips of the ``topology`` markers that this
    process's topology does not meet (``markers``)."""
    selection.pytest_collection_modifyitems(config, items)
    markers.pytest_collection_modifyitems(config, items)


@pytest.fixture
def topology():
    """The ``devices.Topology`` of this process."""
    return devices.current()


def pytest_collection_finish(session):
    """Freezes what collection imported (``plugin.freeze_heap``), after
    collecting."""
    gc.collect()
    plugin.freeze_heap()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Keras's global state (layer names, seeds, TensorFlow's default graph,
    torch's dynamo caches) reset and garbage collected before and after
    each test; what survives is frozen (``plugin.freeze_heap``)."""
    import keras

    keras.backend.clear_session()
    yield
    keras.backend.clear_session()
    plugin.freeze_heap()
