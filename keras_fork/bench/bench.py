"""The ``bench`` verb: fork vs stock, measured in the same run (never a
timed test).

Timed runs (``lockstep``): stock and fork workers take turns, and each case
reports the median fork/stock ratio with its confidence interval, into
``dist/bench.json``. ``--work`` counts instead (``counts.run_work``): the
Python calls per step and the compiled training step of each step case,
stock and fork, into ``dist/bench-work.json``; with ``--alone``, the
collectives per step of each PR of a series alone
(``dist/bench-alone.json``). A run of some cases (``--case``,
``--backend``, ``--topology``) replaces those rows of the last run on the
same machine (``tables.merge``) and keeps the others; ``--docs`` puts the
table in docs/. The cases: ``suite``.
"""

from __future__ import annotations

import json
import re

from integration_tests.harness import options as cell_options
from keras_fork import options
from keras_fork.bench import counts
from keras_fork.bench import lockstep
from keras_fork.bench import suite
from keras_fork.bench import tables
from keras_fork.errors import ForkError
from keras_fork.errors import check_known
from keras_fork.outputs import replace_between
from keras_fork.outputs import write_atomic
from keras_fork.proof import prove
from keras_fork.recipe import pins
from keras_fork.recipe import submission

# The committed tables, in ``layout.docs`` (``--docs``).
DOCS_FILE = "benchmarks.md"


def add_arguments(p) -> None:
    """The ``bench`` verb's filters and options."""
    options.add_bases(p)
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="fresh stock and fork processes per case, each taking turns "
        "for the case's repetitions",
    )
    p.add_argument("--case", action="append", help="substring of case names")
    p.add_argument("--backend", action="append", help="only this backend")
    p.add_argument(
        "--topology", action="append", help="only this topology (e.g. 1)"
    )
    cell_options.add_accelerator(
        p, "the steps", "the GPUs where torch or jax sees one"
    )
    p.add_argument(
        "--docs",
        "--readme",
        dest="docs",
        action="store_true",
        help=f"also rewrite the committed table, docs/{DOCS_FILE} "
        "(--readme: its old name)",
    )
    p.add_argument(
        "--aa",
        action="store_true",
        help="A/A: measure stock against itself (noise floor), into "
        f"dist/bench-aa.json (--docs: its own table of docs/{DOCS_FILE})",
    )
    p.add_argument(
        "--work",
        action="store_true",
        help="count Python calls per step and compare the compiled steps "
        "instead of timing, into dist/bench-work.json",
    )
    p.add_argument(
        "--pr",
        type=int,
        action="append",
        help="with --alone: only this PR (its number in submission order; "
        "repeatable); the other PRs keep their rows from the last "
        "dist/bench-alone.json",
    )
    p.add_argument(
        "--alone",
        action="store_true",
        help="with --work: count the collectives per step of each PR of the "
        "series applied alone to stock, in submission order, into "
        "dist/bench-alone.json (--docs: docs/upstream.md)",
    )


def _selected_cases(args):
    """The cases ``args`` select (``select_cases``).

    Raises:
        ForkError: a refused option combination, or no case matches.
    """
    if args.rounds < 1:
        raise ForkError("--rounds must be at least 1")
    if args.aa and args.work:
        raise ForkError("--work counts, stock and fork once each: no A/A run")
    if args.alone and not args.work:
        raise ForkError("--alone counts collectives: it needs --work")
    if args.pr and not args.alone:
        raise ForkError("--pr picks the PRs of --alone: it needs --alone")
    check_known("--backend", args.backend, {c[2] for c in suite.CASES})
    check_known("--topology", args.topology, {c[3] for c in suite.CASES})
    names = {n for n in args.case or () if any(n in c[0] for c in suite.CASES)}
    check_known("--case", args.case, names | {c[0] for c in suite.CASES})
    cases = suite.select_cases(args.case, args.backend, args.topology)
    if not cases:
        raise ForkError("no case matches --case/--backend/--topology")
    return cases


def _measure_bases(args, layout, accelerator, cases, console):
    """One document a selected base (that any of ``cases`` runs on:
    ``cases_on_base``): ``run_work`` with ``--work``, else ``run``."""
    docs = []
    for b in pins.select_bases(layout, args.base):
        cases_b = suite.cases_on_base(cases, b.version)
        if not cases_b:
            console.print(f"skipped {b.version}: no selected case runs on it")
            continue
        if args.alone:
            doc = counts.run_alone(
                layout, b, accelerator, cases_b, console, args.pr
            )
        elif args.work:
            doc = counts.run_work(layout, b, accelerator, cases_b, console)
        else:
            doc = lockstep.run(
                layout, b, args.rounds, accelerator, cases_b, console, args.aa
            )
        docs.append(doc)
    return docs


def _last_runs(out) -> dict:
    """The runs of ``out``, the last run's file, by base; ``{}`` where it
    has none that can be read."""
    try:
        return {d["base"]: d for d in json.loads(out.read_text())["runs"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # no usable last run: this one stands alone


def _merge_last_run(previous, docs):
    """``docs`` each merged (``merge``) with the same base's run in
    ``previous`` (``_last_runs``); ``docs`` alone where it has none."""
    return [tables.merge(previous.get(d["base"]), d) for d in docs]


def _with_other_bases(previous, docs):
    """``docs`` and the runs of ``previous`` (``_last_runs``) of the bases
    they do not measure: a run of some bases keeps the others' tables, in
    the last file's order, with the new bases after them."""
    return _in_place(previous, {d["base"]: d for d in docs})


def _in_place(old: dict, new: dict) -> list:
    """The values of ``old`` (by base) in its order, each replaced by the
    value of ``new`` for its base, then the values of ``new`` for the
    bases ``old`` lacks."""
    new = dict(new)
    kept = [new.pop(base, value) for base, value in old.items()]
    return kept + list(new.values())


def _page_tables(page, markers) -> dict:
    """The tables between ``markers`` (begin, end) in ``page`` (a file of
    docs/), by base: each runs from its header line ``_keras <base> ...``
    to the next one. ``{}`` where the page or its block has none."""
    try:
        text = page.read_text()
    except OSError:
        return {}
    block, found, _ = text.partition(markers[0])[2].partition(markers[1])
    if not found:
        return {}
    found_tables = {}
    for part in re.split(r"(?m)^(?=_keras \S)", block):
        header = re.match(r"_keras ([^\s,]+)", part)
        if header:
            found_tables[header.group(1)] = part.rstrip("\n") + "\n"
    return found_tables


def _merge_last_alone(layout, previous, docs):
    """``docs`` (``run_alone`` of some PRs) each merged (``merge_alone``)
    with the same base's run in ``previous`` (``_last_runs`` of the last
    ``--alone`` file)."""
    merged = []
    for doc in docs:
        base = pins.select_bases(layout, [doc["base"]])[0]
        names = [p.name for p in submission.read_submission(layout, base)]
        merged.append(tables.merge_alone(previous.get(doc["base"]), doc, names))
    return merged


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork bench``: measures (or, with ``--work``,
    counts) the selected cases of each base, writes ``dist/bench*.json``,
    prints the table and, with ``--docs``, puts it in docs/benchmarks.md.

    Returns:
        0.

    Raises:
        ForkError: a refused option combination, no case matches, or a
            base or worker failed.
    """
    from rich.console import Console

    cases = _selected_cases(args)
    docs_file = DOCS_FILE
    if args.alone:
        name, render = "bench-alone.json", tables.render_alone_table
        markers, docs_file = (
            (tables.ALONE_BEGIN, tables.ALONE_END),
            "upstream.md",
        )
    elif args.work:
        name, render = "bench-work.json", tables.render_work_table
        markers = (tables.WORK_BEGIN, tables.WORK_END)
    else:
        name = "bench-aa.json" if args.aa else "bench.json"
        render, markers = (
            tables.render_table,
            (tables.AA_BEGIN, tables.AA_END)
            if args.aa
            else (tables.DOCS_BEGIN, tables.DOCS_END),
        )
    console = Console(stderr=True, highlight=False)
    accelerator, gpus = prove.resolve_accelerator(args.accelerator)
    if accelerator == "gpu":
        cases = suite.with_enough_gpus(cases, gpus, console)
    docs = _measure_bases(args, layout, accelerator, cases, console)
    out = layout.dist / name
    previous = _last_runs(out)
    if args.alone and args.pr:
        docs = _merge_last_alone(layout, previous, docs)
    elif (args.case or args.backend or args.topology) and not args.alone:
        docs = _merge_last_run(previous, docs)
    docs = _with_other_bases(previous, docs)
    write_atomic(out, json.dumps({"runs": docs}, indent=2) + "\n")
    rendered = {d["base"]: render(d) for d in docs}
    print("\n".join(rendered.values()))
    if args.docs:
        # The page's tables of the bases neither this run nor the last
        # one measured (a fresh checkout's dist/ has no run) stay.
        page = layout.docs / docs_file
        tables_of_page = _page_tables(page, markers)
        body = "\n".join(_in_place(tables_of_page, rendered))
        replace_between(page, *markers, body)
    return 0
