"""Checks on the real build outputs in dist/ (run after scripts/build).

Marked ``release``: scripts/test runs them after the build step.
"""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest

from keras_fork.proof import cells as cells_lib
from keras_fork.proof import fixes
from keras_fork.recipe import patchfile
from keras_fork.recipe import pins
from keras_fork.recipe import sdist
from keras_fork.recipe import series
from keras_fork.recipe import submission
from keras_fork.recipe import wheel
from keras_fork.upstream import prseries

pytestmark = pytest.mark.release
LAYOUT = pins.Layout.default()
BASES = list(pins.load_bases(LAYOUT).values())


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(params=BASES, ids=lambda b: b.version)
def base(request):
    b = request.param
    if not (LAYOUT.dist / b.wheel_name).is_file():
        pytest.fail(f"{b.wheel_name} missing: run scripts/build first")
    return b


def test_second_build_is_byte_identical(base, tmp_path):
    other = dataclasses.replace(
        LAYOUT, build=tmp_path / "build", dist=tmp_path / "dist"
    )
    again = wheel.build(other, base, LAYOUT.tree(base.version))
    assert _sha(again) == _sha(LAYOUT.dist / base.wheel_name)


def test_pr_series_applies_to_the_pristine_sdist(base, tmp_path):
    archive = sdist.fetch(LAYOUT, base)
    tree = tmp_path / "pristine"
    sdist.unpack(archive, base, tree)
    env = series.git_env(0)
    series.git(tree, "init", "-q", env=env)
    series.git(tree, "add", "-A", env=env)
    series.git(tree, "commit", "-qm", "pristine", env=env)
    folder = prseries.pr_series_dir(LAYOUT, base)
    patches = sorted(folder.glob("0*.patch"))
    sub = submission.read(LAYOUT, base)
    n = len(sub.send_now)
    if n == 0:
        assert patches == []
        return
    assert patches[0].name == "0000-cover-letter.patch"
    # Repo-only patches come last and touch files the sdist lacks.
    assert len(patches) == n + 1 + len(series.read_repo_only(LAYOUT, base))
    # The PRs that wait on a design issue apply after those sent now, in
    # their numbers' order, as a maintainer would merge them.
    waiting = sorted(folder.glob("pending/0*.patch"))
    assert len(waiting) == len(sub.pending)
    prs = patches[1 : n + 1] + waiting
    # A keras-nightly sdist has no test files: the series' test hunks are
    # for a Keras git checkout (docs/upstream.md), the rest must apply.
    absent = set()
    if not base.sdist_tests:
        for p in prs:
            absent.update(series.missing_tests(tree, p))
    excludes = [f"--exclude={f}" for f in sorted(absent)]
    series.git(tree, "am", "-q", *excludes, *map(str, prs), env=env)
    log = series.git(tree, "log", "--format=%B", env=env)
    for trailer in patchfile.FORK_TRAILERS:
        assert f"{trailer}: " not in log
    commits = series.git(tree, "rev-list", "HEAD", env=env).split()
    assert len(commits) == len(prs) + 1


def _venv_over_the_test_env(venv):
    """A fresh venv that also sees the test environment's site-packages
    (a ``.pth`` line, read after its own site-packages), where the pinned
    stack (constraints.txt) is already installed and keras is not
    (scripts/_env.sh uninstalls it). pip counts the packages it finds there
    as installed, so the stack is not downloaded and unpacked again (about
    100 s a base on 2 cores); one that a base pins otherwise (the 3.7.0
    overlay's jax) goes into the venv, which shadows the outer one (pip
    leaves a package outside its environment alone), and ``pip check``
    sees every package either way: the same set as a venv installed from
    scratch."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"

    def purelib(python):
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    pth = os.path.join(purelib(py), "zz_pinned_stack.pth")
    with open(pth, "w") as f:
        f.write(purelib(sys.executable) + "\n")
    return py


def test_wheel_installs_beside_the_pinned_stack_and_pip_check_is_clean(
    base, tmp_path
):
    """A fresh venv over the pinned stack (``_venv_over_the_test_env``,
    constraints.txt with the base's test overlay) and the fork wheel: pip
    check is clean (but for the base's declared ``pip_check_known`` lines:
    tensorflow 2.21 requires keras>=3.12, so an older base can only be
    installed over it with ``--no-deps``), ``keras==<base>`` is satisfied by
    the fork, the manifest is readable through importlib.metadata, and one
    distribution owns ``keras/``. The master wheel goes in as the README
    says, over a user's keras-nightly (issue 37: ``_install_over_nightly``).
    """
    py = _venv_over_the_test_env(tmp_path / "venv")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(
        base.test_constraints((pins.CODE_ROOT / "constraints.txt").read_text())
    )
    whl = LAYOUT.dist / base.wheel_name
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    stack = ["tensorflow-cpu", "jax", "torch"]
    if base.package == "keras-nightly":
        _install_over_nightly(pip, constraints, base, stack)
    elif base.pip_check_known:
        subprocess.run(
            pip + ["install", "-q", "-c", str(constraints), *stack],
            check=True,
        )
        subprocess.run(
            pip + ["install", "-q", "--no-deps", str(whl)], check=True
        )
    else:
        subprocess.run(
            pip + ["install", "-q", "-c", str(constraints), str(whl), *stack],
            check=True,
        )
    check = subprocess.run(pip + ["check"], capture_output=True, text=True)
    problems = [
        line
        for line in check.stdout.splitlines()
        if check.returncode != 0
        and line.strip()
        and not any(known in line for known in base.pip_check_known)
    ]
    assert not problems, check.stdout + check.stderr
    again = subprocess.run(
        pip + ["install", f"keras=={base.version}", "--no-deps", "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Would install" not in again.stdout, again.stdout
    _imports_as_the_fork(py, base, tmp_path)


def _install_over_nightly(pip, constraints, base, stack) -> None:
    """A user's environment, keras-nightly beside the backends (found in
    the test environment; the venv gets what their pins need), then the
    README's own commands for the master wheel (``_documented_commands``:
    uninstall keras-nightly, install the wheel)."""
    subprocess.run(
        pip
        + ["install", "-q", "-c", str(constraints), base.requirement]
        + stack,
        check=True,
    )
    for command in _documented_commands(base.wheel_name):
        assert command[0] == "pip"
        subprocess.run(pip + command[1:], cwd=pins.CODE_ROOT, check=True)


def _imports_as_the_fork(py, base, cwd) -> None:
    """On each backend, ``import keras`` gives the fork's version, its
    manifest reads, one distribution named ``keras`` is installed and none
    named keras-nightly, and an op runs."""
    code = (
        "import importlib.metadata as m, json, keras;"
        "d = json.loads(m.distribution('keras')"
        ".read_text('FORK_PATCHES.json'));"
        "assert keras.__version__ == d['version'], keras.__version__;"
        "names = [x.metadata['Name'] for x in m.distributions()];"
        "print(keras.__version__, names.count('keras'),"
        " names.count('keras-nightly') + names.count('keras_nightly'),"
        " keras.ops.sum(keras.ops.ones((2, 3))))"
    )
    for backend in ("jax", "tensorflow", "torch"):
        env = dict(os.environ, KERAS_BACKEND=backend, CUDA_VISIBLE_DEVICES="")
        out = subprocess.run(
            [py, "-c", code], env=env, capture_output=True, text=True, cwd=cwd
        )
        assert out.returncode == 0, (backend, out.stderr[-2000:])
        words = out.stdout.split()
        assert words[:3] == [base.fork_version, "1", "0"], out.stdout
        assert "6" in out.stdout


def _documented_commands(wheel_name: str) -> list[list[str]]:
    """The README's install commands for one wheel, as argument lists: the
    uninstall of keras-nightly, then that wheel's ``pip install``."""
    readme = (pins.CODE_ROOT / "README.md").read_text()
    block = readme.split(fixes.INSTALL_BEGIN)[1].split(fixes.INSTALL_END)[0]
    lines = [
        line.partition("#")[0].strip()
        for line in block.splitlines()
        if line.startswith("pip ")
    ]
    uninstall = [line for line in lines if " uninstall " in line]
    install = [line for line in lines if line.endswith(f"dist/{wheel_name}")]
    assert len(uninstall) == 1 and len(install) == 1, block
    return [uninstall[0].split(), install[0].split()]


# Two cells of 3.15.1 on jax/1: one proven (stock fails), one guard (stock
# passes); about 30 s a verify run on 2 cores.
VERIFY_CELLS = {"seeded-shuffle": "proven", "replica-rng": "guard"}


def test_the_tests_wheel_verifies_stock_and_fork_as_the_cells_say(tmp_path):
    """Issue 41: a venv over the pinned stack with the tests wheel alone
    (no checkout on its path), stock keras 3.15.1 from PyPI, then our
    3.15.1 wheel:
    ``python -m keras_fork_tests`` reports ``broken`` where the proof's
    stock side fails (a proven cell) and ``fixed`` where it passes (a
    guard), then ``fixed`` everywhere on the fork; ``pytest --pyargs`` on
    the installed package passes there too."""
    base = next(b for b in BASES if b.version == "3.15.1")
    (tests_wheel,) = LAYOUT.dist.glob("keras_fork_tests-*.whl")
    cells = {
        c.fix: c.expect
        for c in cells_lib.load_matrix(LAYOUT.fixes)
        if (c.base, c.backend, c.topology) == (base.version, "jax", "1")
    }
    assert {f: cells[f] for f in VERIFY_CELLS} == VERIFY_CELLS
    py = _venv_over_the_test_env(tmp_path / "venv")
    pip = [py, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["install", "--no-deps", str(tests_wheel)], check=True)
    subprocess.run(pip + ["install", "--no-deps", base.requirement], check=True)
    stock = _verify_jax_1(py, tmp_path / "stock")
    assert stock["keras"]["version"] == base.version
    expected = {"proven": "broken", "guard": "fixed"}
    assert stock["status"] == {f: expected[e] for f, e in VERIFY_CELLS.items()}
    whl = LAYOUT.dist / base.wheel_name
    subprocess.run(
        pip + ["install", "--no-deps", "--force-reinstall", str(whl)],
        check=True,
    )
    fork = _verify_jax_1(py, tmp_path / "fork")
    assert fork["keras"]["version"] == base.fork_version
    assert fork["status"] == dict.fromkeys(VERIFY_CELLS, "fixed")
    # Plain pytest on the installed package, from an empty folder: its own
    # conftest and markers, topology 1 by default.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES=""
    )
    package = "keras_fork_tests.fixes.seeded_shuffle"
    out = subprocess.run(
        [py, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", package],
        cwd=tmp_path / "fork",
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and " passed" in out.stdout, out.stdout[-3000:]


def _verify_jax_1(py, cwd) -> dict:
    """``python -m keras_fork_tests --json`` on the ``VERIFY_CELLS`` of
    jax/1, run from ``cwd`` with no PYTHONPATH: ``{"keras": ...,
    "status": {fix: status}}``."""
    cwd.mkdir()
    cmd = [py, "-m", "keras_fork_tests", "--json", "--backend", "jax"]
    cmd += ["--topology", "1", "--accelerator", "cpu"]
    for fix in VERIFY_CELLS:
        cmd += ["--fix", fix]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    payload = json.loads(out.stdout)
    assert (cwd / "verify-results" / "verify.xml").is_file()
    return {
        "keras": payload["keras"],
        "status": {r["fix"]: r["status"] for r in payload["results"]},
    }
