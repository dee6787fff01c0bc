"""The house rules: layering, function length, README size, generated
blocks in sync with their sources."""

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from keras_fork.bench import tables
from keras_fork.proof import fixes
from keras_fork.proof import prove
from keras_fork.recipe import pins

ROOT = pins.CODE_ROOT
MAX_FUNCTION_LINES = 60
README_MAX_LINES = 200


def test_layering_contracts_hold():
    """setup.cfg's import-linter contracts: the harness imports nothing of
    the tool, the tool no test module, the proof tests not the tool, the
    tool's layers, and no import cycle in any package (imports inside
    functions included)."""
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint), "setup.cfg", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def _not_test_code():
    """Every Python file outside tests: the tool, the harness, the proof
    suite's conftest and the fixes' packages (their test_*.py are tests)."""
    files = list((ROOT / "keras_fork").rglob("*.py"))
    for p in (ROOT / "integration_tests").rglob("*.py"):
        if not p.name.startswith("test_"):
            files.append(p)
    return sorted(files)


def _long_functions(path: Path):
    """``(line, name, length)`` of each function of ``path`` over the
    limit."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - first + 1
            if length > MAX_FUNCTION_LINES:
                yield first, node.name, length


def test_no_function_outside_tests_is_over_60_lines():
    """Counted from the first decorator (or ``def``) to the last line,
    docstring included."""
    files = _not_test_code()
    assert any(p.name == "prove.py" for p in files)
    too_long = [
        f"{p.relative_to(ROOT)}:{line} {name}: {length} lines"
        for p in files
        for line, name, length in _long_functions(p)
    ]
    assert not too_long, too_long


def test_the_function_length_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"@decorated\ndef f():\n{body}\n")
    assert list(_long_functions(path)) == [(1, "f", MAX_FUNCTION_LINES + 2)]


def test_readme_is_a_front_door_of_at_most_200_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def _between(text: str, begin: str, end: str) -> str:
    assert text.count(begin) == 1 and text.count(end) == 1, (begin, end)
    return text.partition(begin)[2].partition(end)[0]


def test_readme_blocks_are_generated_from_the_fix_folders():
    """Stale after a fix folder changed: run
    ``python -m keras_fork fixes --readme``."""
    rows = fixes.catalog(pins.Layout.default(), with_proof=False)
    text = (ROOT / "README.md").read_text()
    table = _between(text, fixes.README_BEGIN, fixes.README_END)
    assert table == "\n" + fixes.readme_table(rows)
    notices_doc = (ROOT / "docs" / fixes.NOTICES_DOC).read_text()
    notices = _between(notices_doc, fixes.NOTICES_BEGIN, fixes.NOTICES_END)
    assert notices == "\n" + fixes.notices(rows)


def test_fork_numbers_and_patch_counts_are_generated():
    """README's install commands and docs/upstream.md's series table come
    from bases.toml and patches/ (``fixes --readme``), so they cannot go
    stale; nothing else in either names a fork build number."""
    bases = fixes.series_rows(pins.Layout.default())
    readme = (ROOT / "README.md").read_text()
    block = _between(readme, fixes.INSTALL_BEGIN, fixes.INSTALL_END)
    assert block == "\n" + fixes.install_block(bases)
    upstream = (ROOT / "docs" / fixes.UPSTREAM_DOC).read_text()
    table = _between(upstream, fixes.SERIES_BEGIN, fixes.SERIES_END)
    assert table == "\n" + fixes.series_table(bases)
    for text, block in ((readme, block), (upstream, table)):
        rest = text.replace(block, "")
        assert not re.findall(r"\+fork\.\d+", rest)


def test_the_master_pr_sizes_are_generated():
    """docs/upstream.md's PR sizes come from the series (``fixes
    --readme``), in submission order, so they cannot go stale."""
    layout = pins.Layout.default()
    upstream = (ROOT / "docs" / fixes.UPSTREAM_DOC).read_text()
    table = _between(upstream, fixes.PR_SIZES_BEGIN, fixes.PR_SIZES_END)
    assert table == "\n" + fixes.pr_sizes_table(layout)


@pytest.mark.parametrize(
    "doc, markers",
    [
        ("proof.md", (prove.DOCS_BEGIN, prove.DOCS_END)),
        ("benchmarks.md", (tables.DOCS_BEGIN, tables.DOCS_END)),
        ("benchmarks.md", (tables.WORK_BEGIN, tables.WORK_END)),
        ("benchmarks.md", (tables.AA_BEGIN, tables.AA_END)),
    ],
)
def test_docs_have_the_generated_table_markers(doc, markers):
    text = (ROOT / "docs" / doc).read_text()
    _between(text, *markers)
    readme = (ROOT / "README.md").read_text()
    for marker in markers:
        assert marker not in readme, "measurements go to docs/, not README"


def test_every_option_of_every_verb_has_a_help_text():
    """Issue 37: ``--help`` covers every option."""
    from keras_fork import cli

    sub = next(
        a
        for a in cli.parser()._actions
        if isinstance(a, argparse._SubParsersAction)
    )
    bare = [
        f"{verb} {'/'.join(action.option_strings)}"
        for verb, verb_parser in sub.choices.items()
        for action in verb_parser._actions
        if action.help is None and not isinstance(action, argparse._HelpAction)
    ]
    assert not bare, bare


@pytest.mark.parametrize(
    "verb, module",
    [
        ("build", "keras_fork.recipe.build"),
        ("pr-series", "keras_fork.upstream.prseries"),
    ],
)
def test_a_verb_imports_only_its_own_module(verb, module):
    """``build`` and ``pr-series`` (scripts/build runs both) and ``--help``
    must run with ``requirements/build.txt`` alone: choosing a verb imports
    no other verb's module. The real check is scripts/test's first stage, a
    build from that environment alone."""
    code = (
        "import sys\n"
        "from keras_fork import cli\n"
        f"cli.parser({{cli.chosen_verb([{verb!r}, '--help'])}})\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = set(proc.stdout.split())
    assert module in loaded
    from keras_fork import cli

    others = {m for m, _ in cli.VERBS.values()} - {module}
    others |= {"keras_fork.proof", "keras_fork.bench"}
    if verb == "build":
        others.add("keras_fork.upstream")
    assert not loaded & others, loaded & others
    assert not {"filelock", "integration_tests", "torch", "jax"} & loaded
