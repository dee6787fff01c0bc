"""Harness of the proof suite.

Every test is marked ``@pytest.mark.fix("<fix id>")`` (ids in
``fixes/<id>/fix.toml``), optionally with ``role="guard"`` (or
``guard_on=(backends)`` for a guard on those backends only): a proof test (the
default) must fail on stock where its cell is ``proven``; a guard test
documents behavior that stock already has and must pass on both. The runner
starts one pytest process per cell and variant with ``PROOF_FIX`` set; only
that fix's tests are collected. Outside the runner (a developer running pytest
by hand) every test runs on the topology of ``PROOF_TOPOLOGY`` (default ``1``)
with whichever keras is importable.
"""

from __future__ import annotations

import os

import pytest

from integration_tests.harness import devices
from integration_tests.harness.plugin import pytest_configure  # noqa: F401


def _fix_of(item) -> str | None:
    marker = item.get_closest_marker("fix")
    return marker.args[0] if marker and marker.args else None


ROLES = ("proof", "guard")


def _role_of(item) -> str:
    marker = item.get_closest_marker("fix")
    role = marker.kwargs.get("role", "proof") if marker else "proof"
    # A test that proves a defect on some backends only is a guard on the
    # others (`guard_on=("jax",)`): stock is already right there.
    if marker and os.environ.get("KERAS_BACKEND") in marker.kwargs.get(
        "guard_on", ()
    ):
        role = "guard"
    if role not in ROLES:
        raise pytest.UsageError(f"{item.nodeid}: role {role!r} not in {ROLES}")
    return role


def pytest_collection_modifyitems(config, items):
    unmarked = [i.nodeid for i in items if _fix_of(i) is None]
    if unmarked:
        raise pytest.UsageError(
            f"proof tests must be marked @pytest.mark.fix(...): {unmarked}"
        )
    wanted = os.environ.get("PROOF_FIX")
    if not wanted:
        return
    keep = [i for i in items if _fix_of(i) == wanted]
    config.hook.pytest_deselected(
        items=[i for i in items if _fix_of(i) != wanted]
    )
    items[:] = keep


@pytest.fixture
def topology():
    """The ``devices.Topology`` of this process."""
    return devices.current()


@pytest.fixture(autouse=True)
def _fresh_keras_state(request, record_property):
    import keras

    record_property("fix", _fix_of(request.node))
    record_property("role", _role_of(request.node))
    keras.backend.clear_session()
    yield
    keras.backend.clear_session()
