"""The runs of a prove: one pytest process per base, variant, backend and
topology, and each cell's result read off its run.

A cell's verdict stays its own: a run records every case's fix (the JUnit
``fix`` property, ``harness.selection``) or test file (unit runs), so one
fix's failing test fails only that fix's cells. A run that could not run
its tests (a test hung past every timeout, a crash, a collection error) is
split (``after_error``): the test that started and never ended names the
cell that hung or crashed it, and every other cell runs again on its own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from integration_tests.harness import topologies
from integration_tests.harness.selection import is_added_test
from keras_fork.proof.cells import Cell
from keras_fork.recipe import pins


@dataclasses.dataclass(frozen=True)
class UnitTests:
    """The upstream-style unit tests a fix's patches add.

    Attributes:
        files: the touched ``*_test.py`` files, in the materialized tree.
        names: the added test functions (``test_...``).
    """

    files: tuple[Path, ...]
    names: tuple[str, ...]


def unit_file_label(path: Path) -> str:
    """Where a unit run puts a touched Keras test file (``runner``), as
    pytest then names it relative to the run's folder: its package path
    below the tree's ``keras/src`` as one folder name, then the file, e.g.
    ``keras_src_backend_jax/trainer_test.py``, so that two test files of
    one name (``trainers/trainer_test.py``, ``backend/jax/trainer_test.py``)
    stay apart."""
    parts = path.parts
    starts = [
        i for i in range(len(parts) - 1) if parts[i : i + 2] == ("keras", "src")
    ]
    folder = parts[starts[-1] if starts else len(parts) - 1 : -1]
    return "/".join(["_".join(folder) or "tests", path.name])


def unit_tests(layout: pins.Layout, base: pins.Base, fix: str) -> UnitTests:
    """Collects the unit tests added by the patches marked ``Fork-Fix: fix``
    in the series of ``base`` (files from ``build/trees/<version>``)."""
    from keras_fork.recipe import patchfile
    from keras_fork.recipe import series

    files, names = [], []
    for patch in series.read_series(layout, base):
        info = patchfile.parse_patch(patch)
        if fix not in info.fixes:
            continue
        for test in info.added_tests():
            path, _, name = test.partition("::")
            f = layout.tree(base.version) / path
            if f not in files:
                files.append(f)
            names.append(name)
    return UnitTests(tuple(files), tuple(dict.fromkeys(names)))


def union(units: list[UnitTests]) -> UnitTests:
    """The files and test names of ``units``, each once, in first-seen
    order."""
    files, names = [], []
    for unit in units:
        files += [f for f in unit.files if f not in files]
        names += [n for n in unit.names if n not in names]
    return UnitTests(tuple(files), tuple(names))


@dataclasses.dataclass(frozen=True)
class Group:
    """One pytest process: ``cells`` (one base, backend and topology) on
    one variant.

    A ``unit`` group runs upstream-style tests (``unit`` is the union of
    its cells' ``units``): on stock only the added tests (they must fail),
    on the fork every test of every touched file (all must pass). Any other
    group collects its cells' fix folders, ``integration_tests/fixes/<id>/``.
    A stock group's cells share their prerequisites (``needs``): it runs on
    ``side``, stock plus those fixes' patches.
    """

    base: str
    variant: str
    backend: str
    topology: str
    cells: tuple[Cell, ...]
    units: tuple[UnitTests, ...] = ()
    needs: tuple[str, ...] = ()

    @property
    def side(self) -> str:
        """The keras this group imports: ``fork``, ``stock`` or
        ``stock+<prerequisite>...`` (``Cell.stock_side``)."""
        return "+".join((self.variant, *self.needs))

    @property
    def slug(self) -> str:
        if len(self.cells) == 1:
            return f"{self.cells[0].slug}-{self.side}"
        return f"{self.base}-{self.backend}-{self.topology}-{self.side}"

    @property
    def label(self) -> str:
        return f"{self.slug} ({len(self.cells)} cells)"

    @property
    def multi_process(self) -> bool:
        return (self.backend, self.topology) in topologies.MULTI_PROCESS

    @property
    def unit(self) -> UnitTests | None:
        return union(list(self.units)) if self.units else None

    @property
    def fixes(self) -> tuple[str, ...]:
        return tuple(c.fix for c in self.cells)

    def alone(self, cell: Cell) -> "Group":
        """The group of ``cell`` alone, on this group's variant."""
        i = self.cells.index(cell)
        units = (self.units[i],) if self.units else ()
        return dataclasses.replace(self, cells=(cell,), units=units)


def plan_groups(
    cells: list[Cell], units: dict[tuple, UnitTests], variants: list[str]
) -> list[Group]:
    """The groups of the cells that run (``expect`` not ``n/a``; a unit
    cell whose patches add no test does not run), in the order of first
    appearance, one per (base, variant, backend, topology) and, on stock,
    per prerequisites (``Cell.needs``)."""
    groups: dict[tuple, list] = {}
    for cell in cells:
        unit = units.get(cell.key)
        if cell.expect == "n/a" or (unit is not None and not unit.names):
            continue
        for variant in variants:
            needs = cell.needs if variant == "stock" else ()
            key = (cell.base, variant, cell.backend, cell.topology, needs)
            groups.setdefault(key, []).append((cell, unit))
    return [
        Group(
            *key[:4],
            cells=tuple(c for c, _ in members),
            units=tuple(u for _, u in members if u is not None),
            needs=key[4],
        )
        for key, members in groups.items()
    ]


def estimate(group: Group, previous: dict) -> float:
    """Seconds ``group`` is expected to take, for longest-first ordering:
    its cells' test time in the previous ``proof.json`` (``previous``, by
    cell key), or a guess by kind (a fork unit group runs whole upstream
    test files) when one of them has none."""
    total = 0.0
    for cell in group.cells:
        seconds = previous.get(cell.key, {}).get("runs", {}).get(group.variant)
        seconds = (seconds or {}).get("seconds")
        if seconds is None:
            unit_fork = group.units and group.variant == "fork"
            return (300.0 if unit_fork else 15.0 * len(group.cells)) + 20.0
        total += seconds
    return total + 10.0


def owns(group: Group, cell: Cell, case: dict) -> bool:
    """Whether JUnit ``case`` of a run of ``group`` belongs to ``cell``.

    An integration case carries its fix. A unit case belongs to every cell
    whose patches touch its file; on stock (which runs the added tests
    only) it must also be one of the cell's added tests
    (``selection.is_added_test``).
    """
    if not group.units:
        return case.get("fix") == cell.fix
    unit = group.units[group.cells.index(cell)]
    if case["file"] not in {unit_file_label(f) for f in unit.files}:
        return False
    return group.variant == "fork" or is_added_test(case["name"], unit.names)


def cell_result(group: Group, cell: Cell, run: dict, cases: list) -> dict:
    """One cell's result, read off the run of its group.

    Args:
        group: the group that ran.
        cell: one of its cells.
        run: ``runner.run_group``'s result for ``group``, which must not
            be an ``error`` (see ``after_error``).
        cases: the run's JUnit cases (``read_junit``; one read serves
            every cell of the group).

    Returns:
        A run result for the cell alone: ``fail`` when one of its cases
        failed or errored, ``pass`` when one ran and none failed, else
        ``error``; ``seconds`` is its cases' own time, ``shared`` and
        ``shared_seconds`` name the group's run and its wall time,
        ``passed_tests`` and ``skipped_tests`` its passed and its skipped
        proof cases (for ``vacuous``).
    """
    cases = [c for c in cases if owns(group, cell, c)]
    bad = [c for c in cases if c["outcome"] in ("failure", "error")]
    skipped = sum(c["outcome"] == "skipped" for c in cases)
    ran = len(cases) - skipped
    if bad:
        outcome, detail = "fail", f"{bad[0]['name']}: {bad[0]['text']}"[:300]
    elif ran:
        outcome, detail = "pass", f"{ran} passed"
    else:
        outcome, detail = "error", "none of the cell's tests ran"
    return {
        "outcome": outcome,
        "detail": detail,
        "seconds": round(sum(c["time"] for c in cases), 1),
        "shared": run["junit"],
        "shared_seconds": run["seconds"],
        "junit": run["junit"],
        "log": run.get("log", ""),
        "counts": {
            "tests": len(cases),
            "failures": sum(c["outcome"] == "failure" for c in cases),
            "errors": sum(c["outcome"] == "error" for c in cases),
            "skipped": skipped,
        },
        "cases": [
            {k: c[k] for k in ("name", "outcome", "time", "text")}
            for c in cases
        ],
        "passed_tests": _proof_cases(cases, "passed"),
        "skipped_tests": _proof_cases(cases, "skipped"),
    }


def _proof_cases(cases: list, outcome: str) -> list[str]:
    """The names of the proof-role ``cases`` with ``outcome``."""
    return [
        c["name"]
        for c in cases
        if c["outcome"] == outcome and c["role"] == "proof"
    ]


def culprits(group: Group, nodeid: str | None) -> list[Cell]:
    """The cells a run's unfinished test (its pytest node id) belongs to:
    the fix whose folder holds it, or for a unit run the cells whose
    files hold it; none without a node id."""
    if not nodeid:
        return []
    path = Path(nodeid.split("::")[0])
    name = nodeid.split("::")[-1].split("[")[0]
    case = {"fix": None, "file": str(path), "name": name}
    if not group.units:
        case["fix"] = next(
            (
                c.fix
                for c in group.cells
                if path.parent.name == c.fix.replace("-", "_")
            ),
            None,
        )
    return [c for c in group.cells if owns(group, c, case)]


def after_error(group: Group, run: dict, unfinished: str | None):
    """What follows a group run that could not run its tests.

    Returns:
        ``(results, retries)``: an ``error`` result for each cell the
        unfinished test belongs to (it hung or crashed the run; running it
        again would do the same), naming the test; and a one-cell group for
        every other cell, to run again on its own. A one-cell group's error
        is its cell's result.
    """
    guilty = culprits(group, unfinished) or (
        list(group.cells) if len(group.cells) == 1 else []
    )
    detail = run["detail"]
    if unfinished:
        detail = f"{unfinished} did not finish: {detail}"
    results = {
        c.key: dict(run, detail=detail, cases=[], passed_tests=[])
        for c in guilty
    }
    retries = [group.alone(c) for c in group.cells if c not in guilty]
    return results, retries
