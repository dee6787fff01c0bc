"""The proof matrix: stock vs fork, per base x fix x backend x topology.

Each cell runs the fix's integration tests (``integration_tests/fixes/<id>/``,
marked ``@pytest.mark.fix(id)``) twice, on two variants that differ only in
which keras is first on ``PYTHONPATH`` (``variants``): ``stock``, the
pristine sdist, and ``fork``, the fork wheel. One pytest process runs every
selected cell of one base, variant, backend and topology, and each cell
reads its own cases off it (``groups``); a cell whose run could not run its
tests runs again on its own.

Verdicts (the contract of ``dist/proof.json``, ``cells.verdict``):

* ``proven``: stock fails, fork passes;
* ``guard``: passes on both where the fix's cell says ``guard``;
* ``vacuous``: a cell that must be ``proven`` passes on stock (a proof
  test passes there, or is skipped there and passes on the fork);
* ``guard-failed-on-stock``: a cell declared ``guard`` fails on stock (the
  row's ``reason`` holds the stock failure);
* ``broken``: the fork fails (or a run could not execute at all);
* ``n/a``: not run, with the reason from the fix's ``fix.toml``.

Outputs: ``dist/proof.json`` (cells, and the runs with their wall time),
``dist/proof.md``, JUnit XML, log and progress file per run under
``dist/proof/junit/``; ``--docs`` also rewrites the committed table in
``docs/proof.md``. Runs go ``--jobs`` at a time (see ``runner``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from integration_tests.harness import options
from integration_tests.harness import schedule
from integration_tests.harness.junit import read_junit
from keras_fork.errors import ForkError
from keras_fork.outputs import print_table
from keras_fork.outputs import replace_between
from keras_fork.outputs import write_atomic
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import fixes
from keras_fork.proof import groups as groups_lib
from keras_fork.proof import runner
from keras_fork.proof import variants as variants_lib
from keras_fork.proof.cells import Cell
from keras_fork.proof.variants import VARIANTS
from keras_fork.recipe import pins

DOCS_BEGIN = "<!-- proof-table:begin -->"
DOCS_END = "<!-- proof-table:end -->"
DOCS_FILE = "proof.md"


@dataclasses.dataclass
class Plan:
    """What one ``prove`` run does: its cells, where each variant lives,
    the unit tests of the unit cells, and the runs (``groups.Group``) in
    start order, longest first."""

    cells: list
    accelerator: str
    bases: dict
    installed: dict
    overlays: dict
    units: dict
    groups: list
    jobs: int
    # Variables every run's processes get besides the compile cache's
    # (``bench-matrix`` sets the harness's ``PROOF_GC_FREEZE`` with it).
    extra_env: tuple[tuple[str, str], ...] = ()


def plan(args, layout: pins.Layout, previous: dict) -> Plan:
    """Selects the cells, installs the variants, and orders the runs
    (``previous``: the last ``proof.json``'s rows, for their times).

    Raises:
        ForkError: no cell matches, an unknown base, a missing wheel, or a
            failed install.
    """
    found = fixes.problems(layout)
    if found:
        raise ForkError(
            "the fix folders and the series disagree (python -m keras_fork "
            "fixes --check):\n  " + "\n  ".join(found)
        )
    cells = cells_lib.select(cells_lib.load_matrix(layout.fixes), args)
    accelerator, gpus = resolve_accelerator(args.accelerator)
    if accelerator == "gpu":
        cells = cells_lib.short_of_gpus(cells, gpus)
    bases = {c.base: pins.get_base(layout, c.base) for c in cells}
    installed = {
        v: variants_lib.install_variants(layout, b) for v, b in bases.items()
    }
    if "stock" in (args.variant or VARIANTS):
        cells = with_prerequisites(layout, cells, bases, installed)
    overlays = {
        v: variants_lib.install_overlay(layout, b) for v, b in bases.items()
    }
    units = {
        c.key: groups_lib.unit_tests(layout, bases[c.base], c.fix)
        for c in cells
        if c.topology == cells_lib.UNIT and c.expect != "n/a"
    }
    jobs = getattr(args, "jobs", None) or schedule.default_jobs(accelerator)
    todo = groups_lib.plan_groups(cells, units, args.variant or list(VARIANTS))
    # Longest first; multi-process runs last: each waits for every slot,
    # so among single-process runs it would leave a slot idle while the
    # others drain.
    todo.sort(
        key=lambda g: (g.multi_process, -groups_lib.estimate(g, previous))
    )
    return Plan(
        cells, accelerator, bases, installed, overlays, units, todo, jobs
    )


def resolve_accelerator(choice: str) -> tuple[str, int]:
    """``schedule.accelerator(choice)``: ``(accelerator, gpus)``.

    Raises:
        ForkError: ``gpu`` where this process may use no GPU.
    """
    try:
        return schedule.accelerator(choice)
    except ValueError as e:
        raise ForkError(str(e)) from None


def with_prerequisites(layout, cells, bases, installed) -> list[Cell]:
    """Installs each stock side with prerequisites that the cells need
    (``variants.install_prerequisites``) into ``installed[base][side]``.

    Returns:
        The cells, where a cell's prerequisites cannot be built without its
        own fix, or do not apply without the rest of the series, turned
        ``n/a`` with that reason (its proof would stand on another fix's
        bug).
    """
    out = []
    for cell in cells:
        if cell.needs and cell.expect != "n/a":
            try:
                base = bases[cell.base]
                patches = variants_lib.prerequisite_patches(
                    layout, base, cell.needs, cell.fix
                )
                installed[cell.base][cell.stock_side] = (
                    variants_lib.install_prerequisites(
                        layout, base, cell.needs, patches
                    )
                )
            except variants_lib.PrerequisiteError as e:
                why = f"{cell.stock_side} cannot be built: {e}"
                cell = dataclasses.replace(cell, expect="n/a", reason=why)
        out.append(cell)
    return out


def new_row(cell: Cell, accelerator: str, old: dict, p: Plan, variants):
    """A cell's row of ``proof.json`` before its runs; a variant that is
    not run this time keeps its last result."""
    row = {
        "base": cell.base,
        "fix": cell.fix,
        "issue": cell.issue,
        "backend": cell.backend,
        "topology": cell.topology,
        "expect": cell.expect,
        "accelerator": accelerator,
        "stock_side": cell.stock_side,
        "stock": None,
        "fork": None,
        "reason": cell.reason,
        "runs": {},
    }
    unit = p.units.get(cell.key)
    if unit is not None and not unit.names:
        row["reason"] = "the fix's patches add no unit test"
    elif cell.expect != "n/a":
        kept = set(VARIANTS) - set(variants)
        if stock_side(old) != cell.stock_side:  # that stock run is not this
            kept.discard("stock")
        for variant in kept:
            row[variant] = old.get(variant)
            if variant in old.get("runs", {}):
                row["runs"][variant] = old["runs"][variant]
    return row


def _where(p: Plan, group, layout) -> runner.Where:
    base = p.bases[group.base]
    # A wheel built from patches reports the fork's version, prerequisites
    # alone (variants.build_subset) included.
    built = group.variant == "fork" or group.needs
    version = base.fork_version if built else base.version
    return runner.Where(
        p.installed[group.base][group.side],
        version,
        p.overlays[group.base],
        layout.fixes,
        layout.root,
        p.accelerator,
        tuple(variants_lib.compile_cache_env(layout).items()) + p.extra_env,
    )


def resolve(group, run: dict, root: Path) -> tuple[dict, list]:
    """The cell results of a finished group run, and the groups to run
    again: ``groups.after_error`` when the run could not run its tests,
    else every cell's own result (``groups.cell_result``)."""
    if run["outcome"] == "error":
        return groups_lib.after_error(group, run, run.get("unfinished"))
    cases = read_junit(root / run["junit"]).cases
    return {
        c.key: groups_lib.cell_result(group, c, run, cases) for c in group.cells
    }, []


def execute(p: Plan, rows: dict, args, layout, console) -> list[dict]:
    """Runs ``p.groups`` in their order on ``p.jobs`` slots
    (``schedule.run_all``), filling ``rows``' variant outcomes, and a cell
    again on its own (next) where its group's run could not run its
    tests. Returns every run's summary (``_summary``). Interrupted, it
    starts no other run."""
    from rich.progress import Progress

    junit_dir = layout.dist / "proof" / "junit"
    summaries = []

    def start(group):
        return runner.run_group(
            group,
            _where(p, group, layout),
            junit_dir / f"{group.slug}.xml",
            args.timeout,
        )

    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("proof matrix", total=len(p.groups))

        def finished(group, result):
            retries = _record(group, result, rows, layout.root, console)
            summaries.append(_summary(group, result))
            total = progress.tasks[0].total + len(retries)
            progress.update(task, total=total, advance=1)
            return retries

        schedule.run_all(p.groups, start, p.jobs, finished)
    return summaries


def _record(group, result: dict, rows: dict, root: Path, console) -> list:
    """Prints a finished run, puts its cells' results in ``rows`` and
    returns the groups to run again (``resolve``)."""
    when = f"({result['seconds']}s)"
    _print_run(console, group.label, result, when, result["detail"])
    results, retries = resolve(group, result, root)
    for key, cell_run in results.items():
        rows[key][group.variant] = cell_run["outcome"]
        rows[key]["runs"][group.variant] = cell_run
    for retry in retries:
        console.print(f"  {retry.slug}: again on its own")
    return retries


def _summary(group, result: dict) -> dict:
    return {
        "run": group.slug,
        "cells": len(group.cells),
        "multi_process": group.multi_process,
        "outcome": result["outcome"],
        "seconds": result["seconds"],
        "junit": result["junit"],
    }


def _print_run(console, label, result, when, detail):
    """One line a pytest run; ``detail`` (a failure message, which may
    hold brackets, e.g. gloo's ``[/path/pair.cc:553]``) is not markup."""
    from rich.markup import escape

    style = "green" if result["outcome"] == "pass" else "red"
    console.print(
        f"{label}: [{style}]{result['outcome']}[/] {when} {escape(detail)}"
    )


def settle(p: Plan, rows: dict, console) -> None:
    """Gives every row its verdict, printing each cell's outcomes."""
    for cell in p.cells:
        row = rows[cell.key]
        for variant, run in row["runs"].items():
            if cell.expect != "n/a" and "cases" in run:
                _print_run(
                    console, f"{cell.slug} {variant}", run, "", run["detail"]
                )
        unit = p.units.get(cell.key)
        stock_run = row["runs"].get("stock", {})
        # Upstream-style unit tests carry no proof/guard roles: a patch's
        # tests may include regression guards that pass on stock, so a
        # unit cell is proven when any of its added tests fails there.
        roles = {} if unit is not None else row["runs"]
        stock_roles, fork_roles = roles.get("stock", {}), roles.get("fork", {})
        row["verdict"] = cells_lib.verdict(
            cell.expect,
            row["stock"],
            row["fork"],
            tuple(stock_roles.get("passed_tests", ())),
            stock_skipped=tuple(stock_roles.get("skipped_tests", ())),
            fork_passed=tuple(fork_roles.get("passed_tests", ())),
        )
        if row["verdict"] == "n/a" and not row["reason"]:
            row["reason"] = "a variant was not run"
        if row["verdict"] == cells_lib.GUARD_FAILED:
            row["reason"] = f"stock: {stock_run.get('detail', '')}"


def write_outputs(layout, rows, accelerator: str, docs: bool, runs=()):
    """``dist/proof.json`` (``{"cells": rows, "runs": runs}``: every cell,
    and this prove's pytest processes) and ``dist/proof.md``, atomically;
    with ``docs``, the table in ``docs/proof.md`` too."""
    proof_json = layout.proof
    doc = {"cells": rows, "runs": list(runs)}
    write_atomic(proof_json, json.dumps(doc, indent=2) + "\n")
    table = render_table(rows)
    write_atomic(layout.dist / "proof.md", "# Proof matrix\n\n" + table)
    if docs:
        device = "GPU" if accelerator == "gpu" else "CPU"
        body = f"_Measured on {device}._\n\n{totals_line(rows)}\n\n{table}"
        replace_between(layout.docs / DOCS_FILE, DOCS_BEGIN, DOCS_END, body)


def totals_line(rows: list[dict]) -> str:
    """``"83 proven, 42 guard, 91 n/a, 0 vacuous, 0 guard-failed-on-stock,
    0 broken"`` of ``rows``."""
    names = cells_lib.VERDICTS
    counts = {n: sum(r["verdict"] == n for r in rows) for n in names}
    return ", ".join(f"{counts[n]} {n}" for n in names)


def verdict_text(row: dict) -> str:
    """A row's verdict, with its reason where it has one: ``n/a (why)``,
    ``guard-failed-on-stock (stock: <failed test>: <message>)``."""
    reason = row.get("reason")
    return f"{row['verdict']} ({reason})" if reason else row["verdict"]


def _print_table(rows: list[dict]) -> None:
    from rich.markup import escape

    # Problems (cells.PROBLEMS) in red, with the reason of the row.
    colors = {"proven": "green", "guard": "cyan", "n/a": "dim"}
    lines = []
    for r in rows:
        color = colors.get(r["verdict"], "bold red")
        text = r["verdict"] if r["verdict"] == "n/a" else verdict_text(r)
        lines.append(
            (
                r["base"],
                r["fix"],
                r["backend"],
                r["topology"],
                stock_side(r),
                r["stock"] or "-",
                r["fork"] or "-",
                f"[{color}]{escape(text)}[/]",
            )
        )
    columns = ("base", "fix", "backend", "topology", "stock side")
    print_table(
        "proof matrix (dist/proof.json)",
        (*columns, "stock", "fork", "verdict"),
        lines,
    )


def _why(row: dict) -> str:
    """Why a problem cell (``cells.PROBLEMS``) is one, for ``_report``."""
    runs = row["runs"]
    why = "; ".join(f"{v}: {run['detail']}" for v, run in runs.items())
    if row["verdict"] == cells_lib.GUARD_FAILED:
        return f"declared guard, fails on {row['reason']}"
    if row["verdict"] != "vacuous":
        return why
    stock, fork = runs.get("stock", {}), runs.get("fork", {})
    because = []
    if stock.get("passed_tests"):
        because.append(f"passes on stock: {', '.join(stock['passed_tests'])}")
    skipped = cells_lib.skipped_on_stock(stock, fork)
    if skipped:
        because.append(
            f"skipped on stock, passes on the fork: {', '.join(skipped)}"
        )
    return "; ".join(because) or why


def _report(ran: list[dict], console) -> int:
    """Names every problem cell (``cells.PROBLEMS``: ``vacuous``,
    ``guard-failed-on-stock``, ``broken``) and why; prints the closing
    line. Returns 1 when there is one, else 0."""
    from rich.markup import escape

    bad = [r for r in ran if r["verdict"] in cells_lib.PROBLEMS]
    for r in bad:
        console.print(
            f"[bold red]{r['verdict']}[/]: {r['base']} {r['fix']} "
            f"{r['backend']}/{r['topology']}: {escape(_why(r))}"
        )
    # A plain closing line for CI log readers: cells, not tests.
    good = sum(r["verdict"] in ("proven", "guard") for r in ran)
    skipped = sum(r["verdict"] == "n/a" for r in ran)
    print(f"proof: {good} passed, {len(bad)} failed, {skipped} skipped")
    return 1 if bad else 0


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork prove``: runs the selected cells and writes
    ``dist/proof.*`` (the ``pr-series`` verb puts them into the PR bodies).

    Returns:
        0 when no selected cell is a problem (``cells.PROBLEMS``:
        ``vacuous``, ``guard-failed-on-stock``, ``broken``), else 1.
    """
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    previous = runner.load_previous(layout.proof)
    p = plan(args, layout, previous)
    variants = args.variant or list(VARIANTS)
    rows = {
        c.key: new_row(c, p.accelerator, previous.get(c.key, {}), p, variants)
        for c in p.cells
    }
    runs = execute(p, rows, args, layout, console)
    settle(p, rows, console)
    results = {**previous, **rows}
    known = {c.key for c in cells_lib.load_matrix(layout.fixes)}
    table = [r for k, r in sorted(results.items()) if k in known]
    write_outputs(layout, table, p.accelerator, args.docs, runs)
    _print_table(table)
    return _report([rows[c.key] for c in p.cells], console)


def add_arguments(p) -> None:
    """The ``prove`` verb's filters and options."""
    add_filters(p)
    p.add_argument(
        "--docs",
        "--readme",
        dest="docs",
        action="store_true",
        help="also rewrite the committed proof table, docs/proof.md "
        "(--readme: its old name)",
    )


def add_filters(p) -> None:
    """Which cells and variants run, and how (also ``bench-matrix``'s)."""
    options.add_cell_filters(p, ("base", "fix", "backend", "topology"))
    p.add_argument(
        "--skip-topology",
        action="append",
        metavar="TOPOLOGY",
        help="leave out this topology's cells (repeatable); scripts/test "
        "leaves out mirrored-4 (docs/test-run.md)",
    )
    p.add_argument(
        "--variant",
        action="append",
        choices=VARIANTS,
        help="run only this variant (repeatable; default both); the other "
        "keeps its result from the last dist/proof.json",
    )
    p.add_argument(
        "--jobs",
        type=int,
        choices=range(1, 9),
        metavar="{1..8}",
        help="runs at the same time (default: 1 on GPUs, where each run "
        "takes every GPU; else 2 on 2 or more cores); a multi-process run "
        "takes all of them",
    )
    options.add_accelerator(
        p,
        "the tests",
        "the GPUs where the machine has them",
        "; on GPUs a topology needing more GPUs than visible is n/a",
    )
    options.add_timeout(
        p, "; past them pytest-timeout fails it and the run goes on"
    )


def stock_side(row: dict) -> str:
    """What a row's stock run imported: ``stock``, or stock plus the
    cell's prerequisites (``Cell.stock_side``); rows of a ``proof.json``
    older than prerequisites ran on bare stock."""
    return row.get("stock_side", "stock")


def render_table(cells: list[dict]) -> str:
    """The proof table as markdown (one row a cell)."""
    lines = [
        "| base | fix | backend | topology | stock side | stock | fork "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        verdict = verdict_text(c).replace("|", "\\|")  # a failure's text
        lines.append(
            f"| {c['base']} | {c['fix']} | {c['backend']} | {c['topology']} "
            f"| {stock_side(c)} | {c['stock'] or '-'} | {c['fork'] or '-'} "
            f"| {verdict} |"
        )
    return "\n".join(lines) + "\n"
