"""The proof matrix: stock vs fork, per base x fix x backend x topology.

Each cell runs the fix's integration tests (``integration_tests/``, marked
``@pytest.mark.fix(id)``) twice, in two fresh processes that differ only in
which keras is first on ``PYTHONPATH``:

* ``stock``: the pristine sdist, ``pip install --no-deps --target``
  ``build/variants/<V>/stock``;
* ``fork``: the fork wheel, installed the same way into ``.../fork``.

Verdicts (the contract of ``dist/proof.json``):

* ``proven``: stock fails, fork passes;
* ``guard``: passes on both where the matrix says ``guard``;
* ``vacuous``: a cell the matrix says must be ``proven`` passes on stock;
* ``broken``: the fork fails (or a run could not execute at all);
* ``n/a``: not run, with the reason from the matrix.

A ``unit`` cell runs the upstream-style tests its fix's patches add: on
stock only those tests, on the fork every test file they touch. The fork's
unit runs are shared: one run per base and backend over the union of the
files, each cell reading its own files' results off it
(``shared_unit_tests``, ``cell_result``). Runs go ``--jobs`` at a time
(``default_jobs``: 2 on 2 or more cores, 1 on GPUs): the shared unit runs
first, then single-process runs, each in one slot, then multi-process runs,
each taking every slot (``Slots``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import as_completed
from pathlib import Path

from integration_tests import topologies
from keras_fork import pins
from keras_fork import sdist as sdist_lib
from keras_fork.errors import ForkError

MATRIX = pins.REPO_ROOT / "integration_tests" / "matrix.toml"
VARIANTS = ("stock", "fork")
EXPECTS = ("proven", "guard")
README_BEGIN = "<!-- proof-table:begin -->"
README_END = "<!-- proof-table:end -->"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One row of the matrix (both variants run in it)."""

    base: str
    fix: str
    issue: str
    backend: str
    topology: str
    expect: str  # "proven", "guard" or "n/a"
    reason: str = ""

    @property
    def key(self) -> tuple:
        return (self.base, self.fix, self.backend, self.topology)

    @property
    def slug(self) -> str:
        return f"{self.base}-{self.fix}-{self.backend}-{self.topology}"


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
    from keras_fork import series

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
        one of its cases failed, else ``pass``; ``shared`` names the run.
    """
    out = {
        "shared": shared_run["junit"],
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
# Written by keras_fork.prove: check which keras the unit run imports.
from integration_tests.conftest import pytest_configure  # noqa: F401
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


def load_matrix(path: Path = MATRIX) -> list[Cell]:
    """Reads ``matrix.toml`` into cells.

    A fix's ``cells`` hold for each of its ``bases``; a table
    ``[fixes.<id>.base_cells."<base>"]`` replaces some of them for that base
    (a fix proven on one base may only be guarded on another, where
    upstream already has it).

    Raises:
        ForkError: an unknown backend/topology, an invalid expectation, or
            ``base_cells`` for a base the fix does not list.
    """
    data = tomllib.loads(path.read_text())
    cells = []
    for fix, spec in data.get("fixes", {}).items():
        by_base = spec.get("base_cells", {})
        stray = sorted(set(by_base) - set(spec["bases"]))
        if stray:
            raise ForkError(
                f"{path}: {fix}: base_cells for {stray}, not in its bases "
                f"{spec['bases']}"
            )
        for base in spec["bases"]:
            table = {**spec.get("cells", {}), **by_base.get(base, {})}
            for where, expect in table.items():
                cells.append(_matrix_cell(path, base, fix, spec, where, expect))
    return cells


def _matrix_cell(path, base, fix, spec, where, expect) -> Cell:
    backend, _, topology = where.partition("/")
    reason = ""
    if expect.startswith("n/a"):
        expect, reason = "n/a", expect.partition(":")[2].strip()
        if not reason:
            raise ForkError(f"{path}: {fix} {where}: n/a needs a reason")
    elif expect not in EXPECTS:
        raise ForkError(
            f"{path}: {fix} {where}: expectation {expect!r} is not "
            f"one of {EXPECTS} or 'n/a: <reason>'"
        )
    elif not topologies.known(backend, topology):
        raise ForkError(
            f"{path}: {fix}: unknown cell {where}; known: "
            f"{sorted('/'.join(k) for k in topologies.TOPOLOGIES)}"
        )
    return Cell(
        base, fix, spec.get("issue", ""), backend, topology, expect, reason
    )


def select(cells: list[Cell], args) -> list[Cell]:
    """Cells matching every given filter (each filter: a list or None)."""

    def ok(value, wanted):
        return not wanted or value in wanted

    chosen = [
        c
        for c in cells
        if ok(c.base, args.base)
        and ok(c.fix, args.fix)
        and ok(c.backend, args.backend)
        and ok(c.topology, args.topology)
    ]
    if not chosen:
        raise ForkError("no matrix cell matches the filters")
    return chosen


def verdict(
    expect: str,
    stock: str | None,
    fork: str | None,
    stock_passed: tuple[str, ...] = (),
) -> str:
    """The cell verdict from the two variant outcomes.

    Args:
        expect: ``proven``, ``guard`` or ``n/a``.
        stock, fork: ``pass``, ``fail``, ``error`` or None (not run).
        stock_passed: the tests that passed on stock. In a ``proven`` cell
            every proving test must fail on stock: one that passes there is
            ``vacuous`` even when another test of the cell failed.
    """
    if expect == "n/a":
        return "n/a"
    if fork in ("fail", "error"):
        return "broken"
    if fork is None or stock is None:
        return "n/a"
    if stock == "error":
        return "broken"
    if stock == "fail":
        return "vacuous" if expect == "proven" and stock_passed else "proven"
    return "guard" if expect == "guard" else "vacuous"


def detect_accelerator() -> str:
    """``gpu`` when this process may use a GPU (``nvidia-smi -L`` lists
    one, and ``CUDA_VISIBLE_DEVICES`` does not hide them all), else
    ``cpu`` (``topologies.visible_gpus``)."""
    return "gpu" if topologies.visible_gpus() else "cpu"


def short_of_gpus(cells: list[Cell], gpus: int) -> list[Cell]:
    """The cells, where a topology needs more GPUs than the machine has
    turned ``n/a`` with the counts as the reason (a 1-GPU machine runs no
    multi-device cell: its replicas would share one GPU, which proves
    nothing about N devices).

    Args:
        cells: cells to run with ``--accelerator gpu``.
        gpus: GPUs this process may use (``topologies.visible_gpus``).

    Returns:
        The cells in the same order; cells already ``n/a`` keep their
        reason.
    """
    out = []
    for c in cells:
        why = topologies.gpu_shortfall(c.backend, c.topology, gpus)
        if c.expect != "n/a" and why:
            c = dataclasses.replace(c, expect="n/a", reason=why)
        out.append(c)
    return out


def install_variants(layout: pins.Layout, base: pins.Base) -> dict[str, Path]:
    """(Re)installs ``stock`` and ``fork`` keras of ``base`` side by side.

    Stock comes from the verified sdist, fork from the built wheel, both with
    ``pip install --no-deps --target`` so they share every other dependency.

    Raises:
        ForkError: the fork wheel is missing (run ``scripts/build``).
    """
    whl = layout.dist / base.wheel_name
    if not whl.is_file():
        raise ForkError(f"{whl} not found: run scripts/build first")
    sources = {
        "stock": sdist_lib.fetch(layout, base),
        "fork": whl,
    }
    return {
        variant: pip_install_target(
            layout.variant(base.version, variant),
            [str(source)],
            sdist_lib.sha256_of(source),
            f"{variant} keras {base.version}",
        )
        for variant, source in sources.items()
    }


def child_env(
    keras_dir: Path,
    overlay: Path | None = None,
    topology_env: dict[str, str] | None = None,
    *,
    with_repo: bool = True,
) -> dict[str, str]:
    """The environment of a child process that imports one keras variant.

    One rule for the proof cells (``run_variant``), the benchmarks
    (``bench._measure``) and the bisection (``bisect.check_prefix``), so
    that they see the same keras, overlay and devices. Starting from this
    process's environment:

    1. ``PROOF_*`` variables are dropped: they are the settings of one cell
       (``run_variant`` adds the child's own afterwards).
    2. ``XLA_FLAGS`` is dropped: a topology sets its own device count, and
       jax reads ``XLA_FLAGS`` once, when its backend starts, so it must be
       right in the child's initial environment
       (https://docs.jax.dev/en/latest/xla_flags.html).
    3. ``topology_env`` is added over it.
    4. ``PYTHONPATH`` is replaced by ``keras_dir``, ``overlay``, the
       repository root, in that order. ``PYTHONPATH`` entries come before
       site-packages on ``sys.path``
       (https://docs.python.org/3/using/cmdline.html#envvar-PYTHONPATH),
       so this keras shadows any installed one and the overlay shadows the
       virtual environment's packages.

    Args:
        keras_dir: where the keras variant is installed (a ``pip --target``
            folder).
        overlay: the base's test overlay (see ``install_overlay``), or
            ``None`` for none.
        topology_env: variables to set, e.g. ``topologies.env_for(...)``
            (backend, devices); ``None`` for none.
        with_repo: whether the repository root (``integration_tests``,
            ``keras_fork``) goes on ``PYTHONPATH``; the bisection, which runs
            upstream's own test files, leaves it out.

    Returns:
        A new dict, for ``subprocess``'s ``env``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOF_")}
    env.pop("XLA_FLAGS", None)
    env.update(topology_env or {})
    paths = [keras_dir, overlay, pins.REPO_ROOT if with_repo else None]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths if p)
    return env


def install_overlay(layout: pins.Layout, base: pins.Base) -> Path | None:
    """Installs ``base.test_overlay`` (e.g. an older jax) for its cells.

    The pins go, without their dependencies, into
    ``build/variants/<V>/overlay``, which the cells of that base put on
    ``PYTHONPATH`` after keras and before the venv, so they shadow the
    venv's newer versions of the same projects.

    Returns:
        The folder, or None when the base declares no overlay.

    Raises:
        ForkError: pip could not install a pin.
    """
    if not base.test_overlay:
        return None
    pins_text = "\n".join(sorted(base.test_overlay))
    return pip_install_target(
        layout.variant(base.version, "overlay"),
        list(base.test_overlay),
        hashlib.sha256(pins_text.encode()).hexdigest(),
        f"test overlay of {base.version}",
    )


def pip_install_target(dest: Path, sources: list[str], digest: str, what: str):
    """``pip install --no-deps --target dest`` unless already there.

    A stamp file holds ``digest`` (of what was installed); the install goes
    to a temporary sibling that replaces ``dest`` only when complete.
    """
    stamp = dest / ".source-sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
             "--no-build-isolation", "--disable-pip-version-check",
             "--target", str(tmp), *sources],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise ForkError(f"installing {what} failed:\n{proc.stderr[-2000:]}")
        (tmp / ".source-sha256").write_text(digest)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


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
    only the added tests, the fork run every touched test file. ``overlay``
    (the base's test overlay, see ``install_overlay``) follows keras on
    ``PYTHONPATH``.

    Returns:
        ``{"outcome": "pass"|"fail"|"error", "detail": str,
        "seconds": float, "junit": str, "counts": {...}}``. ``error`` means
        the process could not run the tests (crash, collection error, no
        test ran, or the ``timeout`` in seconds expired: the whole process
        group is then killed).
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
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
        "-rfE", f"--junitxml={junit}", "-o", "junit_family=xunit1",
        f"--timeout={int(timeout)}",
    ]  # fmt: skip
    cwd = pins.REPO_ROOT
    if unit is None:
        cmd.append("integration_tests")
    else:
        cwd = junit.with_suffix(".unit")
        _unit_workdir(cwd, unit)
        cmd += ["--rootdir", str(cwd), str(cwd)]
        if variant == "stock":
            cmd += ["-k", " or ".join(unit.names)]
    start = time.monotonic()
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
            code = proc.wait(timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    seconds = round(time.monotonic() - start, 1)
    result = read_junit(junit)
    counts = result.counts
    ran = counts.get("tests", 0) - counts.get("skipped", 0)
    if code is None:
        outcome, detail = "error", f"timed out after {timeout + 60:.0f}s"
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
        "junit": str(junit.relative_to(pins.REPO_ROOT))
        if junit.is_relative_to(pins.REPO_ROOT)
        else str(junit),
        "counts": counts,
        "passed_tests": [
            c["name"]
            for c in result.cases
            if c["outcome"] == "passed" and c["role"] == "proof"
        ],
    }


def _load_previous(path: Path) -> dict:
    try:
        cells = json.loads(path.read_text())["cells"]
    except (FileNotFoundError, KeyError, ValueError):
        return {}
    return {
        (c["base"], c["fix"], c["backend"], c["topology"]): c for c in cells
    }


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render_table(cells: list[dict]) -> str:
    """The proof table as markdown (one row a cell)."""
    lines = [
        "| base | fix | backend | topology | stock | fork | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        verdict_text = c["verdict"]
        if c["verdict"] == "n/a" and c.get("reason"):
            verdict_text = f"n/a ({c['reason']})"
        lines.append(
            f"| {c['base']} | {c['fix']} | {c['backend']} | {c['topology']} "
            f"| {c['stock'] or '-'} | {c['fork'] or '-'} | {verdict_text} |"
        )
    return "\n".join(lines) + "\n"


def replace_between(path: Path, begin: str, end: str, body: str) -> None:
    """Replaces the text between the marker lines ``begin`` and ``end`` of
    ``path`` (e.g. the README's proof table), atomically.

    Raises:
        ForkError: a marker is missing.
    """
    text = path.read_text()
    head, sep1, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not (sep1 and sep2):
        raise ForkError(f"{path} lacks the {begin} ... {end} markers")
    write_atomic(path, head + begin + "\n" + body + end + tail)


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


def main(args, layout: pins.Layout) -> int:
    """``scripts/prove``: runs the selected cells, writes dist/proof.*.

    Returns:
        0 when no selected cell is ``broken`` or ``vacuous``, else 1.
    """
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True, highlight=False)
    cells = select(load_matrix(), args)
    variants = args.variant or list(VARIANTS)
    accelerator = args.accelerator
    if accelerator == "auto":
        accelerator = detect_accelerator()
    if accelerator == "gpu":
        cells = short_of_gpus(cells, len(topologies.visible_gpus()))
    bases = {c.base: pins.get_base(layout, c.base) for c in cells}
    installed = {
        v: install_variants(layout, b) for v, b in bases.items()
    }  # base -> {variant: dir}
    overlays = {v: install_overlay(layout, b) for v, b in bases.items()}
    proof_json = layout.dist / "proof.json"
    previous = _load_previous(proof_json)
    results = dict(previous)
    units = {}
    for c in cells:
        if c.topology == topologies.UNIT and c.expect != "n/a":
            units[c.key] = unit_tests(layout, bases[c.base], c.fix)
    todo = [c for c in cells if c.expect != "n/a"]
    shared = shared_unit_tests(todo, units)
    junit_dir = layout.dist / "proof" / "junit"
    jobs = getattr(args, "jobs", None) or default_jobs(accelerator)
    slots = Slots(jobs)

    def run(cell: Cell, variant: str, unit: UnitTests | None, junit: Path):
        base = bases[cell.base]
        version = base.fork_version if variant == "fork" else base.version
        whole = (cell.backend, cell.topology) in topologies.MULTI_PROCESS
        with slots.hold(jobs if whole else 1):
            return run_variant(
                cell, variant, installed[cell.base][variant], version, junit,
                accelerator, args.timeout, unit, overlays[cell.base],
            )  # fmt: skip

    rows = {}
    for cell in cells:
        old = previous.get(cell.key, {})
        row = {
            "base": cell.base,
            "fix": cell.fix,
            "issue": cell.issue,
            "backend": cell.backend,
            "topology": cell.topology,
            "expect": cell.expect,
            "accelerator": accelerator,
            "stock": None,
            "fork": None,
            "reason": cell.reason,
            "runs": {},
        }
        unit = units.get(cell.key)
        if unit is not None and not unit.names:
            row["reason"] = "the fix's patches add no unit test"
        elif cell.expect != "n/a":
            for variant in VARIANTS:
                if variant not in variants:
                    # Keep the other variant's last result (if any).
                    row[variant] = old.get(variant)
                    if variant in old.get("runs", {}):
                        row["runs"][variant] = old["runs"][variant]
        rows[cell.key] = row
    # Every run, longest first: the shared unit runs, then the cells' runs
    # in matrix order (a unit cell's fork result is read off its shared run).
    plan = []  # (label, cell, variant, unit, junit)
    if "fork" in variants:
        for (version, backend), group in shared.items():
            first = next(
                c for c in todo
                if (c.base, c.backend) == (version, backend)
                and units.get(c.key) is not None
            )  # fmt: skip
            label = f"{version}-unit-{backend} fork (shared)"
            junit = junit_dir / f"{version}-unit-{backend}-fork.xml"
            plan.append((label, first, "fork", group, junit))
    # Multi-process runs last: each waits for every slot, so among
    # single-process runs it would leave a slot idle while the others drain.
    for cell in sorted(
        todo,
        key=lambda c: (c.backend, c.topology) in topologies.MULTI_PROCESS,
    ):
        unit = units.get(cell.key)
        if unit is not None and not unit.names:
            continue
        for variant in variants:
            if unit is not None and variant == "fork":
                continue
            junit = junit_dir / f"{cell.slug}-{variant}.xml"
            plan.append((f"{cell.slug} {variant}", cell, variant, unit, junit))
    shared_runs = {}  # (base, backend) -> the fork's shared unit run
    with (
        Progress(console=console, transient=False) as progress,
        ThreadPoolExecutor(jobs) as pool,
    ):
        task = progress.add_task("proof matrix", total=len(plan))
        futures = {
            pool.submit(run, cell, variant, unit, junit): (
                label, cell, variant, unit
            )
            for label, cell, variant, unit, junit in plan
        }  # fmt: skip
        try:
            for future in as_completed(futures):
                label, cell, variant, unit = futures[future]
                result = future.result()
                if label.endswith("(shared)"):
                    shared_runs[(cell.base, cell.backend)] = result
                    detail = (
                        f"{len(unit.files)} test files of the unit cells; "
                        f"{result['detail']}"
                    )
                else:
                    row = rows[cell.key]
                    row[variant] = result["outcome"]
                    row["runs"][variant] = result
                    detail = result["detail"]
                progress.advance(task)
                style = "green" if result["outcome"] == "pass" else "red"
                console.print(
                    f"{label}: [{style}]{result['outcome']}[/] "
                    f"({result['seconds']}s) {detail}"
                )
        except BaseException:
            for f in futures:
                f.cancel()  # what has not started yet
            raise
    for cell in cells:
        row = rows[cell.key]
        unit = units.get(cell.key)
        group = (cell.base, cell.backend)
        if unit is not None and group in shared_runs and unit.names:
            fork = cell_result(shared_runs[group], unit)
            row["fork"] = fork["outcome"]
            row["runs"]["fork"] = fork
            style = "green" if fork["outcome"] == "pass" else "red"
            console.print(
                f"{cell.slug} fork: [{style}]{fork['outcome']}[/] "
                f"(shared run) {fork['detail']}"
            )
        stock_run = row["runs"].get("stock", {})
        # Upstream-style unit tests carry no proof/guard roles: a patch's
        # tests may include regression guards that pass on stock, so a
        # unit cell is proven when any of its added tests fails there.
        stock_passed = (
            () if unit is not None else tuple(stock_run.get("passed_tests", ()))
        )
        row["verdict"] = verdict(
            cell.expect, row["stock"], row["fork"], stock_passed
        )
        if row["verdict"] == "n/a" and not row["reason"]:
            row["reason"] = "a variant was not run"
        results[cell.key] = row
    known = {c.key for c in load_matrix()}
    rows = [r for k, r in sorted(results.items()) if k in known]
    write_atomic(proof_json, json.dumps({"cells": rows}, indent=2) + "\n")
    table = render_table(rows)
    write_atomic(layout.dist / "proof.md", "# Proof matrix\n\n" + table)
    from rich.table import Table

    t = Table(title="proof matrix (dist/proof.json)")
    for col in ("base", "fix", "backend", "topology", "stock", "fork",
                "verdict"):  # fmt: skip
        t.add_column(col)
    colors = {"proven": "green", "guard": "cyan", "n/a": "dim"}
    for r in rows:
        color = colors.get(r["verdict"], "bold red")
        t.add_row(r["base"], r["fix"], r["backend"], r["topology"],
                  r["stock"] or "-", r["fork"] or "-",
                  f"[{color}]{r['verdict']}[/]")  # fmt: skip
    Console(highlight=False).print(t)
    if args.readme:
        device = "GPU" if accelerator == "gpu" else "CPU"
        replace_between(
            layout.dist.parent / "README.md",
            README_BEGIN,
            README_END,
            f"_Measured on {device}._\n\n{table}",
        )
    # Refresh the PR bodies with the new proof rows.
    from keras_fork import prseries

    for base in bases.values():
        tree = layout.tree(base.version)
        if prseries.pr_series_dir(layout, base).is_dir() and tree.is_dir():
            prseries.write(layout, base, tree)
    ran = [results[c.key] for c in cells]
    bad = [r for r in ran if r["verdict"] in ("broken", "vacuous")]
    for r in bad:
        why = "; ".join(f"{v}: {run['detail']}" for v, run in r["runs"].items())
        stock_passed = r["runs"].get("stock", {}).get("passed_tests")
        if r["verdict"] == "vacuous" and stock_passed:
            why = f"passes on stock: {', '.join(stock_passed)}"
        console.print(
            f"[bold red]{r['verdict']}[/]: {r['base']} {r['fix']} "
            f"{r['backend']}/{r['topology']}: {why}"
        )
    # A plain closing line for CI log readers: cells, not tests.
    good = sum(r["verdict"] in ("proven", "guard") for r in ran)
    skipped = sum(r["verdict"] == "n/a" for r in ran)
    print(f"proof: {good} passed, {len(bad)} failed, {skipped} skipped")
    return 1 if bad else 0


def add_parser(sub):
    """The ``prove`` subcommand and its filters."""
    p = sub.add_parser("prove", help="run the stock-vs-fork proof matrix")
    for name in ("base", "fix", "backend", "topology"):
        p.add_argument(f"--{name}", action="append", help=f"only this {name}")
    p.add_argument("--variant", action="append", choices=VARIANTS)
    p.add_argument(
        "--jobs",
        type=int,
        choices=range(1, 9),
        metavar="{1..8}",
        help="runs at the same time (default: 1 on GPUs, where each run "
        "takes every GPU; else 2 on 2 or more cores); a multi-process run "
        "takes all of them",
    )
    p.add_argument(
        "--accelerator", choices=("auto", "cpu", "gpu"), default="auto"
    )
    p.add_argument(
        "--timeout", type=float, default=600, help="per-test seconds"
    )
    p.add_argument(
        "--readme", action="store_true", help="refresh README's proof table"
    )
    return p
