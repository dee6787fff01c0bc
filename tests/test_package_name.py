"""The proof suite works under any top-level package name: it ships as a
wheel named otherwise (e.g. ``keras_fork_tests``), so nothing inside
``integration_tests/`` may name ``integration_tests``: its imports are
relative, and the module its workers run (``python -m ...``, the fork
server's preload) comes from ``__name__``."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

from keras_fork.recipe import pins

NAME = "kft_copy"
ABSOLUTE_IMPORT = re.compile(
    r"^\s*(from|import)\s+integration_tests\b", re.MULTILINE
)
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# Runs in the copy's parent folder, with only that folder on PYTHONPATH and
# ``integration_tests`` blocked: every harness module that imports no
# backend, the conftest, then 2 workers started each way (spawned: a fresh
# ``python -m <name>.harness.workers``; forked from the fork server, whose
# preloaded keras is a stub here).
PROBE = f"""\
import json
import sys

sys.modules["integration_tests"] = None
import {NAME}.conftest
from {NAME}.harness import data, devices, plugin, progress
from {NAME}.harness import selection, topologies, workers

print(json.dumps({{
    start: workers.run_workers(
        "kft_probe:probe", world_size=2, timeout=120,
        env={{"PROOF_WORKER_START": start}},
    )
    for start in ("spawn", "forkserver")
}}))
"""
WORKER = """\
import importlib.util
import sys


def probe(rank, world_size):
    main = sys.modules["__main__"]
    return {
        "rank": rank,
        "main": getattr(main.__spec__, "name", None),
        "harness": sorted(m for m in sys.modules if ".harness" in m),
        "importable": bool(importlib.util.find_spec("integration_tests")),
    }
"""


def _names_the_package(path) -> bool:
    """Whether ``path`` imports ``integration_tests`` by name, or has a
    string naming it (a module to run, a worker target) other than a
    docstring."""
    text = path.read_text()
    if ABSOLUTE_IMPORT.search(text):
        return True
    tree = ast.parse(text)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, DOCUMENTED)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return any(
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "integration_tests" in node.value
        and id(node) not in docstrings
        for node in ast.walk(tree)
    )


def _copy(tmp_path):
    copy = tmp_path / NAME
    shutil.copytree(
        pins.CODE_ROOT / "integration_tests",
        copy,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (tmp_path / "kft_probe.py").write_text(WORKER)
    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "__init__.py").write_text("")
    return copy


def test_the_proof_suite_runs_under_another_package_name(tmp_path):
    copy = _copy(tmp_path)
    named = [
        str(p.relative_to(tmp_path))
        for p in sorted(copy.rglob("*.py"))
        if _names_the_package(p)
    ]
    assert not named, f"name integration_tests: {named}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOF_")}
    env["PYTHONPATH"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = json.loads(proc.stdout.splitlines()[-1])
    for start, results in runs.items():
        assert [r["rank"] for r in results] == [0, 1], start
        for r in results:
            assert not r["importable"], (start, r)
            assert not [m for m in r["harness"] if "integration" in m], r
    # Spawned: the interpreter ran ``python -m kft_copy.harness.workers``;
    # forked: from a server that preloaded kft_copy.harness.workers.
    workers = f"{NAME}.harness.workers"
    assert {r["main"] for r in runs["spawn"]} == {workers}
    assert all(workers in r["harness"] for r in runs["forkserver"])
