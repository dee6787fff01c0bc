"""Each PR of a series, alone, on a Keras git checkout: does it apply, and
do its unit tests pass there? (``python -m keras_fork pr-check``)

Upstream takes one PR at a time against master (issue 24). A series is
built as a chain on its sdist, and ``build`` already checks that each
patch of the master series applies alone on the pristine nightly, source
hunks only: the nightly sdist ships no test files. This verb checks the
whole PR, test hunks included, on a Keras git checkout at a revision
(default ``master``): for each patch, a worktree at that revision, the
patch applied alone (``git apply --3way``), then the tests it adds, on
each backend, with Keras's own ``conftest.py`` from the checkout
(``bisect.added_test_selection``, ``bisect.backends_for``). It prints one
row a PR and writes ``dist/pr-check-<V>.json``.

It runs in this environment's Python (the test stack: TensorFlow, JAX,
torch), with the checkout's ``keras`` package first on the path. The
checkout must be at least as new as the base for the patches to apply:
a checkout older than the nightly fails on the hunks written against the
nightly's code, and says so per PR.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from keras_fork.errors import ForkError
from keras_fork.outputs import write_atomic
from keras_fork.proof import bisect
from keras_fork.recipe import pins
from keras_fork.recipe import series

BACKENDS = ("jax", "tensorflow", "torch")
# Seconds one backend's test run of one PR may take.
TIMEOUT = 1800


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True
    )


def apply_alone(worktree: Path, patch: Path) -> str | None:
    """Applies ``patch`` (test hunks included) to the clean ``worktree``:
    as it is, else with a three-way merge where the checkout has the blobs
    the patch was made from.

    Returns:
        None when it applied, else git's first error line of the plain
        apply (the three-way one's where it could be tried).
    """
    errors = []
    for flags in ((), ("--3way",)):
        proc = _git(worktree, "apply", *flags, "--index", str(patch.resolve()))
        if proc.returncode == 0:
            return None
        _git(worktree, "reset", "-q", "--hard")
        lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
        errors.append((lines or proc.stderr.strip().splitlines() or ["?"])[0])
    return errors[0] if "lacks the necessary blob" in errors[1] else errors[1]


def run_tests(worktree: Path, patch: Path, backends, timeout=TIMEOUT) -> dict:
    """The tests ``patch`` adds, run in ``worktree`` on each backend: on
    one device, and on jax also on 8 virtual devices where a test file has
    ``multi_device`` tests (``bisect._passes``).

    Returns:
        ``{backend: "pass" | "fail" | "timeout" | "skipped" | "-"}``:
        ``skipped`` when every selected test was skipped, ``-`` where no
        test file of the patch runs on that backend; and pytest's last line
        of each pass as ``{backend + ":log": [line, ...]}``.
    """
    files = bisect.touched_test_files([patch])
    selection = bisect.added_test_selection(patch, files)
    out = {}
    for backend in backends:
        mine = [f for f in files if backend in bisect.backends_for(f, backends)]
        if not mine:
            out[backend] = "-"
            continue
        results, logs = [], []
        for _, pass_env, extra in bisect._passes(backend, worktree, mine):
            env = dict(os.environ, PYTHONPATH=str(worktree), **pass_env)
            cmd = [sys.executable, "-m", "pytest", "-q", "-p",
                   "no:cacheprovider", *mine, "-k", selection,
                   *extra]  # fmt: skip
            code, last = bisect._pytest(cmd, env, worktree, timeout)
            logs.append(last)
            if code is None:
                results.append("timeout")
            elif code != 0:
                results.append("fail")
            else:
                ran = " passed" in last or " xfailed" in last
                results.append("pass" if ran else "skipped")
        for outcome in ("timeout", "fail", "pass", "skipped"):
            if outcome in results:
                out[backend] = outcome
                break
        out[f"{backend}:log"] = logs
    return out


def check(repo: Path, rev: str, patches: list[Path], backends) -> list[dict]:
    """One row a patch: ``{"patch", "applies", "error", <backend>...}``,
    each patch applied alone on ``repo`` at ``rev``.

    Raises:
        ForkError: ``repo`` is not a git repository or lacks ``rev``.
    """
    if _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").returncode:
        raise ForkError(f"{repo} is not a git repository with revision {rev}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pr-check.") as tmp:
        worktree = Path(tmp) / "keras"
        proc = _git(repo, "worktree", "add", "-q", "--detach", str(worktree),
                    rev)  # fmt: skip
        if proc.returncode:
            raise ForkError(f"git worktree add failed: {proc.stderr.strip()}")
        try:
            for patch in patches:
                _git(worktree, "reset", "-q", "--hard", rev)
                _git(worktree, "clean", "-qfdx")
                error = apply_alone(worktree, patch)
                row = {"patch": patch.name, "applies": error is None,
                       "error": error}  # fmt: skip
                if error is None:
                    row.update(run_tests(worktree, patch, backends))
                rows.append(row)
        finally:
            _git(repo, "worktree", "remove", "--force", str(worktree))
    return rows


def add_arguments(p) -> None:
    p.add_argument("--base", required=True, help="the series, e.g. a nightly")
    p.add_argument(
        "--upstream-repo",
        required=True,
        type=Path,
        help="a Keras git clone (not bare) to apply each PR to",
    )
    p.add_argument("--rev", default="master", help="revision (default master)")
    p.add_argument(
        "--backend", action="append", choices=BACKENDS, help="repeatable"
    )
    p.add_argument("--timeout", type=int, default=TIMEOUT)


def main(args, layout: pins.Layout) -> int:
    """Prints the table; 1 when a PR does not apply alone or its tests fail.

    Raises:
        ForkError: unknown base, bad repository or revision.
    """
    from rich.console import Console
    from rich.table import Table

    base = pins.get_base(layout, args.base)
    backends = tuple(args.backend or BACKENDS)
    patches = series.read_series(layout, base)
    rows = check(args.upstream_repo, args.rev, patches, backends)
    table = Table(title=f"each PR of {base.version} alone on {args.rev}")
    for col in ("PR", "applies", *backends):
        table.add_column(col)
    for r in rows:
        applies = "yes" if r["applies"] else f"[red]no[/]: {r['error']}"
        table.add_row(r["patch"], applies, *(r.get(b, "") for b in backends))
    Console(highlight=False).print(table)
    write_atomic(
        layout.dist / f"pr-check-{base.version}.json",
        json.dumps({"rev": args.rev, "rows": rows}, indent=2) + "\n",
    )
    bad = [
        r
        for r in rows
        if not r["applies"]
        or any(r.get(b) in ("fail", "timeout") for b in backends)
    ]
    return 1 if bad else 0
