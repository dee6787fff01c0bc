"""``verify``: every fix's tests against whichever keras is importable, on
every topology this machine can form.

For a CI team, a maintainer checking a branch, or a user checking a pin:
the keras that ``python -c "import keras"`` finds here (a release, a
nightly, a fork wheel, an editable checkout) is run through the fix tests
of this package, one pytest process per backend and topology
(``harness.run``, the proof matrix's own way to run them), and each
fix x backend x topology gets a status:

* ``fixed``: its tests pass (the fix is present, or the behaviour a guard
  checks holds);
* ``broken``: a test fails; the detail is the first failing assertion;
* ``n/a``: not applicable here, with the reason: the cell's own reason in
  the fix's ``fix.toml``, a fix that the base's series does not carry, a
  backend not installed, too few GPUs.

Which cells apply is read from the ``fix.toml`` cells of one base
(``base_for``): the installed version's own base, else the newest base
before it. The ``unit`` cells are not run: they are the upstream-style
unit tests of the patches, which need a Keras source tree with the patches
applied.

On GPUs (``--accelerator gpu``, or ``auto`` where ``nvidia-smi`` lists
one) every replica is a GPU, and a topology needing more GPUs than the
machine has is ``n/a``. With one GPU, the torch process-per-replica
topologies run in one-GPU mode (``topologies.SHARED_GPU``): both workers
on the one GPU over gloo. That exercises the CUDA code paths, not two
devices, and the detail says so.

Outputs: a table (stdout), ``--json`` (``{"keras": {...}, "results":
[{"fix", "backend", "topology", "status", "detail"}]}``), and a JUnit file
with one test case a cell (``--junitxml``, default
``<out>/verify.xml``). The exit status is 0 when no applicable cell is
``broken``, 1 when one is, 2 for a bad argument or no keras to verify.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from . import catalog
from . import options
from . import run
from . import schedule
from . import topologies
from .junit import read_junit

STATUSES = ("fixed", "broken", "n/a")
BACKENDS = topologies.BACKENDS
PACKAGE = Path(__file__).resolve().parent.parent
FIXES = PACKAGE / "fixes"
# Seconds a run may go without progress beyond the per-test timeout
# before its process group is killed (set-up, imports, collection).
GRACE = 60.0
SHARED_GPU_NOTE = (
    "one-GPU mode: both processes on one GPU over gloo; this runs the CUDA "
    "code paths, not 2 devices"
)


class VerifyError(Exception):
    """A bad argument, or nothing to verify (the message says which)."""


@dataclasses.dataclass(frozen=True)
class Result:
    """One cell of the verify table."""

    fix: str
    backend: str
    topology: str
    status: str  # one of STATUSES
    detail: str = ""

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Keras:
    """The keras under test: ``version`` (``keras.__version__``), ``path``
    (its package folder) and the ``base`` whose cells apply to it."""

    version: str
    path: str
    base: str


@dataclasses.dataclass(frozen=True)
class Run:
    """One pytest process: the fixes it collects on one backend and
    topology, with the accelerator it runs on (``topologies.ACCELERATORS``)
    and a note for its results (one-GPU mode)."""

    backend: str
    topology: str
    fixes: tuple[str, ...]
    accelerator: str
    note: str = ""

    @property
    def multi_process(self) -> bool:
        """Whether its workers are processes of their own; such a run
        holds every slot (``schedule.runs_to_start``)."""
        return (self.backend, self.topology) in topologies.MULTI_PROCESS


def installed_backends() -> list[str]:
    """The Keras backends whose framework this interpreter can import."""
    return [b for b in BACKENDS if importlib.util.find_spec(b) is not None]


def probe_keras(backend: str) -> tuple[str, str]:
    """``(keras.__version__, keras package folder)`` of the keras this
    interpreter imports with ``backend``, in a child process (importing
    keras starts its backend; on CPU, so that probing claims no GPU).

    Raises:
        VerifyError: keras cannot be imported.
    """
    code = "import keras; print(keras.__version__); print(keras.__path__[0])"
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "CUDA_VISIBLE_DEVICES": "",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    out = run.run_captured([sys.executable, "-c", code], env, timeout=600)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or len(lines) < 2:
        tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
        raise VerifyError(
            f"no keras to verify: `import keras` with KERAS_BACKEND={backend} "
            f"failed in {sys.executable}: {tail[0]}"
        )
    return lines[-2], lines[-1]


def base_for(version: str, bases) -> str:
    """The base whose cells apply to keras ``version``: the base of the
    same public version (a fork wheel ``3.15.1+fork.13`` is base
    ``3.15.1``), else the newest base before it, else the oldest base.
    Versions compare as PEP 440 versions
    (https://peps.python.org/pep-0440/): a nightly
    ``3.16.0.dev2026102704`` is before ``3.16.0``.

    Raises:
        VerifyError: no bases, or ``version`` is not a PEP 440 version.
    """
    from packaging.version import InvalidVersion
    from packaging.version import Version

    if not bases:
        raise VerifyError("no fix declares a base")
    try:
        public = Version(Version(version).public)
    except InvalidVersion:
        raise VerifyError(f"keras version {version!r} is not PEP 440") from None
    ordered = sorted(bases, key=Version)
    before = [b for b in ordered if Version(b) <= public]
    return before[-1] if before else ordered[0]


def cell_value(fix: catalog.Fix, base: str, backend: str, topology: str):
    """The fix's declared cell on ``base`` (``"proven"``, ``"guard"`` or
    ``"n/a: <reason>"``), or ``"n/a: <why>"`` where its series does not
    carry it on that base."""
    if base not in fix.cells:
        return (
            f"n/a: not in the series of base {base} (carried for "
            f"{', '.join(fix.bases)})"
        )
    key = f"{backend}/{topology}"
    return fix.cells[base].get(key, f"n/a: no cell {key} in fix.toml")


def placement(backend: str, topology: str, accelerator: str, gpus: int):
    """Where a topology runs on this machine: ``(accelerator, note)``, or
    ``(None, reason)`` when it cannot run here.

    On CPU every topology forms (virtual devices, local processes). On
    GPUs one needs ``topologies.gpus_needed``; with fewer, a torch
    process-per-replica topology runs in one-GPU mode where there is one
    GPU (``topologies.SHARED_GPU``), and any other is too short.
    """
    if accelerator == "cpu":
        return "cpu", ""
    short = topologies.gpu_shortfall(backend, topology, gpus)
    if short is None:
        return "gpu", ""
    if gpus >= 1 and (backend, topology) in topologies.SHARED_GPU_TOPOLOGIES:
        return topologies.SHARED_GPU, SHARED_GPU_NOTE
    return None, f"too few devices: {short}"


def plan(fixes, keras: Keras, wanted, accelerator: str, gpus: int):
    """The runs to start and the cells that are ``n/a`` without running.

    Args:
        fixes: the catalog (``catalog.load_fixes``).
        keras: the keras under test (its ``base`` picks the cells).
        wanted: ``{"fix"|"backend"|"topology": set or None}``, the filters.
        accelerator: ``cpu`` or ``gpu``.
        gpus: GPUs visible (``run.visible_gpus``).

    Returns:
        ``(runs, results)``: a ``Run`` a backend and topology with its
        fixes to run, and the ``n/a`` results.
    """
    installed = installed_backends()
    todo, results = {}, []
    for fix in fixes:
        if not _wanted(wanted, "fix", fix.id):
            continue
        for backend, topology in _topologies(wanted):
            value = cell_value(fix, keras.base, backend, topology)
            where, note = placement(backend, topology, accelerator, gpus)
            reason = None
            if value.startswith("n/a"):
                reason = value.partition(":")[2].strip()
            elif backend not in installed:
                reason = f"wrong backend: {backend} is not installed"
            elif where is None:
                reason = note
            if reason is not None:
                results.append(Result(fix.id, backend, topology, "n/a", reason))
                continue
            key = (backend, topology, where, note)
            todo.setdefault(key, []).append(fix.id)
    runs = [Run(b, t, tuple(f), a, n) for (b, t, a, n), f in todo.items()]
    return runs, results


def _wanted(wanted: dict, axis: str, value: str) -> bool:
    chosen = wanted.get(axis)
    return not chosen or value in chosen


def _topologies(wanted: dict):
    """Every (backend, topology) the filters select."""
    for backend, topology in topologies.TOPOLOGIES:
        if _wanted(wanted, "backend", backend) and _wanted(
            wanted, "topology", topology
        ):
            yield backend, topology


def run_one(r: Run, keras: Keras, out: Path, timeout: float) -> list[Result]:
    """Runs one pytest process (``harness.run``) and returns a result for
    each of its fixes (``results_of``)."""
    slug = f"{r.backend}-{r.topology}"
    junit = out / f"{slug}.xml"
    log, progress = junit.with_suffix(".log"), junit.with_suffix(".progress")
    junit.unlink(missing_ok=True)
    progress.unlink(missing_ok=True)
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # a topology sets its own device count
    env.update(
        run.fixes_env(
            r.backend, r.topology, r.accelerator, r.fixes, progress, keras.base
        )
    )
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE.parent), env.get("PYTHONPATH")) if p
    )
    folders = [run.fix_folder(FIXES, f) for f in r.fixes]
    cmd = run.pytest_command(folders, junit, timeout)
    cmd[3:3] = _ini_options(out)
    code = run.run_bounded(cmd, out, env, log, timeout + GRACE, progress)
    return results_of(r, read_junit(junit), code, log)


def _ini_options(out: Path) -> list[str]:
    """Options that make a run independent of the folder it is started
    from: an empty ini file of its own (no ``pytest.ini`` or
    ``pyproject.toml`` of the user's), the package as rootdir and
    conftest boundary (its ``conftest.py`` is loaded wherever it is
    installed)."""
    ini = out / "pytest.ini"
    if not ini.exists():
        ini.write_text(
            "[pytest]\nfilterwarnings =\n    ignore::DeprecationWarning\n"
        )
    return [
        "-c",
        str(ini),
        "--rootdir",
        str(PACKAGE),
        "--confcutdir",
        str(PACKAGE),
    ]


def results_of(r: Run, junit, code, log: Path) -> list[Result]:
    """Each fix's status in a finished run, from its JUnit cases (each
    carries its fix as a property, ``selection.record_properties``): a
    failing or erroring case makes it ``broken`` (detail: the first one),
    else a passing one ``fixed``, else all skipped: ``n/a`` with the skip
    reason. A fix with no case (the run crashed or was killed) is
    ``broken``, with the run's last output lines."""
    results = []
    for fix in r.fixes:
        cases = [c for c in junit.cases if c["fix"] == fix]
        bad = [c for c in cases if c["outcome"] in ("failure", "error")]
        passed = [c for c in cases if c["outcome"] == "passed"]
        if bad:
            status = "broken"
            detail = f"{bad[0]['name']}: {bad[0]['text']}"
        elif passed:
            status, detail = "fixed", f"{len(passed)} test(s) passed"
        elif cases:
            status, detail = "n/a", cases[0].get("skip", "") or "skipped"
        else:
            status, detail = "broken", _crash(code, log)
        if r.note:
            detail = f"{detail} ({r.note})"
        results.append(Result(fix, r.backend, r.topology, status, detail))
    return results


def _crash(code, log: Path) -> str:
    try:
        tail = log.read_text().strip().splitlines()[-2:]
    except OSError:
        tail = []
    what = "killed for want of progress" if code is None else f"exit {code}"
    return f"no test result (pytest {what}): {' | '.join(tail)}"[:400]


def execute(runs: list[Run], keras, out: Path, jobs: int, timeout: float):
    """Runs ``runs`` on ``jobs`` slots (``schedule.run_all``),
    single-process ones first, each multi-process one on every slot (its
    workers take every core or GPU). Returns the results in that order,
    whichever run ends first."""
    ordered = sorted(runs, key=lambda r: r.multi_process)
    done = {}

    def finished(r, results):
        done[r] = results

    schedule.run_all(
        ordered, lambda r: run_one(r, keras, out, timeout), jobs, finished
    )
    return [result for r in ordered for result in done[r]]


def render_table(results: list[Result]) -> str:
    """The results as a plain-text table, one line a cell, sorted by fix,
    backend and topology, with the totals under it."""
    rows = sorted(results, key=lambda r: (r.fix, r.backend, r.topology))
    head = ("fix", "backend", "topology", "status", "detail")
    cells = [head] + [
        (r.fix, r.backend, r.topology, r.status, r.detail) for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = []
    for c in cells:
        left = "  ".join(v.ljust(w) for v, w in zip(c[:4], widths))
        lines.append(f"{left}  {c[4]}".rstrip())
    totals = ", ".join(
        f"{sum(r.status == s for r in results)} {s}" for s in STATUSES
    )
    return "\n".join(lines + ["", totals]) + "\n"


def write_junit(results: list[Result], path: Path, seconds: float) -> None:
    """One JUnit test case a cell (``classname`` the fix, ``name``
    backend/topology): ``broken`` as a failure, ``n/a`` as skipped with
    its reason. Written to a temporary file, then renamed into place."""
    suite = ET.Element(
        "testsuite",
        name="keras-fork-verify",
        tests=str(len(results)),
        failures=str(sum(r.status == "broken" for r in results)),
        skipped=str(sum(r.status == "n/a" for r in results)),
        errors="0",
        time=f"{seconds:.1f}",
    )
    for r in sorted(results, key=lambda r: (r.fix, r.backend, r.topology)):
        case = ET.SubElement(
            suite, "testcase", classname=r.fix, name=f"{r.backend}/{r.topology}"
        )
        if r.status == "broken":
            ET.SubElement(case, "failure", message=r.detail)
        elif r.status == "n/a":
            ET.SubElement(case, "skipped", message=r.detail)
    _write_atomic(path, ET.tostring(suite, encoding="unicode") + "\n")


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``verify`` (also ``python -m keras_fork verify``)."""
    options.add_cell_filters(p)
    p.add_argument(
        "--base",
        help="read the cells of this base instead of the one that matches "
        "the installed keras version",
    )
    options.add_accelerator(
        p, "the tests", "the GPUs where nvidia-smi lists any"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="single-process runs at the same time (default: 1 on GPUs, "
        "else 2 on 2 or more cores)",
    )
    options.add_timeout(p)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("verify-results"),
        help="folder for each run's JUnit file and log (default "
        "./verify-results)",
    )
    p.add_argument(
        "--junitxml",
        type=Path,
        help="the JUnit file of the results, one case a cell (default "
        "<out>/verify.xml)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout (the table goes to stderr)",
    )


def check_filters(args, fixes) -> dict:
    """The filters as sets, every value checked.

    Raises:
        VerifyError: an unknown fix, backend or topology, named with the
            valid ones.
    """
    known = {
        "fix": sorted(f.id for f in fixes),
        "backend": list(BACKENDS),
        "topology": sorted({t for _, t in topologies.TOPOLOGIES}),
    }
    wanted = {}
    for axis, valid in known.items():
        chosen = getattr(args, axis) or []
        unknown = sorted(set(chosen) - set(valid))
        if unknown:
            raise VerifyError(
                f"unknown --{axis} {', '.join(unknown)}; valid: "
                f"{', '.join(valid)}"
            )
        wanted[axis] = set(chosen) or None
    return wanted


def verify(args) -> tuple[Keras, list[Result]]:
    """Plans and runs the selected cells against the installed keras.

    Raises:
        VerifyError: a bad filter or base, or no keras to verify.
    """
    try:
        fixes = catalog.load_fixes(FIXES)
    except catalog.CatalogError as e:
        raise VerifyError(str(e)) from None
    wanted = check_filters(args, fixes)
    bases = sorted({b for f in fixes for b in f.bases})
    if args.base and args.base not in bases:
        raise VerifyError(
            f"unknown --base {args.base}; valid: {', '.join(bases)}"
        )
    backend = (installed_backends() or [None])[0]
    if backend is None:
        raise VerifyError("no backend installed: jax, tensorflow or torch")
    version, path = probe_keras(backend)
    keras = Keras(version, path, args.base or base_for(version, bases))
    try:
        accelerator, gpus = schedule.accelerator(args.accelerator)
    except ValueError as e:
        raise VerifyError(str(e)) from None
    runs, results = plan(fixes, keras, wanted, accelerator, gpus)
    if not runs and not results:
        raise VerifyError("the filters select no cell")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = args.jobs or schedule.default_jobs(accelerator)
    return keras, results + execute(runs, keras, args.out, jobs, args.timeout)


def main(argv=None, prog: str = "verify") -> int:
    """The ``verify`` command: see the module doc. Returns the exit
    status."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    add_arguments(p)
    return run_verify(p.parse_args(argv))


def run_verify(args) -> int:
    """``verify`` with parsed ``args`` (``add_arguments``): prints the
    table (or JSON), writes the JUnit file, returns the exit status."""
    start = time.monotonic()
    try:
        keras, results = verify(args)
    except VerifyError as e:
        print(f"verify: {e}", file=sys.stderr)
        return 2
    header = f"keras {keras.version} ({keras.path}); cells of base {keras.base}"
    table = render_table(results)
    junit = args.junitxml or args.out / "verify.xml"
    write_junit(results, junit, time.monotonic() - start)
    if args.json:
        print(header + "\n" + table, file=sys.stderr)
        payload = {
            "keras": dataclasses.asdict(keras),
            "results": [r.as_json() for r in results],
        }
        print(json.dumps(payload, indent=1))
    else:
        print(header + "\n\n" + table)
    return 1 if any(r.status == "broken" for r in results) else 0
