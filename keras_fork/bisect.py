"""The series is bisectable: every prefix builds and passes its unit tests.

Kernel rule: one logical change per patch, and the tree builds and passes
after every patch. For each prefix ``patches[:k]`` of a base's series this
materializes the tree, builds the wheel, installs it into a scratch folder
and runs the Keras test files that the prefix's newest patch (patch ``k``)
touches, on every backend: each patch is tested where it lands, with all
the patches before it. (Running every file the whole prefix touches would
rerun trainer_test.py at every later prefix: 7 minutes each on 2 cores.)
The full series itself is covered by the ``unit`` cells of the proof
matrix, which run every test file the series touches.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from keras_fork import pins
from keras_fork import prove
from keras_fork import series
from keras_fork import wheel
from keras_fork.errors import ForkError

BACKENDS = ("jax", "tensorflow", "torch")

# Keras's repository conftest.py (not in the sdist) skips the tests marked
# ``multi_device`` unless the backend sees several devices; a backend's own
# folder (keras/src/backend/<name>/) is tested with that backend only. The
# bisection follows both rules, and runs the jax ``multi_device`` tests in a
# second pass with 8 virtual CPU devices, as Keras's multi-device CI would.
CONFTEST = """\
# Written by keras_fork.bisect: skip multi_device tests on one device.
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "multi_device: needs several devices")
    config.addinivalue_line("markers", "requires_trainable_backend: any")


def pytest_collection_modifyitems(config, items):
    from keras.src.backend import backend

    several = False
    if backend() == "jax":
        import jax

        several = jax.device_count() > 1
    if several:
        return
    skip = pytest.mark.skip(reason="needs several devices")
    for item in items:
        if "multi_device" in item.keywords:
            item.add_marker(skip)
"""
JAX_DEVICES = 8


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
        for path in re.findall(r"^\+\+\+ b/(\S+_test\.py)$", patch.read_text(),
                               flags=re.M):  # fmt: skip
            if path not in files:
                files.append(path)
    return files


def check_prefix(layout, base, k, backends, console) -> list[str]:
    """Materializes and builds ``patches[:k]``; runs patch k's test files.

    Returns:
        A list of failures (``"<backend>: <file>: <last line>"``); empty
        when the prefix passes.

    Raises:
        ForkError: the prefix does not apply or does not build.
    """
    patches = series.read_series(layout, base)[:k]
    with tempfile.TemporaryDirectory(prefix="bisect.") as tmp:
        tmp = Path(tmp)
        scratch = dataclasses.replace(
            layout,
            patches=tmp / "patches",
            build=tmp / "build",
            dist=tmp / "dist",
        )
        folder = series.series_dir(scratch, base)
        folder.mkdir(parents=True)
        for p in patches:
            shutil.copyfile(p, folder / p.name)
        (folder / series.ORDER_FILE).write_text(
            "".join(p.name + "\n" for p in patches)
        )
        tree = series.materialize(scratch, base)
        whl = wheel.build(scratch, base, tree)
        target = tmp / "site"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
             "--disable-pip-version-check", "--target", str(target),
             str(whl)],
            check=True, capture_output=True,
        )  # fmt: skip
        failures = []
        tests = touched_test_files(patches[-1:])
        for backend in backends:
            mine = [t for t in tests if backend in backends_for(t, backends)]
            if not mine:
                continue
            work = tmp / f"tests-{backend}"
            work.mkdir()
            for t in mine:
                shutil.copyfile(tree / t, work / Path(t).name)
            (work / "pytest.ini").write_text("[pytest]\n")
            (work / "conftest.py").write_text(CONFTEST)
            topology_env = {
                "KERAS_BACKEND": backend,
                "CUDA_VISIBLE_DEVICES": "",
                "TF_CPP_MIN_LOG_LEVEL": "2",
            }
            passes = [("", topology_env, [])]
            if backend == "jax" and any(
                "multi_device" in (tree / t).read_text() for t in mine
            ):
                flags = f"--xla_force_host_platform_device_count={JAX_DEVICES}"
                passes.append(
                    (
                        f", {JAX_DEVICES} devices",
                        dict(topology_env, XLA_FLAGS=flags),
                        ["-m", "multi_device"],
                    )
                )
            for label, topo_env, select in passes:
                env = prove.child_env(
                    target, topology_env=topo_env, with_repo=False
                )
                proc = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p",
                     "no:cacheprovider", "--rootdir", str(work), *select,
                     str(work)],
                    env=env, cwd=work, capture_output=True, text=True,
                )  # fmt: skip
                out = proc.stdout.strip().splitlines() or ["(no output)"]
                console.print(f"  prefix {k} ({backend}{label}): {out[-1]}")
                if proc.returncode != 0:
                    failures.append(f"{backend}{label}: {out[-1]}")
        return failures


def main(argv=None) -> int:
    import argparse

    from rich.console import Console

    p = argparse.ArgumentParser(prog="python -m keras_fork.bisect")
    p.add_argument("--base", action="append")
    p.add_argument("--backend", action="append", choices=BACKENDS)
    args = p.parse_args(argv)
    layout = pins.Layout.default()
    console = Console(stderr=True, highlight=False)
    bad = []
    try:
        for base in pins.select_bases(layout, args.base):
            n = len(series.read_series(layout, base))
            # The whole series (k = n) is the fork the proof matrix's unit
            # cells already test; here every shorter prefix.
            for k in range(1, n):
                console.print(f"keras {base.version}: prefix {k}/{n}")
                for failure in check_prefix(
                    layout, base, k, args.backend or BACKENDS, console
                ):
                    bad.append(f"{base.version} prefix {k}/{n}: {failure}")
    except ForkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in bad:
        print(f"not bisectable: {line}")
    print(f"bisect: {'failed' if bad else 'every prefix builds and passes'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
