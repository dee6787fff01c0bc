"""The pytest process of one run of the proof matrix, and what it says.

A run is a ``groups.Group``: every selected cell of one base, variant,
backend and topology in one process (``run_group``). An integration run
collects its cells' fix folders, ``integration_tests/fixes/<id>/``, with
``PROOF_FIX`` naming them; a ``unit`` run copies the touched upstream test
files into a folder of its own, and on stock keeps only the added tests
(``PROOF_UNIT_TESTS``, by exact name). Each test has ``--timeout`` seconds
(pytest-timeout fails it and the run goes on); a run that writes no
progress (``harness.progress``) for ``timeout`` plus a grace period is hung
and its process group is killed. Runs go ``--jobs`` at a time
(``harness.schedule``: 2 on 2 or more cores, 1 on GPUs); a multi-process
run holds every slot.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

from integration_tests.harness import plugin
from integration_tests.harness import progress as progress_plugin
from integration_tests.harness import run
from integration_tests.harness import selection
from integration_tests.harness.junit import read_junit
from keras_fork.errors import ForkError
from keras_fork.proof import groups
from keras_fork.proof.cells import Cell
from keras_fork.proof.cells import device_topology
from keras_fork.proof.groups import Group
from keras_fork.proof.groups import UnitTests
from keras_fork.proof.variants import child_env
from keras_fork.recipe import pins

# Seconds a run may go without progress beyond the per-test timeout before
# it is killed: a test's set-up and teardown, or the imports and collection
# before the first test.
GRACE = 60.0

# Upstream test files whose whole run on the fork, the unit cells' check
# that upstream's own tests still pass, is left to one backend: on the
# others the fork runs the tests the patches add to them, as on stock
# (trainer_test.py's whole run costs most on TensorFlow and torch:
# docs/test-run.md). Its whole file still runs on JAX here, and on every
# backend with ``python -m keras_fork regressions`` and ``bisect
# --whole-files``.
WHOLE_ON = {"trainer_test.py": ("jax",)}


def _unit_selection(group: Group) -> dict[str, str]:
    """The environment that picks a unit run's tests
    (``selection.KERAS_TESTS_PLUGIN``):
    on stock the added tests of every file; on the fork every test, but
    for the files of ``WHOLE_ON`` on other backends, where the added tests
    only."""
    names = group.unit.names
    if group.variant == "stock":
        return selection.added_tests_env(names)
    only = sorted(
        f.name
        for f in group.unit.files
        if f.name in WHOLE_ON and group.backend not in WHOLE_ON[f.name]
    )
    if not only:
        return {}
    return selection.added_tests_env(names, only)


def _unit_workdir(workdir: Path, unit: UnitTests) -> None:
    """Lays out a unit run's folder: each touched test file in a package
    named after its folder in the tree (``groups.unit_file_label``), so
    that pytest imports two files of one name as different modules (the
    tests are selected by ``selection.KERAS_TESTS_PLUGIN``)."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    for f in unit.files:
        dest = workdir / groups.unit_file_label(f)
        if dest.exists():
            raise ForkError(f"two unit test files at {dest}")
        dest.parent.mkdir(exist_ok=True)
        (dest.parent / "__init__.py").touch()
        shutil.copyfile(f, dest)
    (workdir / "pytest.ini").write_text("[pytest]\n")


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a run's keras and tests come from.

    Attributes:
        keras_dir: the variant's keras (a ``pip --target`` folder).
        keras_version: the version that keras must report.
        overlay: the base's test overlay, or None.
        fixes: the folder of the fix folders (``pins.Layout.fixes``).
        root: the layout's root (``pins.Layout.root``): a run's result
            names its files relative to it.
        accelerator: ``cpu`` or ``gpu``.
        extra_env: variables every process of the run gets besides its
            topology's (``variants.compile_cache_env``).
    """

    keras_dir: Path
    keras_version: str
    overlay: Path | None
    fixes: Path
    root: Path
    accelerator: str = "cpu"
    extra_env: tuple[tuple[str, str], ...] = ()


def run_group(
    group: Group, where: Where, junit: Path, timeout: float, grace=None
) -> dict:
    """Runs ``group`` in a fresh pytest process.

    Args:
        group: the cells and variant to run.
        where: the keras variant and the fix folders.
        junit: the JUnit file to write; the log goes beside it (``.log``),
            and so does the progress file (``.progress``).
        timeout: seconds a test may take (pytest-timeout).
        grace: seconds more, without progress, before the run is killed
            (default ``GRACE``).

    Returns:
        ``{"outcome": "pass"|"fail"|"error", "detail": str,
        "seconds": float, "junit": str, "log": str, "counts": {...},
        "passed_tests": [...], "unfinished": nodeid or None}``. ``error``
        means the process could not run the tests (crash, collection
        error, no test ran, or killed for want of progress); then
        ``unfinished`` names the test it was in, if any.
    """
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    log, progress = junit.with_suffix(".log"), junit.with_suffix(".progress")
    progress.unlink(missing_ok=True)
    topology_env = run.fixes_env(
        group.backend,
        device_topology(group.topology),
        where.accelerator,
        group.fixes,
        progress,
        group.base,
    )
    env = child_env(
        where.keras_dir,
        where.overlay,
        {**dict(where.extra_env), **topology_env},
    )
    env[plugin.KERAS_DIR_ENV] = str(where.keras_dir)
    env[plugin.KERAS_VERSION_ENV] = where.keras_version
    unit = group.unit
    if unit is not None:
        env.update(_unit_selection(group))
    cmd, cwd = _pytest_command(group, unit, where.fixes, junit, timeout)
    grace = GRACE if grace is None else grace
    start = time.monotonic()
    code = run.run_bounded(cmd, cwd, env, log, timeout + grace, progress)
    seconds = round(time.monotonic() - start, 1)
    result = _run_result(junit, log, code, timeout + grace, seconds, where.root)
    if result["outcome"] == "error":
        result["unfinished"] = progress_plugin.unfinished(progress)
    return result


def run_variant(
    cell: Cell,
    variant: str,
    keras_dir: Path,
    keras_version: str,
    junit: Path,
    accelerator: str,
    timeout: float,
    layout: pins.Layout,
    unit: UnitTests | None = None,
    overlay: Path | None = None,
) -> dict:
    """Runs one variant of one cell alone (``run_group`` of a one-cell
    group, the fix folders of ``layout``)."""
    group = Group(
        cell.base,
        variant,
        cell.backend,
        cell.topology,
        (cell,),
        (unit,) if unit is not None else (),
    )
    where = Where(
        keras_dir,
        keras_version,
        overlay,
        layout.fixes,
        layout.root,
        accelerator,
    )
    return run_group(group, where, junit, timeout)


def _pytest_command(group: Group, unit, fixes: Path, junit, timeout):
    """The pytest command line of one run (``unit``: ``group.unit``), and
    its working folder (``run.pytest_command``)."""
    if unit is None:
        folders = {run.fix_folder(fixes, fix) for fix in group.fixes}
        paths = sorted(folders)
        return run.pytest_command(paths, junit, timeout), pins.CODE_ROOT
    cwd = junit.with_suffix(".unit")
    _unit_workdir(cwd, unit)
    plugins = [selection.KERAS_TESTS_PLUGIN]
    cmd = run.pytest_command([cwd], junit, timeout, plugins, rootdir=cwd)
    return cmd, cwd


def _run_result(junit, log, code, limit, seconds, root: Path) -> dict:
    """``run_group``'s result from the exit status and the JUnit file."""
    result = read_junit(junit)
    counts = result.counts
    ran = counts.get("tests", 0) - counts.get("skipped", 0)
    if code is None:
        outcome = "error"
        detail = f"killed after {limit:.0f}s without progress"
    elif code == 0 and ran > 0:
        outcome, detail = "pass", f"{ran} passed"
    elif code == 1 and counts.get("failures", 0) + counts.get("errors", 0):
        outcome, detail = "fail", result.first_failure
    else:
        tail = log.read_text().strip().splitlines()[-3:]
        outcome = "error"
        detail = f"pytest exit {code}, {ran} test(s) ran: {' | '.join(tail)}"
    return {
        "outcome": outcome,
        "detail": detail,
        "seconds": seconds,
        "junit": _relative(junit, root),
        "log": _relative(log, root),
        "counts": counts,
        "passed_tests": [
            c["name"]
            for c in result.cases
            if c["outcome"] == "passed" and c["role"] == "proof"
        ],
    }


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root) if path.is_relative_to(root) else path)


def load_previous(path: Path) -> dict:
    """The rows of an earlier ``proof.json`` by cell key (empty when there
    is none or it is unreadable)."""
    try:
        cells = json.loads(path.read_text())["cells"]
    except (FileNotFoundError, KeyError, ValueError):
        return {}
    return {
        (c["base"], c["fix"], c["backend"], c["topology"]): c for c in cells
    }
