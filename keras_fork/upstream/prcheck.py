"""Each PR of a series, alone, on a Keras git checkout: does it apply, and
do its unit tests pass there? (``python -m keras_fork pr-check``)

Upstream takes one PR at a time against master (docs/upstream.md). A series is
built as a chain on its sdist, and ``build`` already checks that each
patch of the master series applies alone on the pristine nightly, source
hunks only: the nightly sdist ships no test files. This verb checks the
whole PR, test hunks included, on a Keras git checkout at a revision
(default ``master``): for each patch, a worktree at that revision, the
patch applied alone (``git apply --3way``), then the tests it adds, on
each backend, with Keras's own ``conftest.py`` from the checkout
(``kerastests.added_test_selection``, ``kerastests.backends_for``). Then
the same tests with the PR's test hunks only, on the checkout's own code
(stock): they must fail there, or the PR's tests do not show what it
fixes. It prints one row a PR and writes ``dist/pr-check-<V>.json``.

It runs in this environment's Python (the test stack: TensorFlow, JAX,
torch), with the checkout's ``keras`` package first on the path. The
checkout must be at least as new as the base for the patches to apply:
a checkout older than the nightly fails on the hunks written against the
nightly's code, and says so per PR.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from integration_tests.harness import topologies
from keras_fork import options
from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.errors import check_known
from keras_fork.outputs import print_table
from keras_fork.outputs import write_atomic
from keras_fork.proof import kerastests
from keras_fork.recipe import pins
from keras_fork.recipe import submission
from keras_fork.upstream import checkout
from keras_fork.upstream import hygiene
from keras_fork.upstream import prseries

BACKENDS = topologies.BACKENDS
# pytest's exit status when the selection leaves no test to run
# (https://docs.pytest.org/en/stable/reference/exit-codes.html): a pass
# that selects none of the PR's tests says nothing about the PR.
NO_TESTS_COLLECTED = 5
# Seconds one backend's test run of one PR may take.
TIMEOUT = 1800


def apply_alone(worktree: Path, patch: Path) -> str | None:
    """Applies ``patch`` (test hunks included) to the clean ``worktree``:
    as it is, else with a three-way merge where the checkout has the blobs
    the patch was made from.

    Returns:
        None when it applied, else git's first error line of the plain
        apply (the three-way one's where it could be tried).
    """
    applied, errors = checkout.apply(worktree, patch.read_text(), "--index")
    if applied:
        return None
    return errors[0] if "lacks the necessary blob" in errors[1] else errors[1]


def apply_tests_only(worktree: Path, patch: Path) -> str | None:
    """Applies only the test files' hunks of ``patch`` (``*_test.py``) to
    the clean ``worktree``, as ``apply_alone`` does.

    Returns:
        None when they applied, else git's first error line.
    """
    applied, errors = checkout.apply(
        worktree, patch.read_text(), "--index", "--include=*_test.py"
    )
    return None if applied else errors[-1]


def stock_verdict(row: dict, backends) -> str:
    """Whether a PR's tests prove it on the checkout: ``proven`` (they
    pass with the PR and fail on stock on some backend), ``vacuous``
    (they pass with it and on stock everywhere they ran), ``broken``
    (they fail or time out with the PR), ``-`` (not applied or nothing
    ran). The rule of the proof matrix (``docs/proof.md``) for one PR."""
    fork = [row.get(b) for b in backends if row.get(b) not in (None, "-")]
    stock = [
        row.get(f"stock:{b}")
        for b in backends
        if row.get(f"stock:{b}") not in (None, "-")
    ]
    if not row["applies"] or not fork:
        return "-"
    if any(o in ("fail", "timeout") for o in fork):
        return "broken"
    if any(o in ("fail", "timeout") for o in stock):
        return "proven"
    return "vacuous"


def run_tests(worktree: Path, patch: Path, backends, timeout=TIMEOUT) -> dict:
    """The tests ``patch`` adds, run in ``worktree`` on each backend: on
    one device, and on jax also on 8 virtual devices where a test file has
    ``multi_device`` tests (``kerastests.passes``).

    Returns:
        ``{backend: "pass" | "fail" | "timeout" | "skipped" | "-"}``:
        ``skipped`` when every selected test was skipped, ``-`` where no
        test file of the patch runs on that backend; and pytest's last line
        of each pass as ``{backend + ":log": [line, ...]}``.
    """
    files = kerastests.touched_test_files([patch])
    selection = kerastests.added_test_selection(patch, files)
    out = {}
    for backend in backends:
        mine = [
            f for f in files if backend in kerastests.backends_for(f, backends)
        ]
        if not mine:
            out[backend] = "-"
            continue
        results, logs = [], []
        for _, pass_env, extra in kerastests.passes(backend, worktree, mine):
            env = dict(os.environ, PYTHONPATH=str(worktree), **pass_env)
            cmd = kerastests.pytest_command(mine, ["-k", selection, *extra])
            code, last = kerastests.run_pytest(cmd, env, worktree, timeout)
            logs.append(last)
            if code is None:
                results.append("timeout")
            elif code == NO_TESTS_COLLECTED:
                continue  # e.g. the 8-device pass: no added multi_device test
            elif code != 0:
                results.append("fail")
            else:
                ran = " passed" in last or " xfailed" in last
                results.append("pass" if ran else "skipped")
        for outcome in ("timeout", "fail", "pass", "skipped"):
            if outcome in results:
                out[backend] = outcome
                break
        else:  # no pass selected any of the PR's tests
            out[backend] = "-"
        out[f"{backend}:log"] = logs
    return out


def check(
    repo: Path,
    rev: str,
    patches: list[Path],
    backends,
    source: str = "checkout",
    layout: pins.Layout | None = None,
    base: pins.Base | None = None,
) -> list[dict]:
    """One row a patch: ``{"patch", "applies", "error", <backend>...,
    "stock:<backend>"..., "verdict"}``, each patch applied alone on
    ``repo`` at ``rev`` (``source="base"``: with the base's source over
    the checkout's, ``checkout.worktree``).

    Raises:
        ForkError: ``repo`` is not a git repository or lacks ``rev``.
    """
    rows = []
    with checkout.worktree(repo, rev, source, layout, base) as (tree, commit):
        for patch in patches:
            checkout.reset(tree, commit)
            error = apply_alone(tree, patch)
            row = {
                "patch": patch.name,
                "applies": error is None,
                "error": error,
            }
            if error is None:
                row.update(run_tests(tree, patch, backends))
                _stock_side(tree, commit, patch, backends, row)
            row["verdict"] = stock_verdict(row, backends)
            rows.append(row)
    return rows


def _stock_side(worktree: Path, commit: str, patch: Path, backends, row):
    """The PR's added tests on the checkout's own code (its test hunks
    only), as ``stock:<backend>`` entries of ``row``."""
    checkout.reset(worktree, commit)
    error = apply_tests_only(worktree, patch)
    if error is not None:
        row["stock_error"] = error
        return
    for key, value in run_tests(worktree, patch, backends).items():
        row[f"stock:{key}"] = value


def series_files(layout: pins.Layout, base: pins.Base) -> list[Path]:
    """The PR files of ``dist/pr-series/<V>/`` (``pending/`` included) in
    the order they are sent: by their number.

    Raises:
        ForkError: the folder holds no PR (``pr-series`` has not run).
    """
    folder = layout.dist / "pr-series" / base.version
    files = [
        f
        for f in [*folder.glob("*.patch"), *folder.glob("pending/*.patch")]
        if not f.name.startswith("0000-")
    ]
    if not files:
        raise ForkError(f"no PR in {folder}: run pr-series --base {base}")
    return sorted(files, key=lambda f: f.name)


def in_order(worktree: Path, files: list[Path]) -> list[dict]:
    """Applies ``files`` with ``git am -3`` in ``worktree``, each on top of
    every earlier one that applied, as a maintainer merges PRs in the
    order they come: one row a file, ``{"patch", "applies", "error"}``
    (``error``: git's conflict lines, else its first error line). A file
    that does not apply is skipped (``git am --abort``), the next goes
    on."""
    rows = []
    for f in files:
        proc = checkout.git(worktree, *checkout.IDENTITY, "am", "-3", str(f))
        error = None
        if proc.returncode:
            lines = (proc.stdout + proc.stderr).splitlines()
            conflicts = [ln for ln in lines if ln.startswith("CONFLICT")]
            errors = [ln for ln in lines if ln.startswith("error")]
            error = "; ".join(conflicts) or (errors or lines or ["?"])[0]
            checkout.git(worktree, "am", "--abort")
        rows.append({"patch": f.name, "applies": error is None, "error": error})
    return rows


def lint(worktree: Path, commit: str) -> list[str]:
    """``ruff check`` and ``ruff format --check`` of the files changed in
    ``worktree`` since ``commit``, under the checkout's own configuration
    (its ``pyproject.toml``), as upstream's lint job runs them.

    Returns:
        The output lines of each that failed (empty when both pass).
    """
    changed = checkout.git(worktree, "diff", "--name-only", commit, "HEAD")
    files = [f for f in changed.stdout.split() if f.endswith(".py")]
    problems = []
    for args in (("check",), ("format", "--check")):
        proc = process.run(
            process.python("-m", "ruff", *args, *files), cwd=worktree
        )
        if files and proc.returncode:
            problems += (proc.stdout + proc.stderr).strip().splitlines()
    return problems


def add_arguments(p) -> None:
    options.add_base(p, "the series, e.g. a nightly")
    checkout.add_arguments(
        p,
        "a Keras git clone (not bare) to apply each PR to",
        "checkout",
        "base: the base's sdist source over the checkout, its test files "
        "kept (a checkout older than a nightly base)",
    )
    p.add_argument(
        "--backend", action="append", choices=BACKENDS, help="repeatable"
    )
    p.add_argument(
        "--timeout",
        type=int,
        default=TIMEOUT,
        help=f"seconds a pytest run may take (default {TIMEOUT})",
    )
    p.add_argument(
        "--in-order",
        action="store_true",
        help="apply the written PR series (dist/pr-series/<V>/, pending/ "
        "included) with git am -3, each on top of the ones before it, in "
        "the order they are sent, and check each file's hygiene (author, "
        "no internal PR number or fork named, closing references); no "
        "tests run",
    )
    p.add_argument(
        "--pr",
        action="append",
        help="only this PR: its patch file name or its number in submission "
        "order (repeatable); the others keep their rows from the last "
        "dist/pr-check-<V>.json of the same --rev and --source",
    )


def select_prs(patches: list[Path], wanted) -> list[Path]:
    """The ``patches`` (in submission order) that ``wanted`` names, by
    file name or by number (1 = the first to send); all when ``wanted``
    is empty.

    Raises:
        ForkError: a name or number that is no PR of the series (named,
            with the valid names).
    """
    if not wanted:
        return patches
    by_key = {p.name: p for p in patches}
    by_key.update({str(k): p for k, p in enumerate(patches, start=1)})
    check_known("--pr", wanted, by_key)
    chosen = {by_key[w].name for w in wanted}
    return [p for p in patches if p.name in chosen]


def _with_previous_rows(path: Path, args, patches, rows) -> list[dict]:
    """``rows`` (of the PRs checked now) with, for every other PR of
    ``patches``, its row from the last run in ``path`` when that run used
    the same revision and source, all in submission order."""
    try:
        last = json.loads(path.read_text())
    except (OSError, ValueError):
        return rows
    if (last.get("rev"), last.get("source")) != (args.rev, args.source):
        return rows
    mine = {r["patch"]: r for r in rows}
    kept = {r["patch"]: r for r in last.get("rows", [])}
    merged = [mine.get(p.name) or kept.get(p.name) for p in patches]
    return [r for r in merged if r is not None]


def main(args, layout: pins.Layout) -> int:
    """Prints the table; 1 when a PR does not apply alone or its tests do
    not prove it (``stock_verdict`` is not ``proven``).

    Raises:
        ForkError: unknown base, bad repository or revision.
    """
    base = pins.get_base(layout, args.base)
    if args.in_order:
        return _main_in_order(args, layout, base)
    backends = tuple(args.backend or BACKENDS)
    every = submission.read_submission(layout, base)
    patches = select_prs(every, args.pr)
    rows = check(
        args.upstream_repo,
        args.rev,
        patches,
        backends,
        args.source,
        layout,
        base,
    )
    out = layout.dist / f"pr-check-{base.version}.json"
    checked = rows
    if args.pr:
        rows = _with_previous_rows(out, args, every, rows)
    where = (
        args.rev
        if args.source == "checkout"
        else f"{base.version}'s source on {args.rev}'s tests"
    )
    write_atomic(
        out,
        json.dumps(
            {"rev": args.rev, "source": args.source, "rows": rows}, indent=2
        )
        + "\n",
    )
    _print_alone(
        f"each PR of {base.version} alone on {where}", checked, backends
    )
    bad = [r for r in checked if r["verdict"] != "proven"]
    return 1 if bad else 0


def _applies(row: dict) -> str:
    """A row's "applies" cell: yes, or no with the error (rich markup)."""
    return "yes" if row["applies"] else f"[red]no[/]: {row['error']}"


def _print_alone(title: str, rows: list[dict], backends) -> None:
    """``rows`` (``check``'s) as a table, with its legend."""
    from rich.console import Console

    lines = []
    for r in rows:
        applies = _applies(r)
        cells = [
            f"{r.get('stock:' + b, '')} / {r.get(b, '')}"
            if r["applies"]
            else ""
            for b in backends
        ]
        lines.append((r["patch"], applies, *cells, r["verdict"]))
    console = Console(highlight=False)
    print_table(title, ("PR", "applies", *backends, "verdict"), lines, console)
    console.print(
        "each backend: the added tests on stock / with the PR; "
        "verdict: proven (fail on stock, pass with the PR)"
    )


def _main_in_order(args, layout: pins.Layout, base: pins.Base) -> int:
    """``pr-check --in-order``: prints one row a PR (it applies on the ones
    before it; its hygiene problems; its body's closing references, for a
    person to check), a line per hygiene problem naming its file
    (``hygiene.check_series``), then the lint of the merged result; 1 when
    a PR does not apply on top of the ones sent before it, a file breaks a
    hygiene rule, or the result does not lint clean."""
    from rich.console import Console
    from rich.markup import escape

    files = series_files(layout, base)
    folder = layout.dist / "pr-series" / base.version
    report = hygiene.check_series(
        folder, files, prseries.author_identity(layout.root)
    )
    with checkout.worktree(
        args.upstream_repo, args.rev, args.source, layout, base
    ) as (tree, commit):
        rows = in_order(tree, files)
        problems = lint(tree, commit)
    console = Console(highlight=False)
    print_table(
        f"{base.version}'s PR series in order on {args.rev}",
        (
            "PR",
            "applies on the ones before it",
            "hygiene",
            "closes (check by hand)",
        ),
        [
            (
                r["patch"],
                _applies(r),
                _hygiene(report.of(f, f.with_suffix(".md"))),
                escape(", ".join(report.fixes.get(f, [])) or "-"),
            )
            for f, r in zip(files, rows, strict=True)
        ],
        console,
    )
    for path, problem in report.problems:
        console.print(
            f"{path.relative_to(folder)}: {problem}",
            markup=False,
            soft_wrap=True,  # one line a problem, whatever the width
        )
    console.print(
        "hygiene: "
        + (f"{len(report.problems)} problem(s)" if report.problems else "clean")
        + " (author as git mailinfo reads it, internal PR numbers and "
        "the fork, closing references)"
    )
    for line in problems:
        console.print(line, markup=False)
    verdict = "lint: " + ("failed" if problems else "clean") + " (ruff)"
    console.print(verdict + ", the checkout's configuration, on what changed")
    applied = all(r["applies"] for r in rows)
    return 0 if applied and not problems and not report.problems else 1


def _hygiene(problems: list[str]) -> str:
    """A row's "hygiene" cell: clean, or the number of problems of the PR's
    patch and body (rich markup)."""
    return f"[red]{len(problems)} problem(s)[/]" if problems else "clean"
