"""``rebase``: move a series onto a new upstream base with ``git rebase``.

``python -m keras_fork rebase --base OLD --to NEW`` replays the commits of
OLD's materialized tree (``build/trees/OLD``: pristine OLD + its series) onto
NEW's pristine sdist with ``git rebase`` (three-way merges, since the work
repo holds both pristine trees), in ``build/rebase/NEW``:

* a conflict stops it and names the patch (its number and subject), each
  conflicted file and the line ranges of each conflicted hunk; the work
  repo is left mid-rebase for a person to resolve, after which
  ``--continue`` goes on (``git rebase --continue``) and exports;
* a patch that becomes empty on NEW (its change is already upstream) also
  stops: it drops out of the series only by a person's decision, with the
  evidence the fix catalog asks for (its proving tests pass on stock NEW,
  its ``fix.toml`` names the upstream commit or PR; docs/adding-a-fix.md),
  never
  silently (``--reapply-cherry-picks --empty=ask``);
* only a finished rebase writes ``patches/NEW/`` (``series.export``: staged
  beside it and renamed whole); ``patches/`` and OLD's series are never
  touched before that.

NEW's sdist may lack Keras's test files (``keras-nightly``): the work repo
then carries, in one commit on top of NEW's sdist, OLD's copies of the test
files the series changes, so the patches keep their upstream-style test
hunks. Those hunks are written against OLD's test files until checked on a
Keras git checkout; ``materialize`` leaves them out of NEW's tree
(``series.missing_tests``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from keras_fork import options
from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import series

OLD_PRISTINE = "old-pristine"
SDIST_TAG = "sdist"


def add_arguments(p) -> None:
    """The ``rebase`` verb's options."""
    options.add_base(p, "the base the series is on")
    p.add_argument("--to", required=True, help="the pinned base to move to")
    p.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="after resolving a stop in build/rebase/<NEW>: go on, export",
    )


def work_dir(layout: pins.Layout, new: pins.Base) -> Path:
    """Where the rebase of a series onto ``new`` happens."""
    return layout.build / "rebase" / new.version


def _scaffold_tests(work: Path, old_tree: Path, patches, env) -> int:
    """Commits OLD's copies of the test files ``patches`` change that the
    new sdist lacks; returns how many (no commit when 0)."""
    files = sorted({f for p in patches for f in series.missing_tests(work, p)})
    for f in files:
        blob = series.git(old_tree, "show", f"{series.PRISTINE_TAG}:{f}")
        (work / f).parent.mkdir(parents=True, exist_ok=True)
        (work / f).write_text(blob)
    if files:
        series.git(work, "add", *files, env=env)
        series.git(
            work,
            "commit",
            "-q",
            "-m",
            "Test files of the old base that the series changes\n\n"
            "The new base's sdist ships no test files; these give the "
            "series' test hunks their context.",
            env=env,
        )
    return len(files)


def start(layout: pins.Layout, old: pins.Base, new: pins.Base) -> Path:
    """Sets up ``build/rebase/<NEW>`` and starts the rebase.

    The repo's ``sdist`` tag is NEW's pristine sdist, ``pristine`` the
    commit the series goes onto (``sdist`` plus the test scaffold, if
    any), ``old-pristine`` OLD's sdist and branch ``main`` the series.

    Returns:
        The work repo.

    Raises:
        ForkError: an unknown base, OLD's tree cannot be materialized, or
            NEW's sdist cannot be fetched or fails its sha256.
    """
    old_tree = series.materialize(layout, old)
    patches = series.read_series(layout, old)
    archive = sdist_lib.fetch(layout, new)
    env = series.git_env(sdist_lib.source_date_epoch(archive, new))
    work = work_dir(layout, new)
    if work.exists():
        shutil.rmtree(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    series.init_pristine(work, new, archive, env)
    series.git(work, "tag", "-f", SDIST_TAG, env=env)
    if _scaffold_tests(work, old_tree, patches, env):
        series.git(work, "tag", "-f", series.PRISTINE_TAG, env=env)
    series.git(
        work,
        "fetch",
        "-q",
        str(old_tree),
        f"main:refs/heads/{old.version}",
        f"refs/tags/{series.PRISTINE_TAG}:refs/tags/{OLD_PRISTINE}",
        env=env,
    )
    series.git(work, "checkout", "-q", "-B", "main", old.version, env=env)
    return work


def _rebase(work: Path, env, *args: str) -> bool:
    """Runs ``git rebase <args>``; True when it finished."""
    proc = process.run_git(
        work,
        "-c",
        "core.editor=true",
        "rebase",
        *args,
        env=dict(env, GIT_EDITOR="true"),
    )
    return proc.returncode == 0 and not _in_progress(work)


def _in_progress(work: Path) -> bool:
    git_dir = work / ".git"
    return (git_dir / "rebase-merge").exists() or (
        git_dir / "rebase-apply"
    ).exists()


def conflict_hunks(text: str) -> list[tuple[int, int]]:
    """``(first, last)`` line numbers (1-based) of each conflicted hunk of a
    file's text: from its ``<<<<<<<`` line to its ``>>>>>>>`` line."""
    hunks, first = [], None
    for n, line in enumerate(text.splitlines(), start=1):
        if line.startswith("<<<<<<< "):
            first = n
        elif line.startswith(">>>>>>> ") and first is not None:
            hunks.append((first, n))
            first = None
    return hunks


def describe_stop(work: Path) -> str:
    """What stopped the rebase in ``work``: the patch (number of total and
    subject), then each conflicted file with its hunks' line ranges, or
    that the patch became empty."""
    state = work / ".git" / "rebase-merge"
    done = (state / "msgnum").read_text().strip()
    total = (state / "end").read_text().strip()
    subject = series.git(work, "log", "-1", "--format=%s", "REBASE_HEAD")
    lines = [f"patch {done}/{total} {subject.strip()!r}"]
    unmerged = series.git(work, "diff", "--name-only", "--diff-filter=U")
    # "DU": deleted on the new base (the side rebased onto), changed by the
    # patch (git status's porcelain codes).
    gone = {
        line[3:]
        for line in series.git(work, "status", "--porcelain").splitlines()
        if line.startswith("DU ")
    }
    for f in unmerged.split():
        if f in gone:
            where = "deleted or moved on the new base; the patch changes it"
        else:
            hunks = conflict_hunks((work / f).read_text(errors="replace"))
            where = ", ".join(f"lines {a}-{b}" for a, b in hunks)
        lines.append(f"  conflict in {f}: {where or 'whole file'}")
    if not unmerged.split():
        lines.append(
            "  the patch is empty on the new base: its change is already "
            "upstream. Drop it (`git rebase --skip`) only with evidence: its "
            "proving tests pass on stock, and its fix.toml names the "
            "upstream commit or PR (docs/upstream.md)"
        )
    return "\n".join(lines)


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork rebase``: see the module docstring.

    Returns:
        0 when the series was moved and exported to ``patches/<NEW>/``; 1
        when the rebase stopped (printed: patch, files, hunks, what next).

    Raises:
        ForkError: unknown bases, the same base twice, ``--continue``
            without a rebase to continue, or ``patches/<NEW>/`` already
            holding a series (it is never overwritten by a rebase).
    """
    old = pins.get_base(layout, args.base)
    new = pins.get_base(layout, args.to)
    if old.version == new.version:
        raise ForkError(f"--base and --to are both {old.version}")
    dest = series.series_dir(layout, new)
    if any(dest.glob("*.patch")):
        raise ForkError(
            f"{dest} already holds a series; move it away to rebase "
            f"{old.version}'s series onto {new.version}"
        )
    work = work_dir(layout, new)
    env = series.git_env(0)
    if args.resume:
        if not (work / ".git").is_dir():
            raise ForkError(f"no rebase to continue in {work}")
        finished = not _in_progress(work) or _rebase(work, env, "--continue")
    else:
        work = start(layout, old, new)
        finished = _rebase(
            work,
            env,
            "--reapply-cherry-picks",
            "--empty=ask",
            "--committer-date-is-author-date",
            "--onto",
            series.PRISTINE_TAG,
            OLD_PRISTINE,
            "main",
        )
    if not finished:
        print(f"rebase of {old.version}'s series onto {new.version} stopped:")
        print(describe_stop(work))
        print(
            f"Resolve in {work} (edit, `git add`), then run `python -m "
            f"keras_fork rebase --base {old.version} --to {new.version} "
            "--continue`."
        )
        return 1
    names = series.export(work, dest)
    print(f"moved {len(names)} patches onto {new.version}: {dest}")
    return 0
