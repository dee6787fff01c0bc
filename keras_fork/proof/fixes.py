"""The fix catalog: one folder a fix, ``integration_tests/fixes/<id>/``.

Each folder holds the fix's proof tests (``test_*.py``, marked
``@pytest.mark.fix("<id>")``) and its ``fix.toml``:

* ``id``: the fix id, the value of the ``Fork-Fix:`` trailer of its
  patches; the folder is the id with ``-`` as ``_`` (a Python package, so
  that worker processes can import the tests by module name);
* ``issue``: the upstream issue, ``owner/repo#N``;
* ``bases``: the bases whose series carry it (or, where upstream already
  has it, whose proof cells guard it);
* ``summary``: one line, for the fix table; ``notice``: what a user of the
  wheel notices; ``upstream`` (optional): where upstream stands, when the
  patches' trailers do not say it all;
* ``[changed_upstream_tests."<V>"]`` (optional): ``"<test id>" = "<why>"``
  for upstream tests of base V that the fix fails on purpose (see
  ``Fix``);
* ``[cells]``: ``"<backend>/<topology>" = "proven" | "guard" |
  "n/a: <reason>"`` for every cell of ``harness.topologies.TOPOLOGIES``,
  holding on each base; ``[base_cells."<V>"]`` replaces some on one base.
  ``"n/a: @<name>"`` is a reason shared by several fixes, from
  ``integration_tests/fixes/reasons.toml``;
* ``[prerequisites]`` (optional): ``"<backend>/<topology>" = ["<fix>",
  ...]``, the fixes a cell's scenario needs before it can show this fix's
  bug (e.g. ``multiworker-fit`` for ``fit`` under MultiWorkerMirrored).
  The cell's stock side is then stock plus exactly those fixes' patches
  (``Cell.stock_side``, built by ``variants.install_prerequisites``), so a
  proven cell proves its own fix, not another's bug;
  ``[base_prerequisites."<V>"]`` replaces some on one base (``[]``: none).

The proof matrix (``Cell``) is the cells of every fix on every base.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from integration_tests.harness import topologies
from keras_fork.errors import ForkError
from keras_fork.errors import check_known

EXPECTS = ("proven", "guard")
# A cell's verdicts (``verdict``), in report order; the problems make a
# prove run exit 1.
GUARD_FAILED = "guard-failed-on-stock"
PROBLEMS = ("vacuous", GUARD_FAILED, "broken")
VERDICTS = ("proven", "guard", "n/a", *PROBLEMS)
REASONS_FILE = "reasons.toml"
FIX_FILE = "fix.toml"


@dataclasses.dataclass(frozen=True)
class Fix:
    """One fix, as its ``fix.toml`` declares it (see the module doc).

    Attributes:
        cells: ``{base: {"<backend>/<topology>": "proven" | "guard" |
            "n/a: <reason>"}}`` with shared reasons expanded.
        folder: the fix's folder (its proof tests live there).
        changed_upstream_tests: ``{base: {test id: why}}``, upstream tests of
            a base that fail with the fix on purpose (a deliberate behaviour
            change, e.g. a backport of a newer default whose upstream commit
            changed that assertion); the ``regressions`` verb reports them
            apart.
        prerequisites: ``{base: {"<backend>/<topology>": (fix id, ...)}}``,
            the fixes each cell's stock side carries (see the module doc).
    """

    id: str
    issue: str
    bases: tuple[str, ...]
    summary: str
    notice: str
    upstream: str
    cells: dict
    folder: Path
    changed_upstream_tests: dict = dataclasses.field(default_factory=dict)
    prerequisites: dict = dataclasses.field(default_factory=dict)


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
    needs: tuple[str, ...] = ()  # the prerequisites of its stock side

    @property
    def stock_side(self) -> str:
        """What the cell's stock run imports: ``stock``, or stock plus its
        prerequisites, e.g. ``stock+multiworker-fit``."""
        return "+".join(("stock", *self.needs))

    @property
    def key(self) -> tuple:
        return (self.base, self.fix, self.backend, self.topology)

    @property
    def slug(self) -> str:
        return f"{self.base}-{self.fix}-{self.backend}-{self.topology}"


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ForkError(f"{path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ForkError(f"{path} is not valid TOML: {e}") from None


def load_reasons(folder: Path) -> dict[str, str]:
    """The shared n/a reasons, ``{name: text}``, of ``folder/reasons.toml``
    (empty when there is none)."""
    path = folder / REASONS_FILE
    if not path.is_file():
        return {}
    return dict(_read_toml(path).get("reasons", {}))


def _expand(path: Path, where: str, value, reasons: dict) -> str:
    if not isinstance(value, str):
        raise ForkError(f"{path}: cell {where}: {value!r} is not a string")
    head, sep, reason = value.partition(":")
    reason = reason.strip()
    if head == "n/a" and sep and reason.startswith("@"):
        if reason[1:] not in reasons:
            raise ForkError(
                f"{path}: cell {where}: no shared reason {reason!r} in "
                f"{REASONS_FILE}; known: {sorted(reasons)}"
            )
        return f"n/a: {reasons[reason[1:]]}"
    return value


def load_fix(path: Path, reasons: dict) -> Fix:
    """Reads one ``fix.toml``.

    Raises:
        ForkError: a missing key, a folder that is not named after the id,
            an unknown shared reason, or ``base_cells`` for a base the fix
            does not list.
    """
    data = _read_toml(path)
    missing = [k for k in ("id", "issue", "bases", "summary") if k not in data]
    if missing:
        raise ForkError(f"{path}: missing {', '.join(missing)}")
    fid = data["id"]
    if path.parent.name != fid.replace("-", "_"):
        raise ForkError(
            f"{path}: the folder of fix {fid!r} must be named "
            f"{fid.replace('-', '_')!r}"
        )
    bases = tuple(data["bases"])
    changed = data.get("changed_upstream_tests", {})
    stray = sorted(set(changed) - set(bases))
    if stray:
        raise ForkError(
            f"{path}: changed_upstream_tests for {stray}, not in its bases"
        )
    cells = _per_base(path, data, "cells", "base_cells", bases)
    cells = {
        base: {w: _expand(path, w, v, reasons) for w, v in table.items()}
        for base, table in cells.items()
    }
    needs = _per_base(path, data, "prerequisites", "base_prerequisites", bases)
    for base, table in needs.items():
        stray = sorted(set(table) - set(cells[base]))
        if stray:
            raise ForkError(f"{path}: prerequisites of no cell: {stray}")
    return Fix(
        id=fid,
        issue=data["issue"],
        bases=bases,
        summary=data["summary"],
        notice=data.get("notice", ""),
        upstream=data.get("upstream", ""),
        cells=cells,
        folder=path.parent,
        changed_upstream_tests=changed,
        prerequisites={
            base: {w: _prerequisites(path, fid, w, v) for w, v in t.items()}
            for base, t in needs.items()
        },
    )


def _per_base(path: Path, data: dict, table: str, by_base: str, bases):
    """``{base: table}`` of a fix.toml table that ``[<by_base>."<V>"]``
    overrides key by key on base V.

    Raises:
        ForkError: an override for a base the fix does not list.
    """
    overrides = data.get(by_base, {})
    stray = sorted(set(overrides) - set(bases))
    if stray:
        raise ForkError(
            f"{path}: {by_base} for {stray}, not in its bases {list(bases)}"
        )
    return {
        base: {**data.get(table, {}), **overrides.get(base, {})}
        for base in bases
    }


def _prerequisites(path: Path, fid: str, where: str, value) -> tuple:
    """A cell's prerequisite fix ids, checked: a list of other fixes' ids.

    Raises:
        ForkError: not a list of strings, or the fix itself listed.
    """
    if not isinstance(value, list) or not all(
        isinstance(v, str) for v in value
    ):
        raise ForkError(
            f"{path}: prerequisites of {where}: {value!r} is not a list of "
            "fix ids"
        )
    if fid in value:
        raise ForkError(
            f"{path}: {where}: {fid} cannot be its own prerequisite"
        )
    return tuple(value)


def load_fixes(folder: Path) -> list[Fix]:
    """Every fix of ``folder`` (``integration_tests/fixes``), by folder name.

    Raises:
        ForkError: see ``load_fix``; two folders declaring the same id.
    """
    reasons = load_reasons(folder)
    fixes = [load_fix(p, reasons) for p in sorted(folder.glob(f"*/{FIX_FILE}"))]
    ids = [f.id for f in fixes]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ForkError(f"{folder}: fix ids declared twice: {twice}")
    for fix in fixes:
        for base, table in fix.prerequisites.items():
            unknown = sorted(
                {n for need in table.values() for n in need} - set(ids)
            )
            if unknown:
                raise ForkError(
                    f"{fix.folder / FIX_FILE}: unknown prerequisite fix "
                    f"{', '.join(unknown)} on {base}; known: {', '.join(ids)}"
                )
    return fixes


def fix_cells(fix: Fix) -> list[Cell]:
    """The matrix cells of ``fix``, on each of its bases.

    Raises:
        ForkError: an unknown backend/topology, or an invalid expectation.
    """
    cells = []
    for base, table in fix.cells.items():
        for where, value in table.items():
            cells.append(_cell(fix, base, where, value))
    return cells


def _cell(fix: Fix, base: str, where: str, value: str) -> Cell:
    path = fix.folder / FIX_FILE
    backend, _, topology = where.partition("/")
    expect, reason = value, ""
    if value.startswith("n/a"):
        expect, reason = "n/a", value.partition(":")[2].strip()
        if not reason:
            raise ForkError(f"{path}: {where}: n/a needs a reason")
    elif value not in EXPECTS:
        raise ForkError(
            f"{path}: {where}: expectation {value!r} is not one of "
            f"{EXPECTS} or 'n/a: <reason>'"
        )
    elif not topologies.known(backend, topology):
        raise ForkError(
            f"{path}: unknown cell {where}; known: "
            f"{sorted('/'.join(k) for k in topologies.TOPOLOGIES)}"
        )
    needs = fix.prerequisites.get(base, {}).get(where, ())
    return Cell(
        base, fix.id, fix.issue, backend, topology, expect, reason, needs
    )


def load_matrix(folder: Path) -> list[Cell]:
    """The proof matrix: every cell of every fix of ``folder``.

    Raises:
        ForkError: see ``load_fixes`` and ``fix_cells``.
    """
    return [c for fix in load_fixes(folder) for c in fix_cells(fix)]


def missing_cells(fix: Fix) -> dict[str, list[str]]:
    """``{base: ["<backend>/<topology>", ...]}`` of the topologies a fix
    declares no cell for (every one needs a cell, ``n/a`` with a reason
    where it does not apply); empty when none is missing."""
    known = {"/".join(k) for k in topologies.TOPOLOGIES}
    out = {}
    for base, table in fix.cells.items():
        missing = sorted(known - set(table))
        if missing:
            out[base] = missing
    return out


FILTERS = ("base", "fix", "backend", "topology")


def select(cells: list[Cell], args) -> list[Cell]:
    """Cells matching every given filter (``args.base``, ``.fix``,
    ``.backend``, ``.topology``: each a list or None).

    Raises:
        ForkError: a filter value that no cell has (named, with the valid
            values), or filters that each match but not together (e.g. a
            fix on a base that does not carry it: the fix's bases are
            named).
    """
    wanted = {name: getattr(args, name, None) or [] for name in FILTERS}
    for name, values in wanted.items():
        check_known(f"--{name}", values, {getattr(c, name) for c in cells})
    chosen = [
        c
        for c in cells
        if all(getattr(c, n) in v for n, v in wanted.items() if v)
    ]
    if not chosen:
        raise ForkError(_no_match(cells, wanted))
    return chosen


def _no_match(cells: list[Cell], wanted: dict) -> str:
    """Why filters whose values each exist select no cell together: for
    each chosen fix, where its cells are."""
    given = " ".join(f"--{n} {v}" for n, vs in wanted.items() for v in vs)
    lines = [f"no matrix cell matches {given}"]
    for fix in wanted["fix"]:
        own = [c for c in cells if c.fix == fix]
        for name in ("base", "backend", "topology"):
            have = sorted({getattr(c, name) for c in own})
            if wanted[name] and not set(wanted[name]) & set(have):
                lines.append(f"fix {fix} has cells on {name} {', '.join(have)}")
    return "; ".join(lines)


def verdict(
    expect: str,
    stock: str | None,
    fork: str | None,
    stock_passed: tuple[str, ...] = (),
    *,
    stock_skipped: tuple[str, ...] = (),
    fork_passed: tuple[str, ...] = (),
) -> str:
    """The cell verdict from the two variant outcomes (the contract of
    ``dist/proof.json``).

    Args:
        expect: ``proven``, ``guard`` or ``n/a``.
        stock, fork: ``pass``, ``fail``, ``error`` or None (not run).
        stock_passed: the proof tests that passed on stock. In a ``proven``
            cell every proof test must fail on stock: one that passes there
            is ``vacuous`` even when another test of the cell failed.
        stock_skipped: the proof tests skipped on stock, and
            ``fork_passed`` those that passed on the fork: in a ``proven``
            cell a test in both proves nothing on stock, so the cell is
            ``vacuous``.

    Returns:
        ``proven``; ``guard``; ``n/a``; ``vacuous``; ``broken`` (the fork
        fails, or stock could not run its tests); or
        ``guard-failed-on-stock`` (``GUARD_FAILED``): a ``guard`` cell that
        fails on stock, never counted as ``proven``, since the declaration
        or the stock run is wrong.
    """
    if expect == "n/a":
        return "n/a"
    if fork in ("fail", "error"):
        return "broken"
    if fork is None or stock is None:
        return "n/a"
    if expect == "proven" and set(stock_skipped) & set(fork_passed):
        return "vacuous"
    if stock == "error":
        return "broken"
    if stock == "fail" and expect == "guard":
        return GUARD_FAILED
    if stock == "fail":
        return "vacuous" if stock_passed else "proven"
    return "guard" if expect == "guard" else "vacuous"


def skipped_on_stock(stock_run: dict, fork_run: dict) -> list[str]:
    """The proof tests of a cell that were skipped on stock and passed on
    the fork (``groups.cell_result``'s ``skipped_tests`` and
    ``passed_tests`` of each run), in the stock run's order."""
    passed = set(fork_run.get("passed_tests", ()))
    return [t for t in stock_run.get("skipped_tests", ()) if t in passed]


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
