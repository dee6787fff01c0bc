"""``python -m keras_fork bench-matrix``: the proof matrix's wall time run
in several ways, one after the other in one invocation on the same machine,
with the same cells and slots (``WAYS``):

- ``per cell``: one pytest process per cell;
- ``grouped, no gc.freeze``: one per base, variant, backend and
  topology, the garbage collector walking the whole heap (the backend's
  included) before and after each test (the harness's
  ``PROOF_GC_FREEZE=0``);
- ``grouped``: as ``prove`` runs it now.

Prints each way's processes, wall time, verdict totals and its ratio to
``grouped``, writes ``dist/bench-matrix.json`` (atomically), and exits 1
when a way disagrees with ``grouped`` on a verdict (neither change may
change one). Takes ``prove``'s filters and ``--way`` (repeatable; default
every way); the JUnit files of each way go to ``dist/bench-matrix/<way>/``.
"""

from __future__ import annotations

import dataclasses
import json
import time

from integration_tests.harness import plugin
from keras_fork.outputs import print_table
from keras_fork.outputs import write_atomic
from keras_fork.proof import prove
from keras_fork.proof import runner
from keras_fork.proof.variants import VARIANTS
from keras_fork.recipe import pins

# way -> (one process per cell?, variables every process gets). The last
# is how ``prove`` runs; the ratios are to it.
WAYS = {
    "per cell": (True, ()),
    "grouped, no gc.freeze": (False, ((plugin.GC_FREEZE_ENV, "0"),)),
    "grouped": (False, ()),
}
NOW = "grouped"


def add_arguments(p) -> None:
    """``prove``'s filters (``prove.add_filters``) and ``--way``."""
    prove.add_filters(p)
    p.add_argument(
        "--way",
        action="append",
        choices=list(WAYS),
        help="only this way (repeatable; grouped always runs)",
    )


def measure(p: prove.Plan, way: str, args, layout, console) -> dict:
    """Runs the plan's cells one way (a key of ``WAYS``) and returns its
    record: processes, wall seconds and each cell's verdict.

    Raises:
        KeyError: an unknown way.
    """
    per_cell, env = WAYS[way]
    todo = p.groups
    if per_cell:
        todo = [g.alone(c) for g in p.groups for c in g.cells]
    q = dataclasses.replace(p, groups=todo, extra_env=p.extra_env + env)
    variants = args.variant or list(VARIANTS)
    rows = {
        c.key: prove.new_row(c, p.accelerator, {}, p, variants) for c in p.cells
    }
    out = dataclasses.replace(
        layout, dist=layout.dist / "bench-matrix" / way.replace(" ", "-")
    )
    start = time.monotonic()
    runs = prove.execute(q, rows, args, out, console)
    wall = round(time.monotonic() - start, 1)
    prove.settle(q, rows, console)
    return {
        "way": way,
        "processes": len(runs),
        "wall": wall,
        "totals": prove.totals_line(list(rows.values())),
        "verdicts": {"/".join(k): r["verdict"] for k, r in rows.items()},
    }


def main(args, layout: pins.Layout) -> int:
    """Measures the chosen ways (see the module doc).

    Returns:
        0 when every way gives ``grouped``'s verdicts, else 1.
    """
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    previous = runner.load_previous(layout.proof)
    p = prove.plan(args, layout, previous)
    chosen = set(getattr(args, "way", None) or WAYS) | {NOW}
    records = [
        measure(p, way, args, layout, console) for way in WAYS if way in chosen
    ]
    now = records[-1]
    for r in records:
        r["ratio"] = round(r["wall"] / now["wall"], 2) if now["wall"] else None
    doc = {"cells": len(p.cells), "jobs": p.jobs, "ways": records}
    write_atomic(layout.dist / "bench-matrix.json", json.dumps(doc, indent=2))
    print_table(
        f"proof matrix, {len(p.cells)} cells, {p.jobs} slots",
        ("way", "processes", "wall s", f"/ {NOW}", "verdicts"),
        [
            (
                r["way"],
                str(r["processes"]),
                f"{r['wall']:.0f}",
                str(r["ratio"]),
                r["totals"],
            )
            for r in records
        ],
    )
    differs = [
        f"differs: {key}: {r['way']}: {verdict}, {NOW}: {now['verdicts'][key]}"
        for r in records[:-1]
        for key, verdict in r["verdicts"].items()
        if now["verdicts"].get(key) != verdict
    ]
    print("\n".join(differs) or "every way gives the same verdicts")
    return 1 if differs else 0
