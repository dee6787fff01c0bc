"""What a series sends upstream, and what its wheel carries beyond that.

A base's series (``.patches``, the order ``git am`` applies, the wheel) is
the upstream PRs plus *carried* patches: proven fixes that upstream has not
taken (yet), applied on top of the PRs whose code they touch. Which is
which is said in one place, ``patches/<V>/submission.toml``:

.. code-block:: toml

    [[pr]]                      # one a PR, in the order they are sent
    patch = "<file>.patch"
    after = "<slug>"            # optional: waits on issues/NN-<slug>.md
    reports = "<slug>"          # optional: the bug report it fixes
    verdict = "MERGE AS IS"     # the self-review's verdict
    note = "what is left"       # optional

    [[carried]]                 # in the wheel, never a numbered PR
    patch = "<file>.patch"
    why = "why it is not a PR"
    issue = "<slug>"            # the design issue it waits on, or
    upstream = "keras-team/keras#N"   # the open upstream issue or PR it
                                      # waits on, or
    follows = "<file>.patch"    # the PR it extends, to be merged first

``patches/<V>/issues/NN-<slug>.md`` are the issues to open on
keras-team/keras, numbered by ``NN``, each starting with a ``# <title>``
line: a bug report, named by the ``reports`` of the PR that fixes it
(opened with that PR when it is sent now, which then says ``Fixes #N``;
opened at once when the fix waits on a design issue), or else a design
issue, opened before the PRs that wait on it (Keras CONTRIBUTING: a
complex PR without a prior issue may be closed).

The PRs are numbered 1, 2, ... in file order; every PR to send now comes
before every PR that waits on a design issue, so the PRs to send now are
``0001`` to ``000k`` of ``dist/pr-series/<V>/`` and the waiting ones keep
their numbers under ``pending/``. A base without ``submission.toml`` (a
release base, whose PR series is the whole tree) sends its series as it
applies and carries nothing beyond it.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from keras_fork.errors import ForkError
from keras_fork.recipe import patchfile
from keras_fork.recipe import series
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout

SUBMISSION_FILE = "submission.toml"
ISSUES_DIR = "issues"
_ISSUE_NAME = re.compile(r"^(\d\d)-([a-z0-9-]+)\.md$")
_UPSTREAM_REF = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")


@dataclasses.dataclass(frozen=True)
class DesignIssue:
    """An issue to open upstream, ``issues/NN-<slug>.md``: a design issue,
    or a bug report when a PR ``reports`` it (``Submission.bug_reports``)."""

    number: int
    slug: str
    path: Path

    @property
    def title(self) -> str:
        """The issue's title: its file's first line, without ``# ``."""
        first = self.path.read_text().splitlines()[:1] or [""]
        return first[0].removeprefix("# ").strip()

    @property
    def label(self) -> str:
        """``issue NN`` (the file name's number, two digits)."""
        return f"issue {self.number:02d}"


@dataclasses.dataclass(frozen=True)
class PR:
    """A patch sent upstream as a PR, numbered in submission order."""

    number: int
    patch: Path
    after: DesignIssue | None
    verdict: str
    note: str
    reports: DesignIssue | None = None


@dataclasses.dataclass(frozen=True)
class Carried:
    """A patch the wheel carries that is not a PR: it waits on a design
    issue (``issue``), on an open upstream issue or PR (``upstream``:
    one whose question is already asked there, or a PR it duplicates), or
    on a PR of the series that it extends (``follows``: a part left out of
    that PR to keep its review narrow, offered once the PR is merged)."""

    patch: Path
    why: str
    issue: DesignIssue | None
    upstream: str
    follows: PR | None = None

    @property
    def waits_on(self) -> str:
        """What it waits on, in words: ``issue NN (<title>)``, the
        upstream issue or PR, or ``PR k (<patch file>) merged first``."""
        if self.issue:
            return f"{self.issue.label} ({self.issue.title})"
        if self.follows:
            name = self.follows.patch.name
            return f"PR {self.follows.number} ({name}) merged first"
        return self.upstream


@dataclasses.dataclass(frozen=True)
class Submission:
    """A base's series split into PRs and carried patches."""

    prs: tuple[PR, ...]
    carried: tuple[Carried, ...]
    issues: tuple[DesignIssue, ...]

    @property
    def send_now(self) -> tuple[PR, ...]:
        """The PRs that wait on no design issue, numbered 1 to k."""
        return tuple(p for p in self.prs if p.after is None)

    @property
    def pending(self) -> tuple[PR, ...]:
        """The PRs that wait on a design issue."""
        return tuple(p for p in self.prs if p.after is not None)

    @property
    def bug_reports(self) -> tuple[DesignIssue, ...]:
        """The issues a PR fixes (its ``reports``)."""
        return tuple(i for i in self.issues if self.fixed_by(i))

    @property
    def design_issues(self) -> tuple[DesignIssue, ...]:
        """The issues that are not bug reports."""
        return tuple(i for i in self.issues if not self.fixed_by(i))

    def fixed_by(self, issue: DesignIssue) -> PR | None:
        """The PR whose ``reports`` is ``issue``, or None."""
        return next((p for p in self.prs if p.reports == issue), None)

    def kind_of(self, name: str) -> str | None:
        """``"pr"``, ``"carried"`` or None for a patch file name."""
        if any(p.patch.name == name for p in self.prs):
            return "pr"
        if any(c.patch.name == name for c in self.carried):
            return "carried"
        return None

    def waiting_on(self, issue: DesignIssue) -> list[str]:
        """What waits on ``issue``, one phrase each: ``PR k: <subject>`` or
        ``carried: <subject>``."""
        out = [
            f"PR {p.number}: {patchfile.parse_patch(p.patch).subject}"
            for p in self.pending
            if p.after == issue
        ]
        out += [
            f"carried in the fork's wheel: "
            f"{patchfile.parse_patch(c.patch).subject}"
            for c in self.carried
            if c.issue == issue
        ]
        return out


def read_issues(folder: Path) -> tuple[DesignIssue, ...]:
    """The design issues of a series folder, by number.

    Raises:
        ForkError: a file of ``issues/`` is not named ``NN-<slug>.md``, or
            two share a number or a slug.
    """
    where = folder / ISSUES_DIR
    if not where.is_dir():
        return ()
    issues = []
    for path in sorted(where.iterdir()):
        m = _ISSUE_NAME.match(path.name)
        if not m:
            raise ForkError(f"{path}: name a design issue NN-<slug>.md")
        issues.append(DesignIssue(int(m[1]), m[2], path))
    for attr in ("number", "slug"):
        values = [getattr(i, attr) for i in issues]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ForkError(f"{where}: design issues share a {attr}: {twice}")
    return tuple(issues)


def read(layout: Layout, base: Base) -> Submission:
    """``base``'s series as PRs and carried patches (module docstring).

    Raises:
        ForkError: ``submission.toml`` is not valid TOML, names a patch that
            is not in ``.patches`` or names one twice, leaves one out, names
            an unknown design issue, has a carried patch without ``why`` or
            without exactly one of ``issue``/``upstream``, lists a PR to
            send now after one that waits, or a bug report that two PRs
            report or that a PR or carried patch waits on; ``read_series``
            errors. Each
            message names the file.
    """
    chain = series.read_series(layout, base)
    folder = series.series_dir(layout, base)
    path = folder / SUBMISSION_FILE
    if not path.is_file():
        prs = tuple(PR(k, p, None, "", "") for k, p in enumerate(chain, 1))
        return Submission(prs, (), read_issues(folder))
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ForkError(f"{path}: {e}") from None
    issues = read_issues(folder)
    try:
        return _parse(doc, {p.name: p for p in chain}, issues)
    except ForkError as e:
        raise ForkError(f"{path}: {e}") from None


def _parse(doc: dict, known: dict[str, Path], issues) -> Submission:
    """See ``read``: ``doc`` checked against the series and the issues."""
    by_slug = {i.slug: i for i in issues}
    problems = []

    def issue(slug):
        if slug is None:
            return None
        if slug not in by_slug:
            problems.append(f"no design issue {ISSUES_DIR}/NN-{slug}.md")
        return by_slug.get(slug)

    prs, carried, seen = [], [], []
    for k, entry in enumerate(doc.get("pr", []), start=1):
        seen.append(entry.get("patch", ""))
        prs.append(
            PR(
                k,
                known.get(seen[-1], Path(seen[-1])),
                issue(entry.get("after")),
                entry.get("verdict", ""),
                entry.get("note", ""),
                issue(entry.get("reports")),
            )
        )
    for entry in doc.get("carried", []):
        seen.append(entry.get("patch", ""))
        if not entry.get("why"):
            problems.append(f"carried {seen[-1]}: no why")
        follows = _follows(entry, seen[-1], prs, problems)
        carried.append(
            Carried(
                known.get(seen[-1], Path(seen[-1])),
                entry.get("why", ""),
                issue(entry.get("issue")),
                entry.get("upstream", ""),
                follows,
            )
        )
    problems += _coverage_problems(seen, known)
    reported = [p.reports for p in prs if p.reports]
    waited = {p.after for p in prs} | {c.issue for c in carried}
    for i in sorted(set(reported), key=lambda i: i.number):
        if reported.count(i) > 1:
            problems.append(f"{i.label}: reported by two PRs")
        if i in waited:
            problems.append(f"{i.label}: a bug report that something waits on")
    waiting = [p.after is not None for p in prs]
    if waiting != sorted(waiting):
        problems.append("a PR to send now follows one that waits on an issue")
    if problems:
        raise ForkError("; ".join(problems))
    return Submission(tuple(prs), tuple(carried), issues)


def _follows(entry: dict, name: str, prs: list, problems: list):
    """The PR a ``[[carried]]`` entry follows, or None; appends to
    ``problems`` an entry that names not exactly one of ``issue``,
    ``upstream`` and ``follows``, a ``follows`` that is no PR of the
    series, or an ``upstream`` that is not ``owner/repo#N``."""
    kinds = [k for k in ("issue", "upstream", "follows") if k in entry]
    if len(kinds) != 1:
        problems.append(f"carried {name}: name one of issue, upstream, follows")
    if "upstream" in entry and not _UPSTREAM_REF.match(entry["upstream"]):
        problems.append(f"carried {name}: upstream is owner/repo#N")
    if "follows" not in entry:
        return None
    follows = next((p for p in prs if p.patch.name == entry["follows"]), None)
    if follows is None:
        problems.append(
            f"carried {name}: follows {entry['follows']}, "
            "which is not a PR of the series"
        )
    return follows


def _coverage_problems(seen: list[str], known: dict[str, Path]) -> list[str]:
    """Patches named but not in the series, named twice, or left out."""
    out = [f"not in {series.ORDER_FILE}: {n}" for n in seen if n not in known]
    out += [
        f"listed twice: {n}" for n in sorted(set(seen)) if seen.count(n) > 1
    ]
    out += [f"left out: {n}" for n in known if n not in seen]
    return out


def read_submission(layout: Layout, base: Base) -> list[Path]:
    """The PRs of ``base``'s series in the order they are sent upstream
    (``read``): those to send now, then those that wait on a design issue;
    carried patches are not among them. Every PR applies alone on the
    pristine base (``series.not_alone``), so any order is one a maintainer
    can merge in.

    Raises:
        ForkError: see ``read``.
    """
    return [p.patch for p in read(layout, base).prs]


def checked_tree(layout: Layout, base: Base, sdist: Path | None = None) -> Path:
    """Materializes ``base``'s tree where it is not the series' already
    (``series.tree_of``) and checks its series, for the outputs made from
    it (the wheel, the PR series).

    Args:
        layout: where the patches, the sdist cache and the tree are.
        base: the pinned base.
        sdist: an sdist file to use instead of the cached one (``fetch``).

    Returns:
        The path of the tree.

    Raises:
        ForkError: what ``series.materialize`` raises; re-exporting the
            tree does not reproduce ``patches/<V>`` exactly (not in
            canonical form);
            or, on a ``keras-nightly`` base (master: its PRs go in one by
            one), a PR that does not apply alone.
    """
    tree = series.tree_of(layout, base, sdist)
    drift = series.check(layout, base, tree)
    if drift:
        raise ForkError(
            f"re-exporting the {base.version} tree changes {drift}: "
            f"patches/{base.version} is not in canonical form; run "
            f"`python -m keras_fork export --base {base.version}`"
        )
    if base.package == "keras-nightly":
        alone = series.not_alone(tree, read_submission(layout, base))
        if alone:
            raise ForkError(
                f"PRs of the master series {base.version} that do not "
                "apply alone on master (make each stand alone, or fold "
                "it into the PR it needs):\n  " + "\n  ".join(alone)
            )
    return tree
