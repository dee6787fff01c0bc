"""Every verb with requirements/build.txt alone, what ``scripts/build``
installs: each verb's ``--help``, the fix catalog (a verb that needs
nothing more, and imports the proof's modules), and the one line that each
verb needing the test stack (``cli.TEST_STACK_VERBS``, ``status --proofs``)
gives instead of running.

A child of this interpreter (.venv, the test stack) stands in for that
environment: a meta-path finder refuses every top-level module that an
installed distribution provides, except the modules of build.txt's
distributions and of what they require (transitively, markers evaluated,
no extras) and pip's (``python -m venv`` installs it). scripts/test's first
stage runs ``scripts/build`` from a real one (build/venv).
"""

import importlib.metadata
import json
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from keras_fork import cli
from keras_fork import errors
from keras_fork.errors import ForkError
from keras_fork.recipe import pins

ROOT = pins.CODE_ROOT
# The repository's own packages, importable from the root, not installed.
OWN = {"keras_fork", "integration_tests", "tests"}
# Makes the modules named in argv[1] (comma-separated) unimportable, as if
# not installed; then the code that follows runs.
REFUSE = """\
import importlib.abc
import sys

REFUSED = frozenset(sys.argv.pop(1).split(","))
assert not REFUSED & set(sys.modules), REFUSED & set(sys.modules)


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Refuse())
"""
CLI = """\
import runpy

sys.argv[0] = "python -m keras_fork"
runpy.run_module("keras_fork", run_name="__main__", alter_sys=True)
"""
# Arguments a verb requires besides the check (none reach the network).
REQUIRED = {"pr-check": ["--base", "3.15.1", "--upstream-repo", "nowhere"]}


def _requirements(name: str) -> list[str]:
    """The distribution names that requirements/``name`` lists."""
    lines = (ROOT / "requirements" / name).read_text().splitlines()
    lines = [line.partition("#")[0].strip() for line in lines]
    return [Requirement(line).name for line in lines if line[:1].isalnum()]


def build_distributions() -> set[str]:
    """build.txt's distributions and everything they require, installed
    (canonical names)."""
    todo = [*_requirements("build.txt"), "pip"]
    seen = set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.distribution(name).requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


@pytest.fixture(scope="module")
def refused() -> list[str]:
    """The top-level modules of every installed distribution outside
    ``build_distributions``."""
    allowed = build_distributions()
    return sorted(
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if not {canonicalize_name(d) for d in dists} & allowed
        and module not in OWN
    )


def run_without(refused, *args, code=CLI) -> subprocess.CompletedProcess:
    """Runs ``code`` (default: ``python -m keras_fork args...``) in a child
    of this interpreter where the ``refused`` modules cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", REFUSE + code, ",".join(refused), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_simulated_environment_lacks_the_test_stack(refused):
    """What test.txt adds is refused; what build.txt brings is not."""
    assert {"filelock", "numpy"} <= set(refused)
    for module in ("rich", "pytest", "packaging", "build", "setuptools"):
        assert module not in refused
    proc = run_without(refused, code="import numpy")
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'numpy'" in proc.stderr
    proc = run_without(refused, code="import rich.console, packaging.version")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("verb", ["", *sorted(cli.VERBS)])
def test_every_verb_helps_without_the_test_stack(refused, verb):
    """``python -m keras_fork [verb] --help``."""
    proc = run_without(refused, *filter(None, [verb, "--help"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    usage = " ".join(filter(None, ["usage: python -m keras_fork", verb]))
    assert proc.stdout.startswith(usage)


def test_the_fix_catalog_needs_no_test_stack(refused):
    """``fixes --json``, which imports the proof's cells and variants."""
    proc = run_without(refused, "fixes", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)


@pytest.mark.parametrize(
    "what, argv",
    [
        pytest.param(verb, [verb, *REQUIRED.get(verb, [])], id=verb)
        for verb in sorted(cli.TEST_STACK_VERBS)
    ]
    + [pytest.param("status --proofs", ["status", "--proofs"], id="status")],
)
def test_a_verb_that_needs_the_test_stack_says_what_to_install(
    refused, what, argv
):
    """Exit 2 and one line, before the verb does anything."""
    proc = run_without(refused, *argv)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {what} needs the test environment ")
    assert "(missing: filelock, numpy, a backend: jax, " in line
    for path in ("constraints.txt", "requirements/test.txt", "scripts/prove"):
        assert path in line and (ROOT / path).is_file()


def test_the_test_stack_needs_one_backend_of_three(monkeypatch):
    """A GPU runner without TensorFlow runs the others (docs/gpu.md)."""
    monkeypatch.setattr(errors, "_importable", lambda n: n != "tensorflow")
    errors.require_test_stack("prove")
    monkeypatch.setattr(errors, "_importable", lambda n: n == "filelock")
    with pytest.raises(ForkError, match=r"\(missing: numpy, a backend: jax,"):
        errors.require_test_stack("prove")
