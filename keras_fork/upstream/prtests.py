"""Each PR's test hunks rewritten to apply alone on a Keras checkout
(``python -m keras_fork pr-tests``).

A series is a chain: patch k's hunks in a test file are written against
that file as patches 1..k-1 left it. Most PRs append their tests at the
end of the same class (``distribute_test.py``), so patch k's context is
patch k-1's last test and it does not apply alone on master, which is
how upstream takes PRs (docs/upstream.md). For a base without test files (the
nightly), the test hunks are only ever applied to a checkout, so they
can be rewritten against it: for each patch and test file, the change
patch k makes to the file (``before`` -> ``after`` in the chain) is
carried over to the checkout's own file (``alone_lines``), and the
patch's test-file diffs are replaced by the diffs against the
checkout's files. The source hunks and the message are kept byte for
byte.
"""

from __future__ import annotations

import difflib
import re
import tempfile
from pathlib import Path

from keras_fork import options
from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.outputs import write_atomic
from keras_fork.recipe import pins
from keras_fork.recipe import series
from keras_fork.upstream import checkout

_DIFF = re.compile(r"(?m)^(?=diff --git )")


def alone_lines(pristine: list[str], before: list[str], after: list[str]):
    """``pristine`` with the change ``before`` -> ``after`` carried over.

    ``before`` is ``pristine`` with earlier patches' changes; ``after`` is
    ``before`` with this patch's. Each block this patch inserts goes after
    the nearest line above it that ``pristine`` has too (so a test
    appended after earlier patches' tests is appended to ``pristine``);
    each line it replaces or deletes must be one ``pristine`` has.

    Args:
        pristine, before, after: files as lists of lines (with newlines).

    Returns:
        The lines of the file with this patch's change alone.

    Raises:
        ForkError: the patch changes a line that an earlier patch added
            (it depends on that patch; it cannot go alone).
    """
    to_pristine = {}
    matcher = difflib.SequenceMatcher(None, before, pristine, autojunk=False)
    for tag, i1, i2, j1, _ in matcher.get_opcodes():
        if tag == "equal":
            to_pristine.update({i1 + d: j1 + d for d in range(i2 - i1)})
    inserts: dict[int, list[str]] = {}
    dropped = set()
    change = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in change.get_opcodes():
        if tag == "equal":
            continue
        for i in range(i1, i2):
            if i not in to_pristine:
                raise ForkError(
                    f"changes a line an earlier patch added: {before[i]!r}"
                )
            dropped.add(to_pristine[i])
        if i1 < i2:
            at = to_pristine[i1]
        else:
            k = i1 - 1
            while k >= 0 and k not in to_pristine:
                k -= 1
            at = to_pristine[k] + 1 if k >= 0 else 0
        inserts.setdefault(at, []).extend(after[j1:j2])
    out = []
    for j in range(len(pristine) + 1):
        out += inserts.get(j, [])
        if j < len(pristine) and j not in dropped:
            out.append(pristine[j])
    return out


def _blocks(text: str) -> tuple[str, list[str]]:
    """A patch file's message and its ``diff --git`` blocks."""
    head, *blocks = _DIFF.split(text)
    if not blocks:
        raise ForkError("a patch without a diff")
    return head, blocks


def _signature(text: str) -> tuple[str, str]:
    """A format-patch file split before its ``-- `` signature, if any."""
    at = text.rfind("\n-- \n")
    return (text[: at + 1], text[at + 1 :]) if at >= 0 else (text, "")


def _path(block: str) -> str:
    return block.split("\n", 1)[0].rsplit(" b/", 1)[1]


def _is_test(block: str) -> bool:
    return _path(block).endswith("_test.py")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(True) if path.exists() else []


def _union(ours: list[str], base: list[str], theirs: list[str]) -> list[str]:
    """``git merge-file --union``: both sides' changes to ``base``, kept."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp, n) for n in ("ours", "base", "theirs")]
        for path, lines in zip(paths, (ours, base, theirs)):
            path.write_text("".join(lines))
        proc = process.run_git(
            None, "merge-file", "-p", "--union", *map(str, paths)
        )
    return proc.stdout.splitlines(True)


def _alone_files(tree, commit, patch, tests, chain):
    """``{file: lines}`` of ``patch``'s test files with its change alone
    on the checkout, or None when its hunks apply there as they are;
    ``chain`` (file -> lines after the patches so far) moves on past it."""
    files = [_path(b) for b in tests]
    checkout.reset(tree, commit)
    pristine = {f: _lines(tree / f) for f in files}
    applied, errors = checkout.apply(tree, "".join(tests))
    if applied:  # already alone; as it is when the plain apply took it
        alone = {f: _lines(tree / f) for f in files}
        for f in files:
            chain[f] = _union(chain.get(f, pristine[f]), pristine[f], alone[f])
        return alone if errors else None
    checkout.reset(tree, commit)
    for f in files:
        (tree / f).write_text("".join(chain.get(f, pristine[f])))
    before = {f: _lines(tree / f) for f in files}
    applied, errors = checkout.apply(tree, "".join(tests))
    if not applied:
        raise ForkError(
            f"{patch.name}: its test hunks do not apply: {errors[-1]}"
        )
    alone = {}
    for f in files:
        chain[f] = _lines(tree / f)
        try:
            alone[f] = alone_lines(pristine[f], before[f], chain[f])
        except ForkError as e:
            raise ForkError(f"{patch.name}, {f}: {e}") from None
    return alone


def rewrite(tree: Path, commit: str, patches: list[Path]) -> dict[Path, str]:
    """The patch files whose test hunks change, with their new text.

    A patch whose test hunks apply alone as they are is kept; one that
    applies alone by a three-way merge gets its diffs regenerated on the
    checkout; the others are taken as written on the chain of the patches
    before them.

    Args:
        tree: a worktree of the checkout (``checkout.worktree``).
        commit: its commit (reset to between patches).
        patches: the series, in order.

    Raises:
        ForkError: a patch's test hunks do not apply, alone or in the
            chain, or one depends on an earlier patch's test lines
            (``alone_lines``).
    """
    chain: dict[str, list[str]] = {}
    out = {}
    for patch in patches:
        text = patch.read_text()
        body, signature = _signature(text)
        head, blocks = _blocks(body)
        tests = [b for b in blocks if _is_test(b)]
        if not tests:
            continue
        alone = _alone_files(tree, commit, patch, tests, chain)
        if alone is None:
            continue
        checkout.reset(tree, commit)
        for f, lines in alone.items():
            (tree / f).write_text("".join(lines))
        checkout.git(tree, "add", "-N", "--", *alone)
        diff = checkout.git(tree, "diff", "--full-index", "--", *alone).stdout
        new = {_path(b): b for b in _DIFF.split(diff) if b}
        blocks = [new.get(_path(b), "") if _is_test(b) else b for b in blocks]
        if head + "".join(blocks) + signature != text:
            out[patch] = head + "".join(blocks) + signature
    return out


def add_arguments(p) -> None:
    options.add_base(p, "a base without test files")
    checkout.add_arguments(
        p,
        "a Keras git clone (not bare)",
        "base",
        "the checkout's source as it is, or the base's over it (default: base)",
    )


def main(args, layout: pins.Layout) -> int:
    """Rewrites patches/<base>/'s test hunks (all computed before any
    file is written, each file written atomically).

    Raises:
        ForkError: unknown base, a base with test files (its tests are in
            its tree: ``export`` writes them), bad repository or revision,
            a patch whose tests cannot go alone.
    """
    base = pins.get_base(layout, args.base)
    if base.sdist_tests:
        raise ForkError(
            f"{base.version} ships its test files: its series' test hunks "
            "come from its tree (export), not from a checkout"
        )
    patches = series.read_series(layout, base)
    with checkout.worktree(
        args.upstream_repo, args.rev, args.source, layout, base
    ) as (tree, commit):
        new = rewrite(tree, commit, patches)
    for patch, text in new.items():
        write_atomic(patch, text)
        print(f"rewrote {patch.name}")
    print(f"pr-tests: {len(new)} of {len(patches)} patches rewritten")
    return 0
