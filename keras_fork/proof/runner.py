"""One pytest run of one variant of one proof cell, and what its JUnit
file says.

A cell's run collects its fix's folder, ``integration_tests/fixes/<id>/``,
with ``PROOF_FIX`` set (the suite's conftest keeps only that fix's tests). A
``unit`` cell runs the upstream-style tests its fix's patches add: on stock
only those tests, on the fork every test file they touch. The fork's unit
runs are shared: one run per base and backend over the union of the files,
each cell reading its own files' results off it (``shared_unit_tests``,
``cell_result``). Runs go ``--jobs`` at a time (``default_jobs``: 2 on 2 or
more cores, 1 on GPUs); a multi-process run takes every slot (``Slots``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from integration_tests.harness import topologies
from keras_fork.errors import ForkError
from keras_fork.proof.fixes import Cell
from keras_fork.proof.variants import child_env
from keras_fork.recipe import pins


@dataclasses.dataclass(frozen=True)
class UnitTests:
    """The upstream-style unit tests a fix's patches add.

    Attributes:
        files: the touched ``*_test.py`` files, in the materialized tree.
        names: the added test functions (``test_...``).
    """

    files: tuple[Path, ...]
    names: tuple[str, ...]


def unit_tests(layout: pins.Layout, base: pins.Base, fix: str) -> UnitTests:
    """Collects the unit tests added by the patches marked ``Fork-Fix: fix``
    in the series of ``base`` (files from ``build/trees/<version>``)."""
    from keras_fork.recipe import series

    files, names = [], []
    for patch in series.read_series(layout, base):
        info = series.parse_patch(patch)
        if info.fix != fix:
            continue
        for test in info.added_tests():
            path, _, name = test.partition("::")
            f = layout.tree(base.version) / path
            if f not in files:
                files.append(f)
            names.append(name)
    return UnitTests(tuple(files), tuple(dict.fromkeys(names)))


def shared_unit_tests(
    cells: list[Cell], units: dict[tuple, UnitTests]
) -> dict[tuple, UnitTests]:
    """The fork's unit tests, grouped into one run per base and backend.

    The fork variant of a unit cell runs every test file its fix's patches
    touch, and most fixes share files (a tensorflow fix usually adds its
    tests to ``distribute_test.py``). On one fork tree those runs would
    repeat the same tests, so the fork runs the union of the files once per
    (base, backend) and each cell reads its own files' cases off that run
    (``cell_result``). Stock runs stay per cell: they select the cell's
    added tests only.

    Returns:
        ``{(base, backend): UnitTests}``: the union of the files (in first
        seen order) and of the added test names of the unit cells.
    """
    shared = {}
    for cell in cells:
        unit = units.get(cell.key)
        if unit is None or not unit.names:
            continue
        key = (cell.base, cell.backend)
        files, names = shared.get(key, ((), ()))
        files += tuple(f for f in unit.files if f not in files)
        names += tuple(n for n in unit.names if n not in names)
        shared[key] = (files, names)
    return {k: UnitTests(f, n) for k, (f, n) in shared.items()}


def cell_result(shared_run: dict, unit: UnitTests) -> dict:
    """One unit cell's fork result, read off the shared run of its backend.

    Args:
        shared_run: ``run_variant``'s result for the union of the files.
        unit: the cell's own files and added tests.

    Returns:
        A ``run_variant``-shaped dict for the cell's files only: ``error``
        when the shared run could not run the tests (crash, timeout,
        collection error) or none of the cell's tests ran, ``fail`` when
        one of its cases failed, else ``pass``; ``shared`` names the run
        and ``shared_seconds`` is its wall time.
    """
    out = {
        "shared": shared_run["junit"],
        "shared_seconds": shared_run.get("seconds", 0.0),
        "seconds": 0.0,
        "junit": shared_run["junit"],
        "passed_tests": [],
    }
    if shared_run["outcome"] == "error":
        return dict(out, outcome="error", detail=shared_run["detail"],
                    counts=shared_run["counts"])  # fmt: skip
    mine = {f.name for f in unit.files}
    junit = pins.REPO_ROOT / shared_run["junit"]
    cases = [c for c in read_junit(junit).cases if Path(c["file"]).name in mine]
    bad = [c for c in cases if c["outcome"] in ("failure", "error")]
    skipped = sum(c["outcome"] == "skipped" for c in cases)
    counts = {
        "tests": len(cases),
        "failures": sum(c["outcome"] == "failure" for c in cases),
        "errors": sum(c["outcome"] == "error" for c in cases),
        "skipped": skipped,
    }
    ran = len(cases) - skipped
    if bad:
        outcome = "fail"
        detail = f"{bad[0]['name']}: {bad[0]['outcome']} (see the shared run)"
    elif ran:
        outcome, detail = "pass", f"{ran} passed"
    else:
        outcome, detail = "error", "none of the cell's tests ran"
    return dict(out, outcome=outcome, detail=detail, counts=counts)


UNIT_CONFTEST = """\
# Written by keras_fork.proof.runner: check which keras the unit run imports.
from integration_tests.harness.plugin import pytest_configure  # noqa: F401
"""


def _unit_workdir(workdir: Path, unit: UnitTests) -> None:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    for f in unit.files:
        if (workdir / f.name).exists():
            raise ForkError(f"two unit test files named {f.name}")
        shutil.copyfile(f, workdir / f.name)
    (workdir / "pytest.ini").write_text("[pytest]\n")
    (workdir / "conftest.py").write_text(UNIT_CONFTEST)


@dataclasses.dataclass(frozen=True)
class JUnitResult:
    """What a run's JUnit (xunit1) file says, read in one pass.

    ``counts``: the suite's tests, failures, errors and skipped (empty when
    the file is missing or unreadable); ``cases``: name, file (as pytest
    reports it, relative to the rootdir), outcome
    (passed/failure/error/skipped) and role (``proof`` unless the test's
    marker says otherwise) of each test case; ``first_failure``: "name:
    first message line" of the first failed or erroring case, or "".
    """

    counts: dict
    cases: list
    first_failure: str


def read_junit(path: Path) -> JUnitResult:
    """Parses ``path`` once; see ``JUnitResult``."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return JUnitResult({}, [], "")
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {}
    if suite is not None:
        keys = ("tests", "failures", "errors", "skipped")
        counts = {k: int(suite.get(k, 0)) for k in keys}
    cases, first_failure = [], ""
    for case in root.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is None:
                continue
            outcome = tag
            if tag != "skipped" and not first_failure:
                lines = (node.get("message") or "").splitlines()
                msg = next((ln.strip() for ln in lines if ln.strip()), tag)
                first_failure = f"{case.get('name')}: {msg}"[:300]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases.append(
            {
                "name": case.get("name"),
                "file": case.get("file") or "",
                "outcome": outcome,
                "role": props.get("role", "proof"),
            }
        )
    return JUnitResult(counts, cases, first_failure)


def run_variant(
    cell: Cell,
    variant: str,
    keras_dir: Path,
    keras_version: str,
    junit: Path,
    accelerator: str,
    timeout: float,
    unit: UnitTests | None = None,
    overlay: Path | None = None,
) -> dict:
    """Runs one variant of one cell in a fresh pytest process.

    For a ``unit`` cell, ``unit`` names the tests: the stock run selects
    only the added tests, the fork run every touched test file. Otherwise
    the run collects the fix's folder, ``integration_tests/fixes/<id>/``.
    ``overlay`` (the base's test overlay, see ``install_overlay``) follows
    keras on ``PYTHONPATH``.

    Returns:
        ``{"outcome": "pass"|"fail"|"error", "detail": str,
        "seconds": float, "junit": str, "counts": {...}}``. ``error`` means
        the process could not run the tests (crash, collection error, no
        test ran, or the ``timeout`` in seconds per test expired: the whole
        process group is killed 60 s after it).
    """
    env = child_env(
        keras_dir,
        overlay,
        topologies.env_for(cell.backend, cell.topology, accelerator),
    )
    env.update(
        PROOF_FIX=cell.fix,
        PROOF_BASE=cell.base,
        PROOF_VARIANT=variant,
        PROOF_KERAS_DIR=str(keras_dir),
        PROOF_KERAS_VERSION=keras_version,
        PYTHONDONTWRITEBYTECODE="1",
    )
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    log = junit.with_suffix(".log")
    cmd, cwd = _pytest_command(cell, variant, junit, timeout, unit)
    start = time.monotonic()
    code = run_bounded(cmd, cwd, env, log, timeout + 60)
    seconds = round(time.monotonic() - start, 1)
    return _run_result(junit, log, code, timeout + 60, seconds)


def _pytest_command(cell, variant, junit, timeout, unit):
    """The pytest command line of one run, and its working folder."""
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
        "-rfE", f"--junitxml={junit}", "-o", "junit_family=xunit1",
        f"--timeout={int(timeout)}",
    ]  # fmt: skip
    if unit is None:
        folder = Path("integration_tests", "fixes", cell.fix.replace("-", "_"))
        return cmd + [str(folder)], pins.REPO_ROOT
    cwd = junit.with_suffix(".unit")
    _unit_workdir(cwd, unit)
    cmd += ["--rootdir", str(cwd), str(cwd)]
    if variant == "stock":
        cmd += ["-k", " or ".join(unit.names)]
    return cmd, cwd


def run_bounded(cmd, cwd, env, log: Path, limit: float) -> int | None:
    """Runs ``cmd`` in its own session with its output in ``log``.

    Returns:
        The exit status, or None when it ran past ``limit`` seconds: its
        whole process group is then killed (SIGKILL) and reaped.
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


def _run_result(junit, log, code, limit, seconds) -> dict:
    """``run_variant``'s result from the exit status and the JUnit file."""
    result = read_junit(junit)
    counts = result.counts
    ran = counts.get("tests", 0) - counts.get("skipped", 0)
    if code is None:
        outcome, detail = "error", f"timed out after {limit:.0f}s"
    elif code == 0 and ran > 0:
        outcome, detail = "pass", f"{ran} passed"
    elif code == 1 and counts.get("failures", 0) + counts.get("errors", 0):
        outcome, detail = "fail", result.first_failure
    else:
        tail = log.read_text().strip().splitlines()[-3:]
        outcome = "error"
        detail = f"pytest exit {code}, {ran} test(s) ran: {' | '.join(tail)}"
    root = pins.REPO_ROOT
    return {
        "outcome": outcome,
        "detail": detail,
        "seconds": seconds,
        "junit": str(junit.relative_to(root))
        if junit.is_relative_to(root)
        else str(junit),
        "counts": counts,
        "passed_tests": [
            c["name"]
            for c in result.cases
            if c["outcome"] == "passed" and c["role"] == "proof"
        ],
    }


def default_jobs(accelerator: str) -> int:
    """Runs at the same time: 1 on GPUs (each run uses every GPU: two would
    compete for their memory), else 2 where there are 2 or more cores (one
    pytest process mostly keeps one core busy)."""
    if accelerator == "gpu":
        return 1
    return 2 if (os.cpu_count() or 1) >= 2 else 1


class Slots:
    """``n`` run slots: a single-process run holds 1, a multi-process run
    (its workers need every core) holds all ``n``.

    Fair to multi-process runs: once one waits, no new single-process run
    starts, so the running ones drain and it gets every slot (a plain
    semaphore would let single-process runs take each freed slot first and
    leave the other slots idle behind the waiting run).
    """

    def __init__(self, n: int):
        self.n = n
        self.free = n
        self.waiting_whole = 0
        self._cv = threading.Condition()

    def can_take(self, k: int) -> bool:
        """Whether a run needing ``k`` slots may start now."""
        if k >= self.n:
            return self.free == self.n
        return self.free >= k and not self.waiting_whole

    @contextlib.contextmanager
    def hold(self, k: int):
        k = min(k, self.n)
        with self._cv:
            whole = k == self.n and self.n > 1
            self.waiting_whole += whole
            self._cv.notify_all()
            self._cv.wait_for(lambda: self.can_take(k))
            self.waiting_whole -= whole
            self.free -= k
        try:
            yield
        finally:
            with self._cv:
                self.free += k
                self._cv.notify_all()


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
