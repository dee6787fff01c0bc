"""The equivalence table: every feature of the equivalence suite under
every topology, for stock Keras and the fork wheel of a base.

``python -m keras_fork equivalence`` runs, for each base, variant
(``stock``, ``fork``), backend and topology chosen, one bounded pytest
process over ``integration_tests/equivalence`` with that variant's keras
and that topology's devices (the proof matrix's environment:
``variants.child_env``, ``run.topology_env``); each case writes its cell
(``integration_tests.equivalence.cells``). The cells are merged into
``dist/equivalence.json`` (a run replaces the cells it ran and keeps the
others) and, with ``--docs``, rendered into ``docs/equivalence.md``.

``--json`` prints the merged cells: ``{"cells": [{base, variant,
backend, topology, feature, verdict, detail, seconds, keras, date,
machine}]}`` (``keras``: the version of the keras the cell ran on;
``date``: the day it ran; ``machine``: its architecture and CPU count).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

from integration_tests.harness import run
from integration_tests.harness.topologies import BACKENDS
from keras_fork import outputs
from keras_fork.errors import ForkError
from keras_fork.proof import variants
from keras_fork.recipe import pins

# The topologies of the table, per backend, in column order (one device
# is each backend's reference, so it has no column).
TOPOLOGIES = {
    "jax": ("8", "procs-2"),
    "tensorflow": ("mirrored-2", "multiworker-2"),
    "torch": ("dp-2", "ddp-2"),
}
VARIANTS = ("stock", "fork")
SUITE = pins.CODE_ROOT / "integration_tests" / "equivalence"
# Seconds a pytest process may go without a case starting or ending.
STALL = 600
DOCS_PAGE = "equivalence.md"
# The marker lines of the generated part of ``DOCS_PAGE``.
BEGIN = "<!-- equivalence table: begin -->"
END = "<!-- equivalence table: end -->"


def cell_key(cell: dict) -> tuple:
    """What identifies a cell of the table."""
    return tuple(
        cell[k] for k in ("base", "variant", "backend", "topology", "feature")
    )


def run_one(
    layout, base, variant, keras_dir, backend, topology, out: Path, wanted
) -> list[dict]:
    """One pytest process: the features ``wanted`` (None: all) of the
    suite for ``variant`` on ``backend``/``topology``; its cells (an
    ``error`` cell for each wanted feature that wrote none: the process
    crashed or stalled, the log named)."""
    from integration_tests.equivalence import cells as cells_lib

    out.mkdir(parents=True, exist_ok=True)
    records = out / "cells"
    junit = out / "junit.xml"
    log = out / "pytest.log"
    progress = out / "progress"
    env = variants.child_env(
        keras_dir,
        variants.install_overlay(layout, base),
        run.topology_env(backend, topology, "cpu"),
    )
    env[cells_lib.OUT_ENV] = str(records)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[run.progress_plugin.ENV] = str(progress)
    test = SUITE / "test_equivalence.py"
    paths = [SUITE]
    if wanted:
        paths = [f"{test}::test_feature_equals_one_device[{n}]" for n in wanted]
    cmd = run.pytest_command(paths, junit, STALL)
    start = time.monotonic()
    code = run.run_bounded(cmd, pins.CODE_ROOT, env, log, STALL, progress)
    found = []
    for path in sorted(records.glob("*.json")) if records.is_dir() else ():
        found.append(json.loads(path.read_text()))
    why = "stalled" if code is None else f"exit status {code}"
    found += _missing(found, wanted, backend, topology, f"{why} ({log})")
    ran = dict(
        base=base.version,
        variant=variant,
        keras=installed_version(keras_dir),
        date=time.strftime("%Y-%m-%d"),
        machine=f"{platform.machine()}, {os.cpu_count()} CPU cores",
    )
    for c in found:
        c.update(ran)
    print(
        f"{base.version} {variant} {backend}/{topology}: "
        + ", ".join(
            f"{v} {sum(c['verdict'] == v for c in found)}"
            for v in cells_lib.VERDICTS
        )
        + f" ({time.monotonic() - start:.0f} s)",
        flush=True,
    )
    return found


def _missing(found, wanted, backend, topology, why) -> list[dict]:
    """An ``error`` cell for each feature of ``wanted`` (None: every
    feature) that wrote none in ``found``: the pytest process ``why``."""
    from integration_tests.equivalence import features

    names = {c["feature"] for c in found}
    return [
        dict(
            feature=name,
            backend=backend,
            topology=topology,
            verdict="error",
            detail=f"no result: the pytest process {why}",
            seconds=0.0,
        )
        for name in sorted(wanted or features.FEATURES)
        if name not in names
    ]


def installed_version(keras_dir: Path) -> str:
    """The version of the keras installed in ``keras_dir``, from the name of
    its ``.dist-info`` folder (``keras-3.15.1+fork.27.dist-info``,
    ``keras_nightly-3.16.0.dev2026102704.dist-info``); ``"?"`` where there
    is none."""
    for info in sorted(Path(keras_dir).glob("keras*.dist-info")):
        return info.name.removesuffix(".dist-info").split("-", 1)[1]
    return "?"


def _measured_line(cells: list[dict]) -> str:
    """What a base's table measured: each variant's keras versions (with
    their numbers of cells) and the dates of its runs."""
    parts = []
    for v in VARIANTS:
        mine = [c for c in cells if c["variant"] == v]
        if not mine:
            continue
        versions = sorted({c.get("keras", "?") for c in mine})
        counted = ", ".join(
            f"{ver} ({sum(c.get('keras', '?') == ver for c in mine)} cells)"
            for ver in versions
        )
        dates = sorted({c.get("date", "?") for c in mine})
        when = dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"
        parts.append(f"{v}: {counted}, run {when}")
    machines = sorted({c.get("machine", "?") for c in cells})
    return "_" + "; ".join(parts + machines) + "._"


def _wanted_features(names) -> list[str] | None:
    from integration_tests.equivalence import features

    if not names:
        return None
    unknown = sorted(set(names) - set(features.FEATURES))
    if unknown:
        raise ForkError(
            f"unknown feature(s) {unknown}; known: {sorted(features.FEATURES)}"
        )
    return sorted(names)


def merge(path: Path, new: list[dict]) -> list[dict]:
    """The cells of ``path`` (if any) with ``new`` replacing the ones of
    the same key, sorted."""
    cells = {}
    if path.is_file():
        for c in json.loads(path.read_text())["cells"]:
            cells[cell_key(c)] = c
    for c in new:
        cells[cell_key(c)] = c
    return [cells[k] for k in sorted(cells)]


def render(cells: list[dict]) -> str:
    """``docs/equivalence.md``'s generated part: per base, a table of
    feature x topology, each entry ``stock / fork``; then the details of
    every cell that is not equal."""
    lines = []
    bases = sorted({c["base"] for c in cells})
    by_key = {cell_key(c): c for c in cells}
    for base in bases:
        columns = [
            (b, t)
            for b in BACKENDS
            for t in TOPOLOGIES[b]
            if any(
                c["base"] == base and (c["backend"], c["topology"]) == (b, t)
                for c in cells
            )
        ]
        names = sorted({c["feature"] for c in cells if c["base"] == base})
        mine = [c for c in cells if c["base"] == base]
        lines += [f"### {base}", "", _measured_line(mine), ""]
        lines.append(
            "| feature | " + " | ".join(f"{b}/{t}" for b, t in columns) + " |"
        )
        lines.append("|---" * (len(columns) + 1) + "|")
        notes = []
        for name in names:
            row = [f"`{name}`"]
            for b, t in columns:
                entry = []
                for v in VARIANTS:
                    c = by_key.get((base, v, b, t, name))
                    if c is None:
                        entry.append("-")
                        continue
                    entry.append(c["verdict"])
                    if c["verdict"] != "equal":
                        notes.append(
                            f"- `{name}` {b}/{t} {v}: {c['verdict']}: "
                            + _one_line(c["detail"])
                        )
                row.append(" / ".join(entry))
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", "Not equal:", ""] + (notes or ["- none"]) + [""]
    return "\n".join(lines)


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def add_arguments(p) -> None:
    """The ``equivalence`` verb's options."""
    p.add_argument(
        "--base",
        action="append",
        help="the base (repeatable; default: every pinned base)",
    )
    p.add_argument(
        "--variant",
        action="append",
        choices=VARIANTS,
        help="stock or fork (repeatable; default: both)",
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="a backend (repeatable; default: every backend)",
    )
    p.add_argument(
        "--topology",
        action="append",
        help="a topology of the table (repeatable): "
        + ", ".join(f"{b}/{t}" for b in BACKENDS for t in TOPOLOGIES[b]),
    )
    p.add_argument(
        "--feature",
        action="append",
        help="a feature (repeatable; default: every feature)",
    )
    p.add_argument(
        "--docs", action="store_true", help="write docs/equivalence.md"
    )
    p.add_argument(
        "--json", action="store_true", help="print the merged cells as JSON"
    )


def _columns(args) -> list[tuple[str, str]]:
    columns = []
    for backend in args.backend or BACKENDS:
        for topology in TOPOLOGIES[backend]:
            name = f"{backend}/{topology}"
            if (
                args.topology
                and name not in args.topology
                and (topology not in args.topology)
            ):
                continue
            columns.append((backend, topology))
    known = {f"{b}/{t}" for b in BACKENDS for t in TOPOLOGIES[b]}
    for t in args.topology or ():
        if t not in known and not any(t == k.split("/")[1] for k in known):
            raise ForkError(f"unknown topology {t}; known: {sorted(known)}")
    return columns


def main(args, layout: pins.Layout) -> int:
    """Runs the chosen cells, merges them into ``dist/equivalence.json``
    and (``--docs``) writes ``docs/equivalence.md``.

    Returns:
        0; 2 for bad input (``ForkError``, by the caller).
    """
    wanted = _wanted_features(args.feature)
    columns = _columns(args)
    bases = pins.select_bases(layout, args.base)
    new = []
    with tempfile.TemporaryDirectory(prefix="equivalence.") as tmp:
        for base in bases:
            installed = variants.install_variants(layout, base)
            for variant in args.variant or VARIANTS:
                for backend, topology in columns:
                    if (backend, topology) == ("torch", "dp-2") and (
                        "dev" not in base.version
                    ):
                        continue  # keras.distribution on torch: master only
                    out = Path(tmp) / base.version / variant / backend
                    new += run_one(
                        layout,
                        base,
                        variant,
                        installed[variant],
                        backend,
                        topology,
                        out / topology,
                        wanted,
                    )
    path = layout.dist / "equivalence.json"
    cells = merge(path, new)
    path.parent.mkdir(parents=True, exist_ok=True)
    outputs.write_atomic(path, json.dumps({"cells": cells}, indent=1) + "\n")
    if args.docs:
        outputs.replace_between(
            layout.root / "docs" / DOCS_PAGE, BEGIN, END, render(cells) + "\n"
        )
    if args.json:
        print(json.dumps({"cells": cells}, indent=1))
    return 0
