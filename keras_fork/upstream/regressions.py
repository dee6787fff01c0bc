"""Upstream's own unit tests, stock vs fork, compared test by test.

``python -m keras_fork regressions`` runs Keras's ``*_test.py`` files of a
base, unmodified (the pristine sdist's copies: the fork's added or changed
test hunks are the proof matrix's ``unit`` cells, not part of this
comparison), once against stock keras and once against fork keras
(``build/variants/<V>/{stock,fork}``, as the proof matrix installs them),
under Keras's own test conventions (``selection.KERAS_TESTS_PLUGIN``; the
sdist's ``[tool.pytest.ini_options]``), one pytest process per backend and side:
JAX with 8 virtual CPU devices so the ``multi_device`` tests run,
TensorFlow and torch on one device.

Per backend it reports the tests run, **regressions** (pass on stock, fail
on fork), newly passing tests, tests only one side has or collects, and
the failures both sides share, each classed as a missing optional
dependency (named) or a failure of upstream itself. JUnit XML of both
sides and ``regressions.json`` go to ``dist/regressions/<V>/``. The exit
status is 1 on any regression or one-sided test or collection error.

Which files: by default (``DEFAULT_DIRS``) the test files beside
every source file the series touches, the touched test files themselves,
and the trainers, models, losses, normalization layers, random,
distribution, optimizers and ``backend/<B>`` folders; ``--modules`` names
files or folders instead; ``--all`` runs every test file.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from integration_tests.harness import selection
from integration_tests.harness import topologies
from integration_tests.harness.junit import read_junit
from integration_tests.harness.run import pytest_command
from integration_tests.harness.run import run_bounded
from keras_fork import outputs
from keras_fork.errors import ForkError
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import variants
from keras_fork.recipe import pins
from keras_fork.recipe import series

BACKENDS = topologies.BACKENDS
SIDES = ("stock", "fork")
JAX_DEVICES = 8
# Issue 22's default tier, beside the files the series touches.
DEFAULT_DIRS = (
    "keras/src/trainers",
    "keras/src/models",
    "keras/src/losses",
    "keras/src/layers/normalization",
    "keras/src/random",
    "keras/src/distribution",
    "keras/src/optimizers",
)
_MISSING = re.compile(r"No module named '([\w.]+)'")
_TEST_IMPORT = re.compile(r"cannot import name '\w+_test'")


@dataclasses.dataclass
class Comparison:
    """One backend's stock-vs-fork comparison (test ids are
    ``file::class::name``).

    Attributes:
        run: tests that ran (not skipped) on either side.
        regressions: pass on stock, fail or error on fork.
        newly_passing: fail or error on stock, pass on fork.
        one_sided: ``(test, side that has it or that errors collecting)``.
        common: ``(test, class)`` failing on both sides; class is
            ``missing dependency <module>`` or ``upstream``.
        intended: ``(test, why)``: regressions a fix declares on purpose
            (its ``fix.toml``'s ``changed_upstream_tests``); not failures.
    """

    run: int
    regressions: list
    newly_passing: list
    one_sided: list
    common: list
    intended: list = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.regressions and not self.one_sided


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """``test id -> (outcome, first message line)`` of a JUnit file."""
    cases = read_junit(junit).cases
    return {
        f"{c['file']}::{c['classname']}::{c['name']}": (c["outcome"], c["text"])
        for c in cases
    }


def classify_failure(text: str) -> str:
    """``missing dependency <module>`` when the message says a module is
    missing (``No module named 'x'``); ``test module not installed`` when
    a test file imports another test file from the installed keras, which
    has none (``cannot import name 'x_test'``); else ``upstream``."""
    m = _MISSING.search(text)
    if m:
        return f"missing dependency {m.group(1)}"
    if _TEST_IMPORT.search(text):
        return "test module not installed"
    return "upstream"


def compare(stock: dict, fork: dict) -> Comparison:
    """Compares two ``_outcomes`` maps.

    A test on one side only, or a collection error on one side only (its
    case names a file, not a test), is one-sided; a test skipped on either
    side is not compared.
    """
    bad = ("failure", "error")
    regressions, newly, one_sided, common = [], [], [], []
    run = 0
    for test in sorted(set(stock) | set(fork)):
        if test not in stock or test not in fork:
            one_sided.append((test, "fork" if test in fork else "stock"))
            continue
        (s, s_text), (f, f_text) = stock[test], fork[test]
        if "skipped" in (s, f):
            continue
        run += 1
        if s == "passed" and f in bad:
            regressions.append((test, f_text))
        elif s in bad and f == "passed":
            newly.append(test)
        elif s in bad and f in bad:
            common.append((test, classify_failure(f_text or s_text)))
    return Comparison(run, regressions, newly, one_sided, common)


def changed_tests(layout: pins.Layout, version: str) -> dict[str, str]:
    """``{test id: "<fix>: <why>"}`` of every fix's declared
    ``changed_upstream_tests`` on base ``version``."""
    return {
        test: f"{fix.id}: {why}"
        for fix in cells_lib.load_fixes(layout.fixes)
        for test, why in fix.changed_upstream_tests.get(version, {}).items()
    }


def set_apart(result: Comparison, changed: dict[str, str]) -> Comparison:
    """``result`` with the regressions that ``changed`` declares moved to
    ``intended`` (with their reason); any other stays a regression."""
    kept = [(t, text) for t, text in result.regressions if t not in changed]
    intended = [(t, changed[t]) for t, _ in result.regressions if t in changed]
    return dataclasses.replace(result, regressions=kept, intended=intended)


def default_files(tree: Path, patches: list[Path], backend: str) -> list[str]:
    """The default tier for ``backend`` (see the module docstring): paths
    relative to the tree, sorted."""
    files = set()
    for patch in patches:
        for path in re.findall(
            r"^\+\+\+ b/(keras/\S+\.py)$", patch.read_text(), flags=re.M
        ):
            test = path if path.endswith("_test.py") else path[:-3] + "_test.py"
            if (tree / test).is_file():
                files.add(test)
    for folder in (*DEFAULT_DIRS, f"keras/src/backend/{backend}"):
        files.update(_tests_under(tree, folder))
    return sorted(_for_backend(files, backend))


def _tests_under(tree: Path, name: str) -> list[str]:
    path = tree / name
    if path.is_file():
        return [name]
    if not path.is_dir():
        raise ForkError(f"{name}: no such test file or folder in {tree}")
    return [str(p.relative_to(tree)) for p in path.rglob("*_test.py")]


def _for_backend(files, backend: str) -> list[str]:
    """Leaves out another backend's own folder (keras/src/backend/<other>)."""
    others = [f"keras/src/backend/{b}/" for b in BACKENDS if b != backend]
    return [f for f in files if not f.startswith(tuple(others))]


def lay_out_tests(tree: Path, files: list[str], work: Path) -> None:
    """Copies ``files`` (relative to ``tree``) under ``work``, keeping their
    paths, with the sdist's pytest settings."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for f in files:
        (work / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / f, work / f)
    project = tomllib.loads((tree / "pyproject.toml").read_text())
    options = project.get("tool", {}).get("pytest", {}).get("ini_options", {})
    lines = ["[pytest]"]
    for key in ("filterwarnings", "markers"):
        if options.get(key):
            lines.append(f"{key} =")
            lines += [f"    {v}" for v in options[key]]
    (work / "pytest.ini").write_text("\n".join(lines) + "\n")


def pristine_tree(layout: pins.Layout, base: pins.Base, dest: Path) -> Path:
    """The base's unpatched sdist tree at ``dest`` (``git archive`` of the
    materialized tree's ``pristine`` tag; materializes it when missing)."""
    tree = layout.tree(base.version)
    if not (tree / ".git").is_dir():
        tree = series.materialize(layout, base)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = dest / "pristine.tar"
    series.git(tree, "archive", "-o", str(archive), series.PRISTINE_TAG)
    shutil.unpack_archive(archive, dest)
    archive.unlink()
    return dest


def add_upstream_tests(tree: Path, repo: Path, rev: str) -> int:
    """Copies the ``keras/**/*_test.py`` files of ``repo`` at ``rev`` (a
    git clone, bare or not) into ``tree``, over any there; returns how
    many. They are upstream's tests of that revision, unmodified.

    Raises:
        ForkError: ``repo`` is not a git repository or lacks ``rev``.
    """
    names = [
        n
        for n in series.git(
            repo, "ls-tree", "-r", "--name-only", rev, "keras"
        ).split()
        if n.endswith("_test.py")
    ]
    if not names:
        raise ForkError(f"{repo} has no keras/**/*_test.py at {rev}")
    archive = tree / ".upstream-tests.tar"
    series.git(repo, "archive", "-o", str(archive), rev, *names)
    shutil.unpack_archive(archive, tree, format="tar")
    archive.unlink()
    return len(names)


def _env(layout, base, side: str, backend: str, overlay) -> dict:
    topology = {
        "KERAS_BACKEND": backend,
        "CUDA_VISIBLE_DEVICES": "",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if backend == "jax":
        topology["XLA_FLAGS"] = (
            f"--xla_force_host_platform_device_count={JAX_DEVICES}"
        )
    keras_dir = layout.variant(base.version, side)
    return variants.child_env(keras_dir, overlay, topology)


def run_side(work: Path, env: dict, junit: Path, timeout: int, limit: float):
    """One pytest process over ``work``'s test files; JUnit to ``junit``,
    its log beside it. Returns pytest's exit status (None: killed after
    ``limit`` seconds)."""
    junit.unlink(missing_ok=True)
    cmd = pytest_command(
        [work],
        junit,
        timeout,
        [selection.KERAS_TESTS_PLUGIN],
        rootdir=work,
        extra=["--import-mode=importlib", "--continue-on-collection-errors"],
    )
    return run_bounded(cmd, work, env, junit.with_suffix(".log"), limit)


def add_arguments(p) -> None:
    """The ``regressions`` verb's options."""
    p.add_argument("--base", help="the base (default: the first pinned)")
    p.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="only this backend (repeatable; default: all three)",
    )
    p.add_argument(
        "--modules",
        nargs="+",
        metavar="M",
        help="test files or folders, as keras/src/<path> or <path> under "
        "keras/src (default: the tier of the module docstring)",
    )
    p.add_argument("--all", action="store_true", help="every test file")
    p.add_argument(
        "--upstream-repo",
        type=Path,
        metavar="PATH",
        help="a keras-team/keras git clone to take the test files from, "
        "for a base whose sdist ships none (3.7.0, keras-nightly)",
    )
    p.add_argument(
        "--upstream-rev",
        metavar="REV",
        help="the revision of --upstream-repo (default: tag v<base>)",
    )
    p.add_argument("--timeout", type=int, default=600, help="per-test s")
    p.add_argument(
        "--run-timeout", type=float, default=5400, help="per-run seconds"
    )


def _select(args, tree: Path, patches, backend: str) -> list[str]:
    if args.all:
        return sorted(_for_backend(_tests_under(tree, "keras"), backend))
    if args.modules:
        files = set()
        for m in args.modules:
            name = m if m.startswith("keras/") else f"keras/src/{m}"
            files.update(_tests_under(tree, name.rstrip("/")))
        return sorted(_for_backend(files, backend))
    return default_files(tree, patches, backend)


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork regressions``: see the module docstring.

    Returns:
        0 when no backend has a regression or a one-sided test, else 1.

    Raises:
        ForkError: an unknown base, backend folder or module; no fork wheel.
    """
    if args.all and args.modules:
        raise ForkError("--all and --modules exclude each other")
    (base,) = pins.select_bases(layout, [args.base] if args.base else None)[:1]
    variants.install_variants(layout, base)
    overlay = variants.install_overlay(layout, base)
    out = layout.dist / "regressions" / base.version
    out.mkdir(parents=True, exist_ok=True)
    tree = pristine_tree(layout, base, layout.build / "regressions" / "tree")
    if args.upstream_repo:
        rev = args.upstream_rev or f"v{base.version}"
        add_upstream_tests(tree, args.upstream_repo, rev)
    elif not any((tree / "keras").rglob("*_test.py")):
        raise ForkError(
            f"the sdist of base {base.version} ships no test files: pass "
            "--upstream-repo PATH (a keras-team/keras clone) and, for a "
            "nightly, --upstream-rev REV (the master commit it was built from)"
        )
    patches = series.read_series(layout, base)
    report = {"base": base.version, "backends": {}}
    changed = changed_tests(layout, base.version)
    for backend in args.backend or BACKENDS:
        files = _select(args, tree, patches, backend)
        work = layout.build / "regressions" / f"tests-{backend}"
        lay_out_tests(tree, files, work)
        junits = {s: out / f"{backend}-{s}.xml" for s in SIDES}
        with ThreadPoolExecutor(len(SIDES)) as pool:
            for side in SIDES:
                env = _env(layout, base, side, backend, overlay)
                pool.submit(
                    run_side,
                    work,
                    env,
                    junits[side],
                    args.timeout,
                    args.run_timeout,
                )
        result = compare(*(_outcomes(junits[s]) for s in SIDES))
        result = set_apart(result, changed)
        report["backends"][backend] = dict(
            files=len(files), ok=result.ok, **dataclasses.asdict(result)
        )
        _print(backend, len(files), result)
    outputs.write_atomic(
        out / "regressions.json", json.dumps(report, indent=1) + "\n"
    )
    bad = [b for b, r in report["backends"].items() if not r["ok"]]
    print(f"regressions: {'failed on ' + ', '.join(bad) if bad else 'none'}")
    return 1 if bad else 0


def _print(backend: str, files: int, r: Comparison) -> None:
    classes: dict[str, int] = {}
    for _, c in r.common:
        classes[c] = classes.get(c, 0) + 1
    print(
        f"{backend}: {files} files, {r.run} tests run, "
        f"{len(r.regressions)} regressions ({len(r.intended)} more "
        f"intended), {len(r.newly_passing)} newly "
        f"passing, {len(r.one_sided)} one-sided, {len(r.common)} failing on "
        f"both ({', '.join(f'{k}: {v}' for k, v in sorted(classes.items()))})"
    )
    for test, text in r.regressions:
        print(f"  REGRESSION {test}: {text}")
    for test, why in r.intended:
        print(f"  intended change {test}: {why}")
    for test, side in r.one_sided:
        print(f"  ONE-SIDED ({side}) {test}")
    for test in r.newly_passing:
        print(f"  newly passing {test}")
