"""``python -m keras_fork fixes``: the fix catalog as a table or JSON.

One row a fix (``integration_tests/fixes/<id>/fix.toml``): its bases, its
upstream issue, where upstream stands (the fix's ``upstream`` note, else
the ``Forwarded`` / ``Applied-Upstream`` trailers of its patches), the
proven / guard / n/a cell counts of the last ``dist/proof.json`` (the
declared cells when there is none), and its patch file on each base (the
``Fork-Fix:`` trailers of ``patches/<V>/``).

``--readme`` rewrites the generated blocks of README.md (the fix table, the
install commands), docs/notices.md and docs/upstream.md's series table, from the
same folders, ``bases.toml`` and ``patches/`` (a test fails when one is
stale), so that no fork number or patch count is typed by hand.
"""

from __future__ import annotations

import collections
import json

from keras_fork.outputs import print_table
from keras_fork.outputs import replace_between
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import variants
from keras_fork.proof.runner import load_previous
from keras_fork.recipe import patchfile
from keras_fork.recipe import pins
from keras_fork.recipe import series
from keras_fork.recipe import submission

README_BEGIN = "<!-- fix-table:begin -->"
README_END = "<!-- fix-table:end -->"
NOTICES_BEGIN = "<!-- notices:begin -->"
NOTICES_END = "<!-- notices:end -->"
# The install commands (README) and the series table (docs/upstream.md):
# wheel names, patch and fix counts, from bases.toml and patches/ alone.
INSTALL_BEGIN = "<!-- install:begin -->"
INSTALL_END = "<!-- install:end -->"
SERIES_BEGIN = "<!-- series:begin -->"
SERIES_END = "<!-- series:end -->"
# docs/upstream.md's sizes of the master PRs, in submission order.
PR_SIZES_BEGIN = "<!-- pr-sizes:begin -->"
PR_SIZES_END = "<!-- pr-sizes:end -->"
# README: what each wheel carries beyond the upstream PRs; docs/upstream.md:
# the self-review of the PRs; docs/parity.md: each fix on each base.
CARRIED_BEGIN = "<!-- carried:begin -->"
CARRIED_END = "<!-- carried:end -->"
REVIEW_BEGIN = "<!-- self-review:begin -->"
REVIEW_END = "<!-- self-review:end -->"
PARITY_BEGIN = "<!-- parity:begin -->"
PARITY_END = "<!-- parity:end -->"
NOTICES_DOC = "notices.md"
PARITY_DOC = "parity.md"
UPSTREAM_DOC = "upstream.md"
COUNTED = ("proven", "guard", "n/a")


def patches_by_fix(layout: pins.Layout) -> dict:
    """``{fix id: {base: [PatchInfo, ...]}}`` from the ``Fork-Fix:``
    trailers of every base's series (repo-only patches included), in
    series order; a patch without the trailer is listed under ``None``.

    Raises:
        ForkError: a base's series cannot be read (``series.read_series``).
    """
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for base in pins.load_bases(layout).values():
        files = series.read_series(layout, base)
        files += series.read_repo_only(layout, base)
        for path in files:
            info = patchfile.parse_patch(path)
            for fix_id in info.fixes or (None,):
                out[fix_id][base.version].append(info)
    return out


def problems(layout: pins.Layout) -> list[str]:
    """What is inconsistent between the fix folders and the series, one
    line each (empty when nothing is):

    * a patch whose ``Fork-Fix:`` trailer is missing or names no fix
      folder (a typo would silently turn that fix's unit cells ``n/a``);
    * a fix with no patch on any base;
    * a patch on a base its fix does not list in ``bases``;
    * a fix that declares no cell for some topology on some base;
    * a fix absent from a pinned base without a reason (``parity``);
    * a cell that runs (not ``n/a``) whose prerequisites have no patch on
      its base, or share a patch with its fix
      (``variants.prerequisite_patches``): its stock side cannot be built,
      so it must be declared ``n/a`` with the reason.

    Raises:
        ForkError: a fix folder or a series cannot be read.
    """
    fixes = {f.id: f for f in cells_lib.load_fixes(layout.fixes)}
    by_fix = patches_by_fix(layout)
    out = []
    for fix_id, per_base in by_fix.items():
        for version, infos in per_base.items():
            for info in infos:
                if fix_id is None:
                    out.append(f"{version}/{info.name}: no Fork-Fix trailer")
                elif fix_id not in fixes:
                    out.append(
                        f"{version}/{info.name}: Fork-Fix: {fix_id} names no "
                        f"fix folder (known: {', '.join(sorted(fixes))})"
                    )
                elif version not in fixes[fix_id].bases:
                    out.append(
                        f"{version}/{info.name}: fix {fix_id} does not list "
                        f"base {version} in its bases"
                    )
    bases = pins.load_bases(layout)
    for fix in fixes.values():
        if fix.id not in by_fix:
            out.append(f"fix {fix.id}: no patch on any base")
        out += [
            f"fix {fix.id}: absent from base {v} without a reason "
            "(fix.toml [absent], or the base's absent in bases.toml)"
            for v, base in bases.items()
            if v not in fix.bases and not (fix.absent.get(v) or base.absent)
        ]
        for version, missing in cells_lib.missing_cells(fix).items():
            out.append(f"fix {fix.id} on {version}: no cell for {missing}")
    return out + _prerequisite_problems(layout, fixes.values())


def _prerequisite_problems(layout: pins.Layout, fixes) -> list[str]:
    """See ``problems``: a running cell whose stock side cannot be built."""
    bases = pins.load_bases(layout)
    out = []
    for fix in fixes:
        for cell in cells_lib.fix_cells(fix):
            if not cell.needs or cell.expect == "n/a":
                continue
            try:
                variants.prerequisite_patches(
                    layout, bases[cell.base], cell.needs, fix.id
                )
            except variants.PrerequisiteError as e:
                out.append(f"{cell.slug}: {e}; declare it n/a")
    return out


def upstream_status(fix: cells_lib.Fix, patches: dict) -> str:
    """Where upstream stands on ``fix``: its ``upstream`` note, else what
    its patches' DEP-3 trailers say (``Applied-Upstream``, ``Forwarded``).
    """
    if fix.upstream:
        return fix.upstream
    infos = [i for per_base in patches.values() for i in per_base]
    applied = sorted({i.trailers.get("Applied-Upstream", "no") for i in infos})
    forwarded = sorted({i.trailers.get("Forwarded", "no") for i in infos})
    if applied and applied != ["no"]:
        return f"applied upstream in {', '.join(applied)}"
    if forwarded and forwarded != ["no"]:
        return f"forwarded: {', '.join(forwarded)}"
    return "open: not forwarded yet"


def counts(fix: cells_lib.Fix, proof: dict) -> dict:
    """``{"proven": n, "guard": n, "n/a": n, "source": ...}`` of a fix's
    cells: the verdicts of ``proof`` (``runner.load_previous`` of
    ``dist/proof.json``) where it has every cell, else the declared ones
    (``source`` says which); a problem verdict (``cells.PROBLEMS``:
    ``vacuous``, ``guard-failed-on-stock``, ``broken``) is counted under
    its own name."""
    cells = cells_lib.fix_cells(fix)
    run = [proof.get(c.key) for c in cells]
    if all(run):
        verdicts = [r["verdict"] for r in run]
        source = "dist/proof.json"
    else:
        verdicts = [c.expect for c in cells]
        source = "declared"
    tally = collections.Counter(verdicts)
    out = {k: tally.pop(k, 0) for k in COUNTED}
    out.update(tally)
    out["source"] = source
    return out


def catalog(layout: pins.Layout, with_proof: bool = True) -> list[dict]:
    """One dict a fix, in series order (the bases of ``bases.toml`` in
    order, then the position of the fix's first patch): ``id``, ``bases``,
    ``issue``, ``summary``, ``notice``, ``upstream``, ``cells`` (see
    ``counts``; only the declared cells unless ``with_proof``),
    ``patches`` (``{base: [file name, ...]}``) and ``parity`` (``{base:
    status}``, see ``parity``)."""
    by_fix = patches_by_fix(layout)
    proof = load_previous(layout.proof) if with_proof else {}
    rows = []
    for fix in cells_lib.load_fixes(layout.fixes):
        patches = by_fix.get(fix.id, {})
        rows.append(
            {
                "id": fix.id,
                "bases": list(fix.bases),
                "issue": fix.issue,
                "summary": fix.summary,
                "notice": fix.notice,
                "upstream": upstream_status(fix, patches),
                "cells": counts(fix, proof),
                "patches": {v: [i.name for i in p] for v, p in patches.items()},
                "parity": parity(layout, fix, patches),
            }
        )
    position = _series_position(layout, by_fix)
    return sorted(rows, key=lambda r: position.get(r["id"], (99, 0)))


def parity(layout: pins.Layout, fix, patches: dict) -> dict:
    """``{base: status}`` of ``fix`` on every pinned base: ``"pr"`` (its
    patches there are upstream PRs), ``"carried"`` (carried patches only;
    every patch of a release base, which takes no PRs, is carried),
    ``"pr + carried"``, ``"upstream"`` (a base it lists without a patch:
    upstream has it, its cells guard it), or ``"absent: <why>"``
    (``fix.toml``'s ``[absent]``, else the base's ``absent``;
    ``problems`` flags a fix absent without either).
    """
    out = {}
    for version, base in pins.load_bases(layout).items():
        names = [i.name for i in patches.get(version, [])]
        if not names and version in fix.bases:
            out[version] = "upstream"
            continue
        if not names:
            why = fix.absent.get(version) or base.absent or "no reason given"
            out[version] = f"absent: {why}"
            continue
        if base.package != "keras-nightly":  # a release takes no PRs
            out[version] = "carried"
            continue
        sub = submission.read(layout, base)
        kinds = {sub.kind_of(n) for n in names}
        out[version] = " + ".join(k for k in ("pr", "carried") if k in kinds)
    return out


def _series_position(layout: pins.Layout, by_fix: dict) -> dict:
    """``{fix id: (base index, patch index)}`` of each fix's first patch."""
    out = {}
    versions = list(pins.load_bases(layout))
    for fix_id, per_base in by_fix.items():
        for version, infos in per_base.items():
            seq = [i.name for i in _series_infos(layout, version)]
            where = (versions.index(version), seq.index(infos[0].name))
            out[fix_id] = min(out.get(fix_id, where), where)
    return out


def _series_infos(layout, version):
    base = pins.get_base(layout, version)
    files = series.read_series(layout, base) + series.read_repo_only(
        layout, base
    )
    return [patchfile.parse_patch(p) for p in files]


def readme_table(rows: list[dict]) -> str:
    """The README's fix table (markdown) with the matrix totals."""
    lines = [
        "| fix id | bases | what it fixes | upstream issue | proven / guard "
        "/ n/a |",
        "|---|---|---|---|---|",
    ]
    total = collections.Counter()
    for r in rows:
        c = r["cells"]
        total.update({k: c[k] for k in COUNTED})
        lines.append(
            f"| `{r['id']}` | {', '.join(r['bases'])} | {r['summary']} | "
            f"{r['issue']} | {c['proven']} / {c['guard']} / {c['n/a']} |"
        )
    lines.append(
        f"| **all** | | {len(rows)} fixes | | **{total['proven']} / "
        f"{total['guard']} / {total['n/a']}** |"
    )
    return "\n".join(lines) + "\n"


def notices(rows: list[dict]) -> str:
    """docs/notices.md's "what a user of the wheel notices" list
    (markdown)."""
    return "".join(
        f"- **`{r['id']}`** ({', '.join(r['bases'])}): {r['notice']}\n"
        for r in rows
        if r["notice"]
    )


def series_rows(layout: pins.Layout) -> list[dict]:
    """One dict a base, in ``bases.toml`` order: ``version``, ``package``
    (``keras`` or ``keras-nightly``), ``wheel`` (its file name),
    ``patches`` (the series' patch count, repo-only ones apart) and
    ``fixes`` (the fix ids its patches carry, sorted)."""
    rows = []
    for base in pins.load_bases(layout).values():
        infos = [
            patchfile.parse_patch(p) for p in series.read_series(layout, base)
        ]
        rows.append(
            {
                "version": base.version,
                "package": base.package,
                "wheel": base.wheel_name,
                "patches": len(infos),
                "fixes": sorted({f for i in infos for f in i.fixes}),
            }
        )
    return rows


def install_block(rows: list[dict]) -> str:
    """The README's install commands (markdown): one ``pip install`` a
    wheel, after uninstalling ``keras-nightly`` (it and the wheels, whose
    distribution name is ``keras``, would both own ``keras/``)."""
    lines = [
        "```sh",
        "# keras-nightly owns keras/ under another name: uninstall it first,",
        "# or removing it later deletes the fork's files (a `keras` release",
        "# is replaced by the wheel as it is).",
        "pip uninstall -y keras-nightly",
        "# then one wheel, beside tensorflow / jax / torch:",
    ]
    for r in rows:
        what = f"{r['package']} {r['version']}"
        lines.append(f"pip install dist/{r['wheel']}  # {what}: {_counted(r)}")
    lines += [
        'python -c "import keras; print(keras.__version__)"',
        "```",
    ]
    return "\n".join(lines) + "\n"


def _counted(row: dict) -> str:
    """``"<n> patches, <m> fixes"`` of a ``series_rows`` row, in English
    numbers (``1 fix``)."""
    n, m = row["patches"], len(row["fixes"])
    return f"{n} patch{'es' * (n != 1)}, {m} fix{'es' * (m != 1)}"


def series_table(rows: list[dict]) -> str:
    """docs/upstream.md's table of the series (markdown): a row a base."""
    lines = [
        "| base | wheel | patches | fixes |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['package']} {r['version']} | `{r['wheel']}` "
            f"| {r['patches']} | {len(r['fixes'])} |"
        )
    return "\n".join(lines) + "\n"


def pr_sizes_table(layout: pins.Layout) -> str:
    """docs/upstream.md's table of each PR's size (markdown), for every
    base sent upstream one PR at a time (a nightly base: its sdist has no
    tests, ``sdist_tests`` false), in submission order
    (``submission.read_submission``): source and test lines added and
    removed (``series.line_counts``)."""
    lines = [
        "| base | # | PR | source lines (+/-) | test lines (+/-) |",
        "|---|---|---|---|---|",
    ]
    for base in pins.load_bases(layout).values():
        if base.sdist_tests:
            continue
        order = submission.read_submission(layout, base)
        for k, patch in enumerate(order, start=1):
            subject = patchfile.parse_patch(patch).subject
            counts = series.line_counts(patch)
            src, tests = counts["source"], counts["tests"]
            lines.append(
                f"| {base.version} | {k} | {subject} "
                f"| +{src[0]} -{src[1]} | +{tests[0]} -{tests[1]} |"
            )
    return "\n".join(lines) + "\n"


def carried_lines(layout: pins.Layout) -> str:
    """The README's list of what each wheel carries beyond the upstream
    PRs (markdown): one line a carried patch of each base that sends PRs
    (``submission``), with what it waits on; release bases carry their
    whole series (the fix table)."""
    lines = []
    for base in pins.load_bases(layout).values():
        if base.package != "keras-nightly":
            continue
        for c in submission.read(layout, base).carried:
            info = patchfile.parse_patch(c.patch)
            fixes = ", ".join(f"`{f}`" for f in info.fixes)
            waits = f"design {c.issue.label}" if c.issue else c.waits_on
            lines.append(
                f"- {base.version} ({fixes}): {info.subject}; waits on {waits}"
            )
    return "\n".join(lines or ["- none"]) + "\n"


def review_table(layout: pins.Layout) -> str:
    """docs/upstream.md's self-review (markdown), from each master
    series' ``submission.toml``: a row a PR (its number, subject, when it
    is sent, verdict and what is left), a row a carried patch, and the
    counts of each verdict and group."""
    lines = [
        "| base | # | PR | sent | verdict | left |",
        "|---|---|---|---|---|---|",
    ]
    tally, groups = collections.Counter(), collections.Counter()
    for base in pins.load_bases(layout).values():
        if base.package != "keras-nightly":
            continue
        sub = submission.read(layout, base)
        for pr in sub.prs:
            sent = f"after {pr.after.label}" if pr.after else "now"
            groups["after a design issue" if pr.after else "to send now"] += 1
            tally[pr.verdict or "-"] += 1
            lines.append(
                f"| {base.version} | {pr.number} | "
                f"{patchfile.parse_patch(pr.patch).subject} | {sent} | "
                f"{pr.verdict or '-'} | {pr.note} |"
            )
        for c in sub.carried:
            groups["carried"] += 1
            lines.append(
                f"| {base.version} | - | "
                f"{patchfile.parse_patch(c.patch).subject} | carried | - | "
                f"{c.why}; waits on {c.waits_on} |"
            )
    lines += ["", f"Counted: {_tally(tally)}; {_tally(groups)}"]
    return "\n".join(lines) + ".\n"


def _tally(counter: collections.Counter) -> str:
    """``"3 X, 1 Y"`` in descending count order."""
    return ", ".join(f"{n} {k}" for k, n in counter.most_common())


def parity_table(rows: list[dict], versions: list[str]) -> str:
    """docs/parity.md's table (markdown): a row a fix, a column a base,
    each cell its ``parity`` status; each reason for an absence is
    written once, as a numbered note under the table."""
    lines = [
        "| fix | " + " | ".join(versions) + " |",
        "|---" * (len(versions) + 1) + "|",
    ]
    reasons: list[str] = []
    for r in rows:
        cells = []
        for v in versions:
            status = r["parity"][v]
            why = status.removeprefix("absent: ")
            if why != status:
                if why not in reasons:
                    reasons.append(why)
                status = f"absent ({reasons.index(why) + 1})"
            cells.append(status)
        lines.append(f"| `{r['id']}` | " + " | ".join(cells) + " |")
    notes = [f"({k}) {why}" for k, why in enumerate(reasons, start=1)]
    return "\n\n".join(["\n".join(lines), *notes]) + "\n"


def write_readme(layout: pins.Layout) -> None:
    """Rewrites README.md's generated blocks (the fix table, the install
    commands) and docs/notices.md from the fix folders, with the declared
    cells, and docs/upstream.md's series table."""
    rows = catalog(layout, with_proof=False)
    readme = layout.root / "README.md"
    replace_between(readme, README_BEGIN, README_END, readme_table(rows))
    replace_between(
        layout.docs / NOTICES_DOC, NOTICES_BEGIN, NOTICES_END, notices(rows)
    )
    bases = series_rows(layout)
    replace_between(readme, INSTALL_BEGIN, INSTALL_END, install_block(bases))
    upstream = layout.docs / UPSTREAM_DOC
    replace_between(upstream, SERIES_BEGIN, SERIES_END, series_table(bases))
    replace_between(
        upstream, PR_SIZES_BEGIN, PR_SIZES_END, pr_sizes_table(layout)
    )
    replace_between(readme, CARRIED_BEGIN, CARRIED_END, carried_lines(layout))
    replace_between(upstream, REVIEW_BEGIN, REVIEW_END, review_table(layout))
    versions = list(pins.load_bases(layout))
    replace_between(
        layout.docs / PARITY_DOC,
        PARITY_BEGIN,
        PARITY_END,
        parity_table(rows, versions),
    )


def add_arguments(p) -> None:
    """The ``fixes`` verb's options."""
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a Fork-Fix trailer names no fix, a fix has no "
        "patch, or a fix misses a cell",
    )
    out.add_argument(
        "--json", action="store_true", help='print {"fixes": [{"id": ...}]}'
    )
    out.add_argument(
        "--readme",
        action="store_true",
        help="rewrite README.md's generated blocks (fix table, install "
        "commands), docs/notices.md and docs/upstream.md's series table",
    )


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork fixes``: prints the catalog (a table, or
    JSON with ``--json``), or rewrites the README's fix table."""
    if args.check:
        found = problems(layout)
        for line in found:
            print(f"fixes: {line}")
        print(f"fixes: {len(found)} problem(s)")
        return 1 if found else 0
    if args.readme:
        write_readme(layout)
        print("rewrote README.md's generated blocks and docs/upstream.md's")
        return 0
    rows = catalog(layout)
    if args.json:
        print(json.dumps({"fixes": rows}, indent=2))
        return 0
    _print(rows)
    return 0


def _print(rows: list[dict]) -> None:
    lines = []
    for r in rows:
        c = r["cells"]
        patches = "\n".join(
            f"{v}: {name}"
            for v, names in r["patches"].items()
            for name in names
        )
        lines.append(
            (
                r["id"],
                ", ".join(r["bases"]),
                r["issue"],
                r["upstream"],
                str(c["proven"]),
                str(c["guard"]),
                str(c["n/a"]),
                patches or "-",
            )
        )
    columns = ("fix", "bases", "issue", "upstream", "proven", "guard", "n/a")
    print_table(
        "fixes (integration_tests/fixes/<id>/fix.toml)",
        (*columns, "patches"),
        lines,
    )
    sources = {r["cells"]["source"] for r in rows}
    print(f"cell counts from: {', '.join(sorted(sources))}")
