"""Keras's own unit tests, run the way Keras runs them, outside its repository.

The sdist has Keras's test files but not its repository's ``conftest.py``
(``selection.KERAS_TESTS_PLUGIN`` follows its rules: ``pytest_command``
loads it); a backend's own folder (``keras/src/backend/<name>/``)
is tested with that backend only (``backends_for``); the tests a patch adds
are picked by exact name (``added_tests_env``; in a Keras checkout, whose
own conftest runs instead, by ``-k``: ``added_test_selection``); each
backend runs one pass on one device, and JAX a second, ``multi_device``
pass on ``JAX_DEVICES`` virtual devices (``passes``). ``run_pytest`` runs
one pass in its own process group, killed after its timeout. Used by the
bisection (``bisect``) and ``pr-check`` (``keras_fork.upstream.prcheck``);
the proof matrix's unit cells and ``regressions`` use the same conftest.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

from integration_tests.harness import run
from integration_tests.harness import selection
from integration_tests.harness import topologies
from keras_fork.recipe import patchfile

BACKENDS = topologies.BACKENDS


JAX_DEVICES = 8
# pytest's exit code when it selects no test.
NO_TESTS_COLLECTED = 5


def backends_for(test_file: str, backends) -> list[str]:
    """The backends that run ``test_file`` (a path in the Keras tree).

    A file under ``keras/src/backend/<name>/`` with ``<name>`` one of
    ``BACKENDS`` runs with that backend only (it tests that backend's
    implementation); every other file runs with each of ``backends``.
    """
    parts = Path(test_file).parts
    if parts[:3] == ("keras", "src", "backend") and parts[3] in BACKENDS:
        return [b for b in backends if b == parts[3]]
    return list(backends)


def touched_test_files(patches: list[Path]) -> list[str]:
    """Paths of the ``*_test.py`` files the patches change, in order."""
    files = []
    for patch in patches:
        for path in re.findall(
            r"^\+\+\+ b/(\S+_test\.py)$", patch.read_text(), flags=re.M
        ):
            if path not in files:
                files.append(path)
    return files


def added_tests_env(patch: Path, test_files: list[str]) -> dict[str, str]:
    """The environment with which ``selection.KERAS_TESTS_PLUGIN`` keeps the
    tests ``patch`` adds, by exact name, of the ``test_files`` it adds
    tests to; a touched file to which it adds none (it only edits existing
    ones) runs whole."""
    added = patchfile.parse_patch(patch).added_tests()
    names, files = set(), set()
    for t in added:
        path, _, name = t.partition("::")
        if path in test_files:
            names.add(name)
            files.add(Path(path).name)
    return selection.added_tests_env(names, files)


def added_test_selection(patch: Path, test_files: list[str]) -> str:
    """A pytest ``-k`` expression for the tests ``patch`` adds, for a run
    in a Keras checkout, whose own ``conftest.py`` runs instead of
    ``selection.KERAS_TESTS_PLUGIN`` (``pr-check``).

    A touched file to which the patch adds no test function (it only edits
    existing ones) is selected whole, by its module name.

    Returns:
        ``"test_a or test_b or loss_test"``-style text; "" when there are
        no test files.
    """
    added = patchfile.parse_patch(patch).added_tests()
    terms = []
    for f in test_files:
        names = [t.partition("::")[2] for t in added if t.startswith(f + "::")]
        terms += names or [Path(f).stem]
    return " or ".join(dict.fromkeys(terms))


def test_root(tree: Path, files: list[str], work: Path) -> Path:
    """Copies ``files`` (paths in ``tree``) into ``work``, a pytest root of
    their own (an empty ``pytest.ini``); returns ``work``."""
    work.mkdir()
    for t in files:
        shutil.copyfile(tree / t, work / Path(t).name)
    (work / "pytest.ini").write_text("[pytest]\n")
    return work


def pytest_command(targets, select, rootdir=None) -> tuple[str, ...]:
    """The pytest command line of one run of Keras's tests: the tests of
    ``targets`` (files or folders) that ``select`` (pytest options such as
    ``-k``, ``-m``) picks, with ``rootdir`` as pytest's root where given (a
    folder of copied test files, ``test_root``, run with
    ``selection.KERAS_TESTS_PLUGIN``), else the one pytest finds (a Keras
    checkout, with its own conftest)."""
    root = ()
    if rootdir:
        root = ("-p", selection.KERAS_TESTS_PLUGIN, "--rootdir", str(rootdir))
    return (
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        *root,
        *select,
        *map(str, targets),
    )


def passes(backend: str, tree: Path, files: list[str]) -> list[tuple]:
    """``(label, env, pytest selection)`` of each pytest pass of a backend:
    one on one device, plus on jax a ``multi_device`` pass on
    ``JAX_DEVICES`` virtual devices where a file has such tests (Keras's
    conftest skips them on fewer than 4 devices)."""
    topology_env = {
        "KERAS_BACKEND": backend,
        "CUDA_VISIBLE_DEVICES": "",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    passes = [(backend, topology_env, [])]
    if backend == "jax" and any(
        "multi_device" in (tree / t).read_text() for t in files
    ):
        flags = f"--xla_force_host_platform_device_count={JAX_DEVICES}"
        passes.append(
            (
                f"{backend}, {JAX_DEVICES} devices",
                dict(topology_env, XLA_FLAGS=flags),
                ["-m", "multi_device"],
            )
        )
    return passes


def run_pytest(cmd, env, cwd, timeout) -> tuple[int | None, str]:
    """Runs ``cmd`` in its own process group, killed after ``timeout`` s
    (``run.run_bounded``).

    Returns:
        ``(exit code or None on timeout, pytest's last output line)``.
    """
    with tempfile.TemporaryDirectory(prefix="keras-tests-") as tmp:
        log = Path(tmp) / "pytest.log"
        code = run.run_bounded(cmd, cwd, env, log, timeout)
        if code is None:
            return None, f"timed out after {timeout:.0f}s (killed)"
        text = log.read_text().strip().splitlines()
    return code, (text or ["(no output)"])[-1]
