"""The fix catalog as ``fix.toml`` files declare it: one folder a fix,
``fixes/<id>/`` of this package.

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
* ``[absent]`` (optional): ``"<V>" = "<why>"`` for a pinned base whose
  series does not carry the fix: fixed upstream in version X, superseded
  by another fix, the code path does not exist there, or not carried yet
  although the bug exists (a base's own ``absent`` in ``bases.toml``
  covers every fix it does not carry);
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
  (``cells.Cell.stock_side``, built by ``variants.install_prerequisites``),
  so a proven cell proves its own fix, not another's bug;
  ``[base_prerequisites."<V>"]`` replaces some on one base (``[]``: none).

The proof matrix (``Cell``) is the cells of every fix on every base.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

REASONS_FILE = "reasons.toml"
FIX_FILE = "fix.toml"


class CatalogError(ValueError):
    """A ``fix.toml`` or ``reasons.toml`` that cannot be read as the
    module doc says (the message names the file and the problem)."""


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
        absent: ``{base: why}`` for bases whose series do not carry it.
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
    absent: dict = dataclasses.field(default_factory=dict)


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{path} is not valid TOML: {e}") from None


def load_reasons(folder: Path) -> dict[str, str]:
    """The shared n/a reasons, ``{name: text}``, of ``folder/reasons.toml``
    (empty when there is none)."""
    path = folder / REASONS_FILE
    if not path.is_file():
        return {}
    return dict(_read_toml(path).get("reasons", {}))


def _expand(path: Path, where: str, value, reasons: dict) -> str:
    if not isinstance(value, str):
        raise CatalogError(f"{path}: cell {where}: {value!r} is not a string")
    head, sep, reason = value.partition(":")
    reason = reason.strip()
    if head == "n/a" and sep and reason.startswith("@"):
        if reason[1:] not in reasons:
            raise CatalogError(
                f"{path}: cell {where}: no shared reason {reason!r} in "
                f"{REASONS_FILE}; known: {sorted(reasons)}"
            )
        return f"n/a: {reasons[reason[1:]]}"
    return value


def load_fix(path: Path, reasons: dict) -> Fix:
    """Reads one ``fix.toml``.

    Raises:
        CatalogError: a missing key, a folder that is not named after the id,
            an unknown shared reason, or ``base_cells`` for a base the fix
            does not list.
    """
    data = _read_toml(path)
    missing = [k for k in ("id", "issue", "bases", "summary") if k not in data]
    if missing:
        raise CatalogError(f"{path}: missing {', '.join(missing)}")
    fid = data["id"]
    if path.parent.name != fid.replace("-", "_"):
        raise CatalogError(
            f"{path}: the folder of fix {fid!r} must be named "
            f"{fid.replace('-', '_')!r}"
        )
    bases = tuple(data["bases"])
    absent = {str(k): str(v) for k, v in data.get("absent", {}).items()}
    if set(absent) & set(bases):
        raise CatalogError(
            f"{path}: absent from {sorted(set(absent) & set(bases))}, "
            "which its bases list"
        )
    changed = data.get("changed_upstream_tests", {})
    stray = sorted(set(changed) - set(bases))
    if stray:
        raise CatalogError(
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
            raise CatalogError(f"{path}: prerequisites of no cell: {stray}")
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
        absent=absent,
        prerequisites={
            base: {w: _prerequisites(path, fid, w, v) for w, v in t.items()}
            for base, t in needs.items()
        },
    )


def _per_base(path: Path, data: dict, table: str, by_base: str, bases):
    """``{base: table}`` of a fix.toml table that ``[<by_base>."<V>"]``
    overrides key by key on base V.

    Raises:
        CatalogError: an override for a base the fix does not list.
    """
    overrides = data.get(by_base, {})
    stray = sorted(set(overrides) - set(bases))
    if stray:
        raise CatalogError(
            f"{path}: {by_base} for {stray}, not in its bases {list(bases)}"
        )
    return {
        base: {**data.get(table, {}), **overrides.get(base, {})}
        for base in bases
    }


def _prerequisites(path: Path, fid: str, where: str, value) -> tuple:
    """A cell's prerequisite fix ids, checked: a list of other fixes' ids.

    Raises:
        CatalogError: not a list of strings, or the fix itself listed.
    """
    if not isinstance(value, list) or not all(
        isinstance(v, str) for v in value
    ):
        raise CatalogError(
            f"{path}: prerequisites of {where}: {value!r} is not a list of "
            "fix ids"
        )
    if fid in value:
        raise CatalogError(
            f"{path}: {where}: {fid} cannot be its own prerequisite"
        )
    return tuple(value)


def load_fixes(folder: Path) -> list[Fix]:
    """Every fix of ``folder`` (``integration_tests/fixes``), by folder name.

    Raises:
        CatalogError: see ``load_fix``; two folders declaring the same id.
    """
    reasons = load_reasons(folder)
    fixes = [load_fix(p, reasons) for p in sorted(folder.glob(f"*/{FIX_FILE}"))]
    ids = [f.id for f in fixes]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise CatalogError(f"{folder}: fix ids declared twice: {twice}")
    for fix in fixes:
        for base, table in fix.prerequisites.items():
            unknown = sorted(
                {n for need in table.values() for n in need} - set(ids)
            )
            if unknown:
                raise CatalogError(
                    f"{fix.folder / FIX_FILE}: unknown prerequisite fix "
                    f"{', '.join(unknown)} on {base}; known: {', '.join(ids)}"
                )
    return fixes
