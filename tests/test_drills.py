"""Reliability drills: a build killed midway leaves dist/ as it was."""

import hashlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from keras_fork.recipe import pins
from keras_fork.recipe import testswheel
from tests import fake_upstream as fake

REPO = Path(__file__).resolve().parent.parent

# An in-tree build backend that tells the test it is building, then blocks
# until killed (it opens a FIFO nobody writes to).
BLOCKING_BACKEND = """\
import os
from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403


def build_wheel(*args, **kwargs):
    if os.environ.get("DRILL_READY"):
        with open(os.environ["DRILL_READY"], "w") as f:
            f.write("building\\n")
        open(os.environ["DRILL_BLOCK"]).read()
    return _orig.build_wheel(*args, **kwargs)
"""


def _blocking_sdist(folder):
    files = dict(fake.FILES)
    files["pyproject.toml"] = files["pyproject.toml"].replace(
        'build-backend = "setuptools.build_meta"',
        'build-backend = "drill_backend"\nbackend-path = ["."]',
    )
    files["drill_backend.py"] = BLOCKING_BACKEND
    return fake.make_sdist(folder, files)


def _snapshot(folder: Path) -> dict:
    """``{relative path: bytes}`` of every file under ``folder``."""
    return {
        p.relative_to(folder): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_build_killed_midway_leaves_dist_as_it_was_and_recovers(tmp_path):
    archive = _blocking_sdist(tmp_path)
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    layout = fake.make_layout(tmp_path / "repo", sha)
    layout.cache.mkdir(parents=True)
    (layout.cache / archive.name).write_bytes(archive.read_bytes())
    root = layout.pins.parent.parent
    cmd = [sys.executable, "-m", "keras_fork", "--root", str(root), "build"]
    # A first, complete build: the killed one leaves its outputs as they
    # were, and nothing of its own in dist/.
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    base = pins.get_base(layout, fake.VERSION)
    assert (layout.dist / base.wheel_name).is_file()
    before = _snapshot(layout.dist)

    ready, block = tmp_path / "ready", tmp_path / "block"
    os.mkfifo(ready)
    os.mkfifo(block)
    env = dict(os.environ, DRILL_READY=str(ready), DRILL_BLOCK=str(block))
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        fd = os.open(ready, os.O_RDONLY | os.O_NONBLOCK)
        try:
            readable, _, _ = select.select([fd], [], [], 120)
            assert readable, "the build never reached the wheel backend"
            assert os.read(fd, 100) == b"building\n"
        finally:
            os.close(fd)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert _snapshot(layout.dist) == before
    assert [p for p in layout.dist.rglob(".*")] == []

    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    wheels = sorted(p.name for p in layout.dist.glob("*.whl"))
    assert wheels == sorted([base.wheel_name, testswheel.wheel_name()])
    leftovers = list(layout.build.glob(".wheel.*"))
    leftovers += list(layout.build.glob(".testswheel.*"))
    leftovers += list(layout.build.glob(".stage.*"))
    leftovers += list(layout.build.glob("trees/.*"))
    assert leftovers == []
