"""Benchmarks: fork vs stock, measured in the same run (never a timed test).

Each case runs ``keras_fork.bench_worker`` in a fresh process per variant,
alternating stock and fork (ABBA order across rounds, so drift of the machine
hits both), and reports medians and the fork/stock ratio with its spread
(min and max of the per-round ratios). Results: ``dist/bench.json`` and a
table (``--readme`` puts it in README.md). A run of some cases (``--case``)
replaces those rows of the last run on the same machine with as many rounds
(``merge``) and keeps the others.

``--work`` counts instead of timing (``run_work``): the Python calls per
step and the compiled training step of each step case, stock and fork, into
``dist/bench-work.json``; counts resolve what the timings' noise cannot.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

from integration_tests import topologies
from keras_fork import pins
from keras_fork import prove
from keras_fork.errors import ForkError

README_BEGIN = "<!-- bench-table:begin -->"
README_END = "<!-- bench-table:end -->"

# (case, workload, backend, topology, options)
CASES = [
    ("shuffle epoch, 10M samples", "shuffle", "jax", "1",
     {"samples": 10_000_000, "batch_size": 1024, "epochs": 3,
      "path": "numpy"}),
    ("shuffle epoch, 10M samples", "shuffle", "tensorflow", "1",
     {"samples": 10_000_000, "batch_size": 1024, "epochs": 3,
      "path": "tf"}),
    ("shuffle epoch, 10M samples", "shuffle", "torch", "1",
     {"samples": 10_000_000, "batch_size": 1024, "epochs": 3,
      "path": "torch"}),
    ("stateless_call, small MLP", "stateless_call", "jax", "1",
     {"calls": 200, "repeats": 3}),
    ("stateless_call, small MLP", "stateless_call", "tensorflow", "1",
     {"calls": 200, "repeats": 3}),
    ("stateless_call, small MLP", "stateless_call", "torch", "1",
     {"calls": 200, "repeats": 3}),
    ("fit step, small MLP", "fit_step", "jax", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 2}),
    ("fit step, small MLP", "fit_step", "jax", "8",
     {"samples": 4096, "batch_size": 64, "epochs": 2}),
    ("fit step, small MLP", "fit_step", "tensorflow", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 2}),
    ("fit step, small MLP", "fit_step", "tensorflow", "mirrored-2",
     {"samples": 4096, "batch_size": 64, "epochs": 2}),
    ("fit step, small MLP", "fit_step", "torch", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 2}),
    ("DDP loop step, small MLP", "ddp_step", "torch", "ddp-2",
     {"samples": 4096, "batch_size": 64, "epochs": 2, "processes": 2}),
    ("fit step, CNN + BatchNorm", "fit_step", "jax", "1",
     {"samples": 8192, "batch_size": 64, "epochs": 2, "model": "cnn"}),
    ("fit step, CNN + BatchNorm", "fit_step", "torch", "1",
     {"samples": 8192, "batch_size": 64, "epochs": 2, "model": "cnn"}),
    ("DDP loop step, CNN + BatchNorm", "ddp_step", "torch", "ddp-2",
     {"samples": 4096, "batch_size": 64, "epochs": 2, "processes": 2,
      "model": "cnn"}),
    ("fit step, CNN + BatchNorm", "fit_step", "tensorflow", "1",
     {"samples": 8192, "batch_size": 64, "epochs": 2, "model": "cnn"}),
    ("fit step, CNN + BatchNorm", "fit_step", "tensorflow", "mirrored-2",
     {"samples": 8192, "batch_size": 64, "epochs": 2, "model": "cnn"}),
    ("fit step, MLP + accuracy/AUC", "fit_step", "tensorflow", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 2, "metrics": True}),
    ("fit step, MLP + accuracy/AUC", "fit_step", "tensorflow", "mirrored-2",
     {"samples": 4096, "batch_size": 64, "epochs": 2, "metrics": True}),
    # 8 virtual devices on 2 cores: a longer conv run can starve one
    # device thread past XLA's 40 s collective rendezvous timeout.
    ("fit step, CNN + BatchNorm", "fit_step", "jax", "8",
     {"samples": 2048, "batch_size": 64, "epochs": 2, "model": "cnn"}),
]  # fmt: skip


def _run_worker(
    variant_dir, overlay, workload, backend, topology, opts, accelerator
):
    """Runs ``keras_fork.bench_worker`` once; returns its JSON document."""
    env = prove.child_env(
        variant_dir, overlay, topologies.env_for(backend, topology, accelerator)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "keras_fork.bench_worker", workload,
         json.dumps(opts)],
        env=env, capture_output=True, text=True, cwd=pins.REPO_ROOT,
        timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ForkError(
            f"benchmark {workload} ({backend}/{topology}) failed:\n"
            f"{proc.stderr[-2000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measure(*args):
    result = _run_worker(*args)
    return statistics.median(result["seconds"]), result["peak_mib"]


def run(layout, base, rounds, accelerator, cases, console, aa=False):
    """Measures every case; returns the ``dist/bench.json`` document.

    With ``aa`` (an A/A run), the "fork" column measures stock again: the
    spread of its ratios is the noise floor of each case on this machine,
    against which a fork/stock ratio can be read.
    """
    dirs = dict(prove.install_variants(layout, base))
    if aa:
        dirs["fork"] = dirs["stock"]
    overlay = prove.install_overlay(layout, base)
    rows = []
    for case, workload, backend, topology, opts in cases:
        times = {"stock": [], "fork": []}
        peaks = {"stock": [], "fork": []}
        for r in range(rounds):
            order = ("stock", "fork") if r % 2 == 0 else ("fork", "stock")
            for variant in order:
                t, peak = _measure(
                    dirs[variant], overlay, workload, backend, topology,
                    opts, accelerator,
                )  # fmt: skip
                times[variant].append(t)
                peaks[variant].append(peak)
        ratios = [f / s for f, s in zip(times["fork"], times["stock"])]
        row = {
            "case": case,
            "backend": backend,
            "topology": topology,
            "stock_median_s": statistics.median(times["stock"]),
            "fork_median_s": statistics.median(times["fork"]),
            "ratio": statistics.median(times["fork"])
            / statistics.median(times["stock"]),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "stock_peak_mib": max(peaks["stock"]),
            "fork_peak_mib": max(peaks["fork"]),
            "date": datetime.date.today().isoformat(),
        }
        spread = f"{row['ratio_min']:.3f}..{row['ratio_max']:.3f}"
        console.print(
            f"{case} ({backend}/{topology}): fork/stock {row['ratio']:.3f} "
            f"({spread})"
        )
        rows.append(row)
    return _run_doc(base, accelerator, rows, rounds=rounds, aa=aa)


def _run_doc(base, accelerator, rows, **kind):
    """A run's document: base, date, machine, ``kind`` (rounds, A/A or
    work) and its rows (``cases``)."""
    return {
        "base": base.version,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{accelerator.upper()}",
        **kind,
        "cases": rows,
    }


# Step workloads whose work per step ``run_work`` counts.
WORK_WORKLOADS = ("stateless_call", "fit_step", "ddp_step")
WORK_EPOCHS = 4
WORK_BEGIN = "<!-- bench-work:begin -->"
WORK_END = "<!-- bench-work:end -->"


def run_work(layout, base, accelerator, cases, console):
    """Counts the work per step of each step case, stock and fork.

    Timings on a loaded machine cannot resolve a fork cost of a few percent
    (the per-round ratios of one case spread over 0.4..1.8 on the 2-core
    CI host); counts can. Per case, one process per variant reports
    (``keras_fork.bench_worker``, ``"work"``):

    * the Python function calls per step (per call for ``stateless_call``)
      in each of ``WORK_EPOCHS`` epochs after the compiling one. A row
      keeps the smallest: the epochs differ only by how often the main
      thread polls a background thread (JAX's prefetch), which adds calls
      and never removes them.
    * the compiled training step's size and digest (``compiled_step``):
      the same digest means the same XLA program (JAX) or the same op
      counts by type (TensorFlow) every step.

    Returns:
        The ``dist/bench-work.json`` document: rows of ``case``,
        ``backend``, ``topology``, ``stock_calls``/``fork_calls`` (per
        step), ``*_calls_max`` (the largest epoch's), ``stock_graph``/
        ``fork_graph`` (``compiled_step`` or ``None``).
    """
    dirs = dict(prove.install_variants(layout, base))
    overlay = prove.install_overlay(layout, base)
    rows = []
    for case, workload, backend, topology, opts in cases:
        if workload not in WORK_WORKLOADS:
            continue
        opts = dict(opts, work=True)
        if "epochs" in opts:
            opts["epochs"] = WORK_EPOCHS
        row = {"case": case, "backend": backend, "topology": topology}
        for variant in ("stock", "fork"):
            result = _run_worker(
                dirs[variant], overlay, workload, backend, topology, opts,
                accelerator,
            )  # fmt: skip
            row[f"{variant}_calls"] = min(result["calls_per_step"])
            row[f"{variant}_calls_max"] = max(result["calls_per_step"])
            row[f"{variant}_graph"] = result["graph"]
        row["date"] = datetime.date.today().isoformat()
        console.print(
            f"{case} ({backend}/{topology}): calls/step "
            f"{row['stock_calls']:.1f} -> {row['fork_calls']:.1f}, "
            f"compiled step {_graph_text(row)}"
        )
        rows.append(row)
    return _run_doc(base, accelerator, rows, rounds=1, work=True)


def _graph_text(row) -> str:
    stock, fork = row["stock_graph"], row["fork_graph"]
    if stock is None and fork is None:
        return "- (eager)"
    if stock and fork and stock["digest"] == fork["digest"]:
        return f"same {stock['kind']} ({stock['ops']} ops)"
    sizes = "/".join(str(g["ops"]) if g else "-" for g in (stock, fork))
    kind = (stock or fork)["kind"]
    return f"differs: {kind} {sizes} ops"


def render_work_table(doc) -> str:
    """The README table of a ``run_work`` document."""
    lines = [
        f"_keras {doc['base']}, {doc['machine']}, {_date_range(doc)}; Python "
        "calls per step (per call for stateless_call): the fewest of "
        f"{WORK_EPOCHS} epochs, fork - stock; compiled step: stock vs "
        "fork._",
        "",
        "| case | backend | topology | calls/step stock | fork | "
        "fork - stock | compiled step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["cases"]:
        lines.append(
            f"| {r['case']} | {r['backend']} | {r['topology']} | "
            f"{r['stock_calls']:.1f} | {r['fork_calls']:.1f} | "
            f"{r['fork_calls'] - r['stock_calls']:+.1f} | {_graph_text(r)} |"
        )
    return "\n".join(lines) + "\n"


def _row_key(row) -> tuple:
    return (row["case"], row["backend"], row["topology"])


def merge(previous, doc):
    """Puts the rows of ``doc`` (a run of some cases) into ``previous``.

    Args:
        previous: the last ``dist/bench.json`` run of the same base, or
            ``None``.
        doc: the new run's document (``run``).

    Returns:
        ``doc`` with the rows of ``previous`` that it does not measure again
        (same case, backend and topology), all in ``CASES`` order; cases
        no longer listed come last. ``doc`` alone when ``previous`` was
        measured on another machine, with another number of rounds or as
        another kind of run (A/A or not), whose rows would not compare.
    """
    if (
        not previous
        or previous.get("machine") != doc["machine"]
        or previous.get("rounds") != doc["rounds"]
        or previous.get("aa", False) != doc.get("aa", False)
    ):
        return doc
    measured = {_row_key(r) for r in doc["cases"]}
    rows = [r for r in previous["cases"] if _row_key(r) not in measured]
    rows += doc["cases"]
    order = {(c[0], c[2], c[3]): i for i, c in enumerate(CASES)}
    rows.sort(key=lambda r: order.get(_row_key(r), len(order)))
    return dict(doc, cases=rows)


def _date_range(doc) -> str:
    """The day the rows of ``doc`` were measured, or the first..last day
    (rows kept from an earlier run by ``merge``)."""
    dates = sorted({r.get("date", doc["date"]) for r in doc["cases"]})
    return dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"


def render_table(doc) -> str:
    date = _date_range(doc)
    what = "ratio = fork/stock of medians"
    if doc.get("aa"):
        what = "A/A run: the fork column is stock again; ratio = stock/stock"
    lines = [
        f"_keras {doc['base']}, {doc['machine']}, {date}, "
        f"{doc['rounds']} alternating rounds; {what} "
        "(min..max of per-round ratios)._",
        "",
        "| case | backend | topology | stock | fork | ratio | peak MiB "
        "stock/fork |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["cases"]:
        lines.append(
            f"| {r['case']} | {r['backend']} | {r['topology']} | "
            f"{r['stock_median_s'] * 1e3:.3f} ms | "
            f"{r['fork_median_s'] * 1e3:.3f} ms | {r['ratio']:.3f} "
            f"({r['ratio_min']:.2f}..{r['ratio_max']:.2f}) | "
            f"{r['stock_peak_mib']:.0f}/{r['fork_peak_mib']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import argparse

    from rich.console import Console

    p = argparse.ArgumentParser(prog="scripts/bench")
    p.add_argument("--base", default=None, help="base version (default: all)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--case", action="append", help="substring of case names")
    p.add_argument(
        "--accelerator", choices=("auto", "cpu", "gpu"), default="auto"
    )
    p.add_argument("--readme", action="store_true")
    p.add_argument(
        "--aa",
        action="store_true",
        help="A/A: measure stock against itself (noise floor), into "
        "dist/bench-aa.json",
    )
    p.add_argument(
        "--work",
        action="store_true",
        help="count Python calls per step and compare the compiled steps "
        "instead of timing, into dist/bench-work.json",
    )
    args = p.parse_args(argv)
    if args.aa and args.readme:
        p.error("--aa measures no fork: it does not go into the README")
    if args.aa and args.work:
        p.error("--work counts, stock and fork once each: no A/A run")
    if args.work:
        name, render = "bench-work.json", render_work_table
        markers = (WORK_BEGIN, WORK_END)
    else:
        name = "bench-aa.json" if args.aa else "bench.json"
        render, markers = render_table, (README_BEGIN, README_END)
    layout = pins.Layout.default()
    console = Console(stderr=True, highlight=False)
    accelerator = args.accelerator
    if accelerator == "auto":
        accelerator = prove.detect_accelerator()
    cases = [
        c for c in CASES if not args.case or any(s in c[0] for s in args.case)
    ]
    try:
        bases = pins.select_bases(layout, [args.base] if args.base else None)
        docs = []
        for b in bases:
            if args.work:
                doc = run_work(layout, b, accelerator, cases, console)
            else:
                doc = run(
                    layout, b, args.rounds, accelerator, cases, console, args.aa
                )
            docs.append(doc)
    except ForkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = layout.dist / name
    if args.case:
        previous = {}
        try:
            text = out.read_text()
            previous = {d["base"]: d for d in json.loads(text)["runs"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no usable last run: this one stands alone
        docs = [merge(previous.get(d["base"]), d) for d in docs]
    text = json.dumps({"runs": docs}, indent=2) + "\n"
    prove.write_atomic(out, text)
    table = "\n".join(render(d) for d in docs)
    print(table)
    if args.readme:
        prove.replace_between(layout.dist.parent / "README.md", *markers, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
