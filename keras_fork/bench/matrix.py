"""``python -m keras_fork bench-matrix``: the proof matrix's wall time run
one pytest process per cell (as before issue 21) and one per base, variant,
backend and topology (as ``prove`` runs it now), one after the other in one
invocation on the same machine, with the same cells and slots.

Prints each way's processes, wall time and verdict totals and the ratio,
writes ``dist/bench-matrix.json`` (atomically), and exits 1 when the two
ways disagree on a verdict (grouping must not change one). Takes
``prove``'s filters; the JUnit files of each way go to
``dist/bench-matrix/<way>/``.
"""

from __future__ import annotations

import dataclasses
import json
import time

from keras_fork.outputs import write_atomic
from keras_fork.proof import prove
from keras_fork.proof import runner
from keras_fork.proof.variants import VARIANTS
from keras_fork.recipe import pins

WAYS = ("per cell", "grouped")


def add_arguments(p) -> None:
    """``prove``'s filters (``prove.add_filters``)."""
    prove.add_filters(p)


def measure(p: prove.Plan, way: str, args, layout, console) -> dict:
    """Runs the plan's cells one way (``WAYS``) and returns its record:
    processes, wall seconds and each cell's verdict."""
    todo = p.groups
    if way == "per cell":
        todo = [g.alone(c) for g in p.groups for c in g.cells]
    q = dataclasses.replace(p, groups=todo)
    variants = args.variant or list(VARIANTS)
    rows = {c.key: prove.new_row(c, p.accelerator, {}, p, variants)
            for c in p.cells}  # fmt: skip
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
    """Measures both ways (see the module doc).

    Returns:
        0 when both ways give the same verdicts, else 1.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, highlight=False)
    previous = runner.load_previous(layout.dist / "proof.json")
    p = prove.plan(args, layout, previous)
    records = [measure(p, way, args, layout, console) for way in WAYS]
    old, new = records
    ratio = round(old["wall"] / new["wall"], 2) if new["wall"] else None
    doc = {"cells": len(p.cells), "jobs": p.jobs, "ratio": ratio,
           "ways": records}  # fmt: skip
    write_atomic(layout.dist / "bench-matrix.json", json.dumps(doc, indent=2))
    t = Table(title=f"proof matrix, {len(p.cells)} cells, {p.jobs} slots")
    for col in ("way", "processes", "wall s", "verdicts"):
        t.add_column(col)
    for r in records:
        t.add_row(r["way"], str(r["processes"]), f"{r['wall']:.0f}",
                  r["totals"])  # fmt: skip
    Console(highlight=False).print(t)
    print(f"per cell / grouped wall time: {ratio}")
    same = old["verdicts"] == new["verdicts"]
    if not same:
        for key, verdict in old["verdicts"].items():
            if new["verdicts"].get(key) != verdict:
                print(f"differs: {key}: {verdict} vs {new['verdicts'][key]}")
    return 0 if same else 1
