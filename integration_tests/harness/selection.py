"""Which proof tests a run collects, and what each case records.

Every proof test is marked ``@pytest.mark.fix("<fix id>")``, optionally with
``role="guard"`` (or ``guard_on=(backends)``: a guard on those backends
only). The runner sets ``PROOF_FIX`` to the fixes of its run, comma
separated (one process runs every selected fix of one base, variant,
backend and topology); only their tests are collected. Each case records
its ``fix`` and ``role`` as JUnit properties (at collection, so that a
case skipped there has them too), from which the runner gives every cell
its own result. Imports no backend, so that the runner's own
tests can use it with fake fixes.
"""

from __future__ import annotations

import json
import os

import pytest

from .markers import NOT_ON_BASE

ROLES = ("proof", "guard")
ENV = "PROOF_FIX"
# The base whose cells a run runs (``run.fixes_env``; ``role_of``).
BASE_ENV = "PROOF_BASE"

# The pytest plugin of every run of Keras's own test files from an sdist
# (its docstring says what it does); by name, since importing it imports
# torch.
KERAS_TESTS_PLUGIN = __name__.rpartition(".")[0] + ".keras_tests"
ADDED_TESTS_ENV = "PROOF_UNIT_TESTS"
ADDED_ONLY_ENV = "PROOF_UNIT_ADDED_ONLY"


def added_tests_env(names, only_in=None) -> dict[str, str]:
    """The environment with which ``KERAS_TESTS_PLUGIN`` keeps only the tests
    ``names`` (test function names; ``is_added_test``): in every file, or
    in the files named ``only_in`` (file names) only, the others whole."""
    env = {ADDED_TESTS_ENV: json.dumps(sorted(names))}
    if only_in is not None:
        env[ADDED_ONLY_ENV] = json.dumps(sorted(only_in))
    return env


def fix_of(item) -> str | None:
    """The fix id of a test item's ``fix`` marker, or None."""
    marker = item.get_closest_marker("fix")
    return marker.args[0] if marker and marker.args else None


def role_of(item) -> str:
    """``proof`` or ``guard``: a test that proves a defect on some backends
    only (``guard_on=("jax",)``) is a guard on those, where stock is
    already right; one whose defect upstream fixed in version V
    (``guard_since="V"``, or ``{"<backend>": "V"}`` where upstream fixed it
    on some backends only) is a guard on the bases from V on (the base is
    ``PROOF_BASE``, compared as PEP 440 versions).

    Raises:
        pytest.UsageError: the marker names a role not in ``ROLES``.
    """
    marker = item.get_closest_marker("fix")
    role = marker.kwargs.get("role", "proof") if marker else "proof"
    if marker and os.environ.get("KERAS_BACKEND") in marker.kwargs.get(
        "guard_on", ()
    ):
        role = "guard"
    since = marker.kwargs.get("guard_since") if marker else None
    if isinstance(since, dict):
        since = since.get(os.environ.get("KERAS_BACKEND"))
    if _at_or_after(since):
        role = "guard"
    if role not in ROLES:
        raise pytest.UsageError(f"{item.nodeid}: role {role!r} not in {ROLES}")
    return role


def absent_reason(item) -> str | None:
    """Why a test does not apply to the base under test, or None.

    ``absent_since={"<backend>": ("V", "why")}``: from base V on, on that
    backend, the fork does not carry what the test checks (e.g. the master
    series leaves it to a design issue), so the case is skipped at
    collection (``markers.NOT_ON_BASE``: why) rather than reported
    broken; a fix's other tests still decide its cell.
    ``absent_before={"<backend>": ("V", "why")}``: the same on the bases
    before V (what the test relies on came with V, e.g. a master feature).
    Without ``PROOF_BASE`` (a plain ``pytest`` run) the test runs.
    """
    marker = item.get_closest_marker("fix")
    backend = os.environ.get("KERAS_BACKEND")
    since = marker.kwargs.get("absent_since", {}) if marker else {}
    version, why = since.get(backend, (None, None))
    if _at_or_after(version):
        return why
    before = marker.kwargs.get("absent_before", {}) if marker else {}
    version, why = before.get(backend, (None, None))
    if version and os.environ.get(BASE_ENV) and not _at_or_after(version):
        return why
    return None


def _at_or_after(version: str | None) -> bool:
    """Whether the base under test (``PROOF_BASE``) is ``version`` or
    later; False without either."""
    from packaging.version import Version

    base = os.environ.get(BASE_ENV)
    return bool(version and base) and Version(base) >= Version(version)


def wanted_fixes() -> set[str] | None:
    """The fixes named by ``PROOF_FIX`` (comma separated), or None for
    every fix."""
    value = os.environ.get(ENV, "")
    names = {n.strip() for n in value.split(",") if n.strip()}
    return names or None


def pytest_collection_modifyitems(config, items):
    """Keeps the tests of the fixes ``PROOF_FIX`` names (every fix without
    it) and the equivalence suite's (marked ``equivalence``: they prove no
    fix, and run only where their folder is named), and records each
    fix test's properties.

    Raises:
        pytest.UsageError: a test with neither marker.
    """
    suite = [i for i in items if i.get_closest_marker("equivalence")]
    if suite:
        items[:] = [i for i in items if i not in suite]
        _select_fix_tests(config, items)
        items.extend(suite)
        return
    _select_fix_tests(config, items)


def _select_fix_tests(config, items):
    unmarked = [i.nodeid for i in items if fix_of(i) is None]
    if unmarked:
        raise pytest.UsageError(
            f"proof tests must be marked @pytest.mark.fix(...): {unmarked}"
        )
    wanted = wanted_fixes()
    if wanted is not None:
        config.hook.pytest_deselected(
            items=[i for i in items if fix_of(i) not in wanted]
        )
        items[:] = [i for i in items if fix_of(i) in wanted]
    for item in items:
        record_properties(item)
        why = absent_reason(item)
        if why:
            item.add_marker(pytest.mark.skip(reason=f"{NOT_ON_BASE}: {why}"))


def record_properties(item) -> None:
    """Records the case's ``fix`` and ``role`` as JUnit properties, as
    ``record_property`` would, but at collection: also a case skipped
    before its fixtures (a ``topology`` marker's skip) carries them.

    Raises:
        pytest.UsageError: the marker names a role not in ``ROLES``.
    """
    item.user_properties.append(("fix", fix_of(item)))
    item.user_properties.append(("role", role_of(item)))


def skip_multi_device(items, several: bool | None = None) -> None:
    """Skips the Keras unit tests marked ``multi_device`` unless the
    backend sees several devices, as Keras's repository ``conftest.py``
    (which the sdist lacks) does: the unit cells run upstream's test
    files on one device (``keras_fork.proof.runner``).

    Args:
        items: the collected items.
        several: whether the backend sees several devices; None: ask the
            backend (``KERAS_BACKEND``: jax's device count, torch's CUDA
            devices, one elsewhere).
    """
    marked = [i for i in items if "multi_device" in i.keywords]
    if not marked:
        return
    if several is None:
        backend = os.environ.get("KERAS_BACKEND")
        if backend == "jax":
            import jax

            several = jax.device_count() > 1
        elif backend == "torch":
            import torch

            several = torch.cuda.device_count() > 1
        else:
            several = False
    if not several:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason="needs several devices"))


def is_added_test(name: str, added: set[str] | tuple[str, ...]) -> bool:
    """Whether the collected test ``name`` is one of the ``added`` test
    functions (as a patch's diff names them) or a parameterized case of
    one: pytest's ``test_x[...]``, absl's ``named_parameters``
    ``test_x_<name>`` and ``parameters`` ``test_x<index>``. Unlike ``-k``,
    which matches any substring, ``test_x`` never selects ``other_test_x``.
    """
    base = name.split("[")[0]
    for n in added:
        rest = base[len(n) :] if base.startswith(n) else None
        if rest is not None and (
            rest == "" or rest[0] == "_" or rest[0].isdigit()
        ):
            return True
    return False
