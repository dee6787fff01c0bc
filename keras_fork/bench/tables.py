"""The benchmark documents and tables: ``dist/bench*.json`` runs, their
merges with the last run, and the Markdown tables of docs/benchmarks.md and
docs/upstream.md.
"""

from __future__ import annotations

import datetime
import os
import platform

from keras_fork.bench import suite

DOCS_BEGIN = "<!-- bench-table:begin -->"
DOCS_END = "<!-- bench-table:end -->"
# The A/A run's table (``--aa``), beside the timing table.
AA_BEGIN = "<!-- bench-aa:begin -->"
AA_END = "<!-- bench-aa:end -->"
WORK_BEGIN = "<!-- bench-work:begin -->"
WORK_END = "<!-- bench-work:end -->"
# docs/upstream.md's collectives per step of each master PR alone.
ALONE_BEGIN = "<!-- bench-alone:begin -->"
ALONE_END = "<!-- bench-alone:end -->"


def run_doc(base, accelerator, rows, **kind):
    """A run's document: base, the fork wheel's version it measured, date,
    machine, ``kind`` (rounds, A/A or work) and its rows (``cases``)."""
    return {
        "base": base.version,
        "wheel": getattr(base, "fork_version", None),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{accelerator.upper()}",
        **kind,
        "cases": rows,
    }


def _measured(doc) -> str:
    """What a run measured, for a table's header: the base, and the fork
    wheel's version where the run recorded it."""
    wheel = doc.get("wheel")
    return f"{doc['base']} (fork wheel {wheel})" if wheel else doc["base"]


def merge_alone(previous, doc, submission):
    """Puts the rows of ``doc`` (a ``run_alone`` of some PRs) into
    ``previous``, the last ``dist/bench-alone.json`` run of the same base.

    Args:
        previous: that run's document, or None.
        doc: the new run's document.
        submission: the patch names of the series in submission order: a
            previous row is kept only where its PR number still names the
            same patch (a renumbered or reworked-and-renamed PR's old
            counts are dropped, not shown under its new number).

    Returns:
        ``doc`` with the previous rows it did not count again (same case,
        topology and PR), sorted by PR; ``doc`` alone where ``previous``
        ran on another machine.
    """
    if not previous or previous.get("machine") != doc["machine"]:
        return doc
    counted = {(r["case"], r["topology"], r["pr"]) for r in doc["cases"]}
    rows = [
        dict(r, date=r.get("date", previous["date"]))
        for r in previous["cases"]
        if (r["case"], r["topology"], r["pr"]) not in counted
        and 0 < r["pr"] <= len(submission)
        and submission[r["pr"] - 1] == r["patch"]
    ]
    rows = sorted(rows + doc["cases"], key=lambda r: r["pr"])
    return dict(doc, cases=rows)


def render_alone_table(doc) -> str:
    """The docs/upstream.md table of a ``run_alone`` document: a row a
    PR, a column a case, ``stock -> with the PR alone`` collectives per
    step (eager reductions per step after a ``+``)."""
    cases = list(
        dict.fromkeys((r["case"], r["topology"]) for r in doc["cases"])
    )
    head = " | ".join(f"{c} ({t})" for c, t in cases)
    lines = [
        f"_keras {_measured(doc)}, {doc['machine']}, {_date_range(doc)}; "
        "collectives per step, master -> master with the PR alone._",
        "",
        f"| PR | {head} |",
        "|---|" + "---|" * len(cases),
    ]
    by_pr = {}
    for r in doc["cases"]:
        by_pr.setdefault(r["pr"], {})[(r["case"], r["topology"])] = r
    for k, cells in sorted(by_pr.items()):
        texts = [_alone_text(cells.get(c)) for c in cases]
        lines.append(f"| {k} | " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"


def _alone_text(row) -> str:
    if row is None:
        return "-"
    if row["error"]:
        return "does not apply alone"
    stock, alone = row["stock"], row["alone"]
    if stock is None or alone is None:
        return "not counted"

    def one(c):
        return f"{c['step']}" + (f" + {c['eager']:g}" if c["eager"] else "")

    before, after = one(stock), one(alone)
    return f"{before} -> {after}" + (" (same)" if before == after else "")


def _graph_text(row) -> str:
    stock, fork = row["stock_graph"], row["fork_graph"]
    if stock is None and fork is None:
        return "- (eager)"
    if (stock or fork).get("kind") == "eager":  # torch: collectives only
        return "- (eager)" + _collectives_text(stock, fork)
    if stock and fork and stock["digest"] == fork["digest"]:
        text = f"same {stock['kind']} ({stock['ops']} ops)"
    else:
        sizes = "/".join(str(g["ops"]) if g else "-" for g in (stock, fork))
        text = f"differs: {(stock or fork)['kind']} {sizes} ops"
    return text + _collectives_text(stock, fork)


def _collectives_text(stock, fork) -> str:
    """``"; collectives/step 1 -> 2"`` (plus the eager reductions a step
    runs outside the graph, where any), or ``""`` when not counted."""
    if not (
        stock and fork and "collectives" in stock and "collectives" in fork
    ):
        return ""
    text = f"; collectives/step {stock['collectives']} -> {fork['collectives']}"
    if stock.get("eager_per_step") or fork.get("eager_per_step"):
        text += (
            f", eager reductions/step {stock.get('eager_per_step', 0):g} -> "
            f"{fork.get('eager_per_step', 0):g}"
        )
    return text


def render_work_table(doc) -> str:
    """The docs/benchmarks.md table of a ``run_work`` document."""
    lines = [
        f"_keras {_measured(doc)}, {doc['machine']}, {_date_range(doc)}; "
        "Python calls per step (per call for stateless_call): the fewest of "
        f"{suite.WORK_EPOCHS} epochs, fork - stock; compiled step: stock vs "
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
        measured on another machine, with another number of rounds, by
        another method or as another kind of run (A/A or not), whose rows
        would not compare.
    """
    if (
        not previous
        or previous.get("machine") != doc["machine"]
        or previous.get("rounds") != doc["rounds"]
        or previous.get("method") != doc.get("method")
        or previous.get("aa", False) != doc.get("aa", False)
    ):
        return doc
    measured = {_row_key(r) for r in doc["cases"]}
    rows = [r for r in previous["cases"] if _row_key(r) not in measured]
    rows += doc["cases"]
    order = {(c[0], c[2], c[3]): i for i, c in enumerate(suite.CASES)}
    rows.sort(key=lambda r: order.get(_row_key(r), len(order)))
    return dict(doc, cases=rows)


def _date_range(doc) -> str:
    """The day the rows of ``doc`` were measured, or the first..last day
    (rows kept from an earlier run by ``merge``)."""
    dates = sorted({r.get("date", doc["date"]) for r in doc["cases"]})
    return dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"


def render_table(doc) -> str:
    """The docs/benchmarks.md table of a ``run`` document."""
    date = _date_range(doc)
    pair, what = "stock and fork taking turns", "fork/stock"
    if doc.get("aa"):
        pair = (
            "stock and stock taking turns (A/A run: the fork column is "
            "stock again)"
        )
        what = "stock/stock"
    lines = [
        f"_keras {_measured(doc)}, {doc['machine']}, {date}, {doc['rounds']} "
        f"rounds of {pair}; ratio: the median of the "
        f"paired {what} ratios [95% interval, rounds and pairs "
        "resampled] (the rounds' medians, min..max); single-device cases "
        "pinned to one core._",
        "",
        "| case | backend | topology | stock | fork | ratio | pairs | "
        "peak MiB stock/fork |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["cases"]:
        lines.append(
            f"| {r['case']} | {r['backend']} | {r['topology']} | "
            f"{r['stock_median_s'] * 1e3:.3f} ms | "
            f"{r['fork_median_s'] * 1e3:.3f} ms | {r['ratio']:.3f} "
            f"[{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}] "
            f"({r['ratio_min']:.2f}..{r['ratio_max']:.2f}) | {r['pairs']} | "
            f"{r['stock_peak_mib']:.0f}/{r['fork_peak_mib']:.0f} |"
        )
    for f in doc.get("failed", ()):
        lines.append(
            f"| {f['case']} | {f['backend']} | {f['topology']} | - | - | "
            f"not measured: {f['error'].replace('|', '/')} | 0 | - |"
        )
    return "\n".join(lines) + "\n"
