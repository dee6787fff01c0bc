"""The proof matrix: the cells of every fix of the catalog on every base.

The catalog is one folder a fix, ``integration_tests/fixes/<id>/``, with
its proof tests and its ``fix.toml``, read by
``integration_tests.harness.catalog`` (which documents the format), so
that the proof tests' own runner (``harness.verify``) and this tool read
it the same way. Here each ``[cells]`` entry becomes a ``Cell``, checked
against ``harness.topologies.TOPOLOGIES``, with its stock side.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from integration_tests.harness import catalog
from integration_tests.harness import topologies
from integration_tests.harness.catalog import FIX_FILE
from integration_tests.harness.catalog import Fix
from keras_fork.errors import ForkError
from keras_fork.errors import check_known

EXPECTS = ("proven", "guard")
# The upstream-style unit tests a fix's patches add are a kind of test, not
# a topology: Keras's own test files, run on topology ``1`` (one device);
# stock runs only the added tests (they must fail), the fork every test
# file the patches touch (all must pass). Their cells keep the key
# ``<backend>/unit`` in fix.toml and proof.json (a stable contract).
UNIT = "unit"
BACKENDS = topologies.BACKENDS


def cell_keys() -> set[str]:
    """Every ``"<backend>/<topology>"`` a fix needs a cell for: each
    topology of ``harness.topologies.TOPOLOGIES``, and ``<backend>/unit``
    for each backend."""
    keys = {"/".join(k) for k in topologies.TOPOLOGIES}
    return keys | {f"{b}/{UNIT}" for b in BACKENDS}


def device_topology(topology: str) -> str:
    """The topology a cell's tests run on: ``1`` for the unit kind, else
    the cell's own."""
    return "1" if topology == UNIT else topology


# A cell's verdicts (``verdict``), in report order; the problems make a
# prove run exit 1.
GUARD_FAILED = "guard-failed-on-stock"
PROBLEMS = ("vacuous", GUARD_FAILED, "broken")
VERDICTS = ("proven", "guard", "n/a", *PROBLEMS)


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


def load_fixes(folder: Path) -> list[Fix]:
    """Every fix of ``folder`` (``catalog.load_fixes``).

    Raises:
        ForkError: a ``fix.toml`` that ``catalog`` cannot read (its
            ``CatalogError``, same message).
    """
    try:
        return catalog.load_fixes(folder)
    except catalog.CatalogError as e:
        raise ForkError(str(e)) from None


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
    elif where not in cell_keys():
        raise ForkError(
            f"{path}: unknown cell {where}; known: {sorted(cell_keys())}"
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
    known = cell_keys()
    out = {}
    for base, table in fix.cells.items():
        missing = sorted(known - set(table))
        if missing:
            out[base] = missing
    return out


FILTERS = ("base", "fix", "backend", "topology")


def select(cells: list[Cell], args) -> list[Cell]:
    """Cells matching every given filter (``args.base``, ``.fix``,
    ``.backend``, ``.topology``: each a list or None), less those on a
    topology of ``args.skip_topology`` (a list or None).

    Raises:
        ForkError: a filter value that no cell has (named, with the valid
            values), or filters that each match but not together (e.g. a
            fix on a base that does not carry it: the fix's bases are
            named).
    """
    wanted = {name: getattr(args, name, None) or [] for name in FILTERS}
    for name, values in wanted.items():
        check_known(f"--{name}", values, {getattr(c, name) for c in cells})
    skipped = getattr(args, "skip_topology", None) or []
    check_known("--skip-topology", skipped, {c.topology for c in cells})
    chosen = [
        c
        for c in cells
        if all(getattr(c, n) in v for n, v in wanted.items() if v)
        and c.topology not in skipped
    ]
    if not chosen:
        skip = "".join(f" --skip-topology {t}" for t in skipped)
        raise ForkError(_no_match(cells, wanted) + skip)
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
        gpus: GPUs this process may use (``run.visible_gpus``).

    Returns:
        The cells in the same order; cells already ``n/a`` keep their
        reason.
    """
    out = []
    for c in cells:
        topology = device_topology(c.topology)
        why = topologies.gpu_shortfall(c.backend, topology, gpus)
        if c.expect != "n/a" and why:
            c = dataclasses.replace(c, expect="n/a", reason=why)
        out.append(c)
    return out
