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
        tests = [str(tree / f) for f in touched_test_files(patches[-1:])]
        if not tests:
            return failures
        for backend in backends:
            env = prove.child_env(
                target,
                topology_env={
                    "KERAS_BACKEND": backend,
                    "CUDA_VISIBLE_DEVICES": "",
                    "TF_CPP_MIN_LOG_LEVEL": "2",
                },
                with_repo=False,
            )
            work = tmp / f"tests-{backend}"
            work.mkdir()
            for t in tests:
                shutil.copyfile(t, work / Path(t).name)
            (work / "pytest.ini").write_text("[pytest]\n")
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p",
                 "no:cacheprovider", "--rootdir", str(work), str(work)],
                env=env, cwd=work, capture_output=True, text=True,
            )  # fmt: skip
            last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
            console.print(f"  prefix {k} ({backend}): {last}")
            if proc.returncode != 0:
                failures.append(f"{backend}: {last}")
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
