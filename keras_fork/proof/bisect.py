"""The series is bisectable: every prefix builds and passes its tests.

Kernel rule: one logical change per patch, and the tree builds and passes
after every patch. Each base's series is materialized once, up to its
longest shorter prefix (``SeriesTree``): commit ``k`` after ``pristine`` is
the tree of prefix ``patches[:k]``. For each prefix this builds the wheel
of that commit and, where patch ``k`` has tests,
installs it into a scratch folder and runs, from the Keras test files that
patch ``k`` touches, the tests it adds, on every backend that runs the
file: each patch is tested where it lands, with all the patches before it.
``--whole-files`` runs every test of those files instead (its time:
docs/test-run.md); CI runs the added tests, and the whole files on the full
series, where the proof matrix's ``unit`` cells run every test file the
series touches.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import threading
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait
from pathlib import Path

from integration_tests.harness import schedule
from keras_fork import options
from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.proof import kerastests
from keras_fork.proof import variants
from keras_fork.recipe import pins
from keras_fork.recipe import series
from keras_fork.recipe import wheel

# Seconds one prefix's pytest run may take (trainer_test.py on torch, the
# longest, takes about 9 minutes on 2 busy cores).
PREFIX_TIMEOUT = 1800


@dataclasses.dataclass(frozen=True)
class PrefixRun:
    """One pytest run of one prefix: ``label`` is e.g. ``"jax, 8 devices"``.

    ``may_select_none``: a run that may select no test (pytest's exit code
    5) and still pass: the jax ``multi_device`` pass of a patch's added
    tests, when the patch adds none marked ``multi_device`` to a file that
    has such tests.
    """

    k: int
    label: str
    cmd: tuple[str, ...]
    env: dict
    cwd: Path
    may_select_none: bool = False


class SeriesTree:
    """``patches`` (the first patches of a base's series) materialized once,
    on first use, under ``folder``: one commit a patch after ``pristine``,
    so commit ``k`` is the commit ``series.materialize`` gives
    ``patches[:k]`` alone (the same sdist, patches, dates and identities,
    applied in the same order by the same ``git am``). Thread-safe."""

    def __init__(self, layout, base, patches: list[Path], folder: Path):
        self.layout, self.base = layout, base
        self.patches, self.folder = patches, folder
        self._lock = threading.Lock()
        self._tree: Path | None = None
        self._commits: list[str] = []
        self._error: ForkError | None = None

    def _materialize(self) -> None:
        """Materializes the series (once; a failure is raised again).

        Raises:
            ForkError: a patch does not apply (``series.materialize``).
        """
        if self._error is None and self._tree is None:
            try:
                _, tree = variants.materialize_subset(
                    self.layout, self.base, self.patches, self.folder, False
                )
            except ForkError as e:
                self._error = e
                raise
            revs = f"{series.PRISTINE_TAG}..HEAD"
            commits = series.git(tree, "rev-list", "--reverse", revs).split()
            if len(commits) != len(self.patches):  # git am made no commit
                self._error = ForkError(
                    f"{self.base.version}: {len(self.patches)} patches "
                    f"gave {len(commits)} commits"
                )
            self._tree, self._commits = tree, commits
        if self._error is not None:
            raise self._error

    def checkout(self, k: int, dest: Path, paths: list[str]) -> Path:
        """A worktree at ``dest`` whose ``HEAD`` is prefix ``k``'s commit,
        holding of that commit only the files of ``paths`` it has (what
        the prefix's build, tests and compile check read of the tree:
        ``wheel.build`` archives ``HEAD``).

        Returns:
            ``dest``.

        Raises:
            ForkError: the series does not materialize.
        """
        env = series.git_env(0)  # no user config (e.g. autocrlf)
        with self._lock:
            self._materialize()
            commit = self._commits[k - 1]
            series.git(
                self._tree,
                "worktree",
                "add",
                "-q",
                "--no-checkout",
                "--detach",
                str(dest),
                commit,
                env=env,
            )
        present = series.git(
            dest,
            "--literal-pathspecs",
            "ls-tree",
            "-r",
            "-z",
            "--name-only",
            commit,
            "--",
            *paths,
            env=env,
        ).split("\0")
        present = [p for p in present if p]
        if present:
            series.git(
                dest,
                "--literal-pathspecs",
                "checkout",
                "-q",
                commit,
                "--",
                *present,
                env=env,
            )
        return dest


def prepare_prefix(
    layout,
    base,
    k,
    backends,
    tmp: Path,
    whole_files: bool = False,
    source: SeriesTree | None = None,
) -> list[PrefixRun]:
    """Builds ``patches[:k]``, a commit of ``source`` (by default a
    ``SeriesTree`` of those patches alone), under ``tmp``; installs the
    wheel there when patch k has tests to run.

    Args:
        whole_files: run every test of patch k's test files; by default
            only the tests patch k adds (``kerastests.added_tests_env``), as CI
            does: the whole files run on the full series in the proof
            matrix's unit cells.
        source: the series tree whose commit ``k`` is this prefix.

    Returns:
        The pytest runs of patch k's test files (one per backend that runs
        them, plus the jax ``multi_device`` pass on 8 devices); none when
        the patch touches no test file (then nothing is installed, and unless
        the patch changes a packaging file, its Python files are
        byte-compiled instead of building the wheel: ``_compiles``).

    Raises:
        ForkError: the prefix does not apply or does not build.
    """
    patches = series.read_series(layout, base)[:k]
    source = source or SeriesTree(layout, base, patches, tmp / "series")
    scratch = variants.scratch_layout(layout, base, patches, tmp, False)
    tree = source.checkout(k, tmp / "tree", _changed_files(patches[-1]))
    # A keras-nightly tree has only the test files the series creates; its
    # prefixes still build (the test hunks run on a Keras checkout).
    touched = kerastests.touched_test_files(patches[-1:])
    tests = [t for t in touched if (tree / t).exists()]
    runs = [
        run
        for backend in backends
        for run in _backend_runs(
            layout,
            k,
            patches[-1],
            tree,
            tests,
            backend,
            backends,
            tmp,
            whole_files,
        )
    ]
    if runs or _touches_packaging(patches[-1]):
        whl = wheel.build(scratch, base, tree)
        if runs:
            _install(whl, tmp / "site")
    else:
        _compiles(tree, patches[-1])
    return runs


def _backend_runs(
    layout, k, patch, tree, tests, backend, backends, tmp, whole_files
) -> list[PrefixRun]:
    """The pytest runs of prefix ``k`` on ``backend`` (see
    ``prepare_prefix``): one a pass of ``_passes`` over the test files of
    ``tests`` that this backend runs; none when it runs none of them."""
    mine = [t for t in tests if backend in kerastests.backends_for(t, backends)]
    if not mine:
        return []
    work = kerastests.test_root(tree, mine, tmp / f"tests-{backend}")
    runs = []
    added = {} if whole_files else kerastests.added_tests_env(patch, mine)
    for label, topo_env, select in kerastests.passes(backend, tree, mine):
        env = variants.child_env(
            tmp / "site",
            topology_env={
                **variants.compile_cache_env(layout),
                **topo_env,
                **added,
            },
        )
        runs.append(
            PrefixRun(
                k,
                label,
                kerastests.pytest_command([work], select, rootdir=work),
                env,
                work,
                may_select_none=not whole_files and "-m" in select,
            )
        )
    return runs


def _changed_files(patch: Path) -> list[str]:
    """The paths a ``git format-patch`` file changes (their new names)."""
    return re.findall(r"(?m)^diff --git a/\S+ b/(\S+)$", patch.read_text())


# Files that decide how a wheel is built: a patch touching one is built.
PACKAGING = ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in")


def _touches_packaging(patch: Path) -> bool:
    """Whether ``patch`` changes a packaging file (``PACKAGING``)."""
    return any(Path(f).name in PACKAGING for f in _changed_files(patch))


def _compiles(tree: Path, patch: Path) -> None:
    """Byte-compiles the Python files ``patch`` leaves in ``tree``: a
    prefix with no test to run is checked this way, not by building its
    wheel from the same ``pyproject.toml`` every time (``_touches_packaging``
    builds those that change it).

    Raises:
        ForkError: a file does not compile (its error).
    """
    files = [
        str(tree / f)
        for f in _changed_files(patch)
        if f.endswith(".py") and (tree / f).is_file()
    ]
    if not files:
        return
    out = process.run(process.python("-m", "py_compile", *files))
    if out.returncode != 0:
        raise ForkError(f"{patch.name}: does not compile:\n{out.stderr}")


def _install(whl: Path, target: Path) -> None:
    """``pip install --no-deps --target`` of a prefix's wheel."""
    # One prefix's install serves its few runs: no byte-compiling up front.
    proc = process.pip_install([whl], target, compile=False)
    if proc.returncode != 0:
        raise ForkError(f"installing {whl.name} failed:\n{proc.stderr[-2000:]}")


def run_prefix_tests(run: PrefixRun, timeout=PREFIX_TIMEOUT):
    """Runs one ``PrefixRun``; returns ``(passed, pytest's last line)``."""
    code, last = kerastests.run_pytest(list(run.cmd), run.env, run.cwd, timeout)
    if code == kerastests.NO_TESTS_COLLECTED and run.may_select_none:
        return True, last
    return code == 0, last


def add_arguments(p) -> None:
    """The ``bisect`` verb's options."""
    options.add_bases(p)
    p.add_argument(
        "--backend",
        action="append",
        choices=kerastests.BACKENDS,
        help="run the unit tests on this backend only (repeatable)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=schedule.default_jobs("cpu"),
        help="pytest runs at the same time (default: 2 where the machine "
        "has 2 cores; one pytest process mostly keeps one core busy)",
    )
    p.add_argument(
        "--whole-files",
        action="store_true",
        help="run every test of each prefix's touched test files, not only "
        "the tests its newest patch adds (much longer: docs/test-run.md)",
    )


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork bisect``: every shorter prefix of each
    selected series builds and passes the tests its newest patch adds.

    Returns:
        0 when every prefix passes, else 1.

    Raises:
        ForkError: ``--jobs`` below 1, an unknown base, a series problem.
    """
    from rich.console import Console

    if args.jobs < 1:
        raise ForkError("--jobs must be at least 1")
    console = Console(stderr=True, highlight=False)
    bases = pins.select_bases(layout, args.base)
    bad = bisect_bases(layout, bases, args, console)
    for line in bad:
        print(f"not bisectable: {line}")
    print(f"bisect: {'failed' if bad else 'every prefix builds and passes'}")
    return 1 if bad else 0


def _queue_prefixes(pool, layout, bases, args, tmp: Path):
    """Submits to ``pool`` the build (``prepare_prefix``) of every shorter
    prefix of each base's series, each in its own folder under ``tmp``,
    all of a base's prefixes from one ``SeriesTree``.

    Returns:
        ``(jobs, lengths)``: ``{job: (base, None)}`` of the submitted
        builds, and each base version's series length.
    """
    backends = args.backend or kerastests.BACKENDS
    jobs, lengths = {}, {}
    for base in bases:
        patches = series.read_series(layout, base)
        lengths[base.version] = n = len(patches)
        # Materialized by the first of its prefixes to build.
        source = SeriesTree(
            layout, base, patches[: n - 1], tmp / base.version / "series"
        )
        for k in range(1, n):
            folder = tmp / base.version / f"prefix-{k}"
            job = pool.submit(
                prepare_prefix,
                layout,
                base,
                k,
                backends,
                folder,
                args.whole_files,
                source,
            )
            jobs[job] = (base, None)
    return jobs, lengths


def bisect_bases(layout, bases, args, console) -> list[str]:
    """Builds every shorter prefix of each base's series and runs its tests.

    The whole series (k = n) is the fork the proof matrix's unit cells
    already test; here every shorter prefix. One pool of ``--jobs`` threads
    does all the work of all the bases: each prefix builds in its own
    scratch folder, and its pytest runs (one per backend) join the queue as
    soon as it has built, so that no core waits for the last build of a
    base, or for its longest run, before the next base starts.

    Returns:
        ``"<base> prefix k/n (<backend>): <last line>"`` of each failed run.

    Raises:
        ForkError: a prefix does not apply or does not build.
    """
    bad = []
    with (
        tempfile.TemporaryDirectory(prefix="bisect.") as tmp,
        ThreadPoolExecutor(args.jobs) as pool,
    ):
        # Per base version: its series' length n (prefixes 1..n-1 are
        # built) and how many of its test runs have finished.
        jobs, lengths = _queue_prefixes(pool, layout, bases, args, Path(tmp))
        ran = dict.fromkeys(lengths, 0)
        try:
            while jobs:
                done, _ = wait(jobs, return_when=FIRST_COMPLETED)
                for job in done:
                    base, run = jobs.pop(job)
                    if run is None:  # a prefix built: queue its runs
                        for r in job.result():
                            jobs[pool.submit(run_prefix_tests, r)] = (base, r)
                        continue
                    ran[base.version] += 1
                    passed, last = job.result()
                    n = lengths[base.version]
                    line = f"{base.version} prefix {run.k}/{n} "
                    line += f"({run.label}): {last}"
                    console.print(f"  {line}")
                    if not passed:
                        bad.append(line)
        except BaseException:
            for job in jobs:
                job.cancel()  # what has not started yet
            raise
    for version, n in lengths.items():
        console.print(
            f"keras {version}: {n - 1} prefixes built or compiled, "
            f"{ran[version]} test runs"
        )
    return bad
