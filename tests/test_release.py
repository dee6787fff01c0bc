"""Checks on the real build outputs in dist/ (run after scripts/build).

Marked ``release``: scripts/test runs them after the build step.
"""

import dataclasses
import hashlib
import os
import subprocess
import sys

import pytest

from keras_fork.proof import catalog
from keras_fork.recipe import pins
from keras_fork.recipe import sdist
from keras_fork.recipe import series
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
    n = len(series.read_series(LAYOUT, base))
    if n == 0:
        assert patches == []
        return
    assert patches[0].name == "0000-cover-letter.patch"
    # Repo-only patches come last and touch files the sdist lacks.
    assert len(patches) == n + 1 + len(series.read_repo_only(LAYOUT, base))
    # A keras-nightly sdist has no test files: the series' test hunks are
    # for a Keras git checkout (docs/upstream.md), the rest must apply.
    absent = set()
    if not base.sdist_tests:
        for p in patches[1 : n + 1]:
            absent.update(series.missing_tests(tree, p))
    excludes = [f"--exclude={f}" for f in sorted(absent)]
    series.git(
        tree, "am", "-q", *excludes, *map(str, patches[1 : n + 1]), env=env
    )
    log = series.git(tree, "log", "--format=%B", env=env)
    for trailer in series.FORK_TRAILERS:
        assert f"{trailer}: " not in log
    assert len(series.git(tree, "rev-list", "HEAD", env=env).split()) == n + 1


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
    the fork, and the manifest is readable through importlib.metadata."""
    py = _venv_over_the_test_env(tmp_path / "venv")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(
        base.test_constraints((pins.REPO_ROOT / "constraints.txt").read_text())
    )
    whl = LAYOUT.dist / base.wheel_name
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    stack = ["tensorflow-cpu", "jax", "torch"]
    if base.pip_check_known:
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
    code = (
        "import importlib.metadata as m, json, keras;"
        "d = json.loads(m.distribution('keras')"
        ".read_text('FORK_PATCHES.json'));"
        "assert keras.__version__ == d['version'], keras.__version__;"
        "print(keras.ops.sum(keras.ops.ones((2, 3))))"
    )
    for backend in ("jax", "tensorflow", "torch"):
        env = dict(os.environ, KERAS_BACKEND=backend, CUDA_VISIBLE_DEVICES="")
        out = subprocess.run(
            [py, "-c", code], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, (backend, out.stderr[-2000:])
        assert "6" in out.stdout


def _documented_commands(wheel_name: str) -> list[list[str]]:
    """The README's install commands for one wheel, as argument lists: the
    uninstall of keras-nightly, then that wheel's ``pip install``."""
    readme = (pins.REPO_ROOT / "README.md").read_text()
    block = readme.split(catalog.INSTALL_BEGIN)[1].split(catalog.INSTALL_END)[0]
    lines = [
        line.partition("#")[0].strip()
        for line in block.splitlines()
        if line.startswith("pip ")
    ]
    uninstall = [line for line in lines if " uninstall " in line]
    install = [line for line in lines if line.endswith(f"dist/{wheel_name}")]
    assert len(uninstall) == 1 and len(install) == 1, block
    return [uninstall[0].split(), install[0].split()]


def test_the_master_wheel_replaces_keras_nightly_as_the_readme_says(tmp_path):
    """Issue 37: keras-nightly installed, then the README's commands for the
    master wheel: one distribution owns keras/ (the fork's), ``import
    keras`` gives the fork's version, and ``pip check`` is clean."""
    base = next(b for b in BASES if b.package == "keras-nightly")
    if not (LAYOUT.dist / base.wheel_name).is_file():
        pytest.fail(f"{base.wheel_name} missing: run scripts/build first")
    py = _venv_over_the_test_env(tmp_path / "venv")
    pip = [py, "-m", "pip", "--disable-pip-version-check", "-q"]
    constraints = str(pins.REPO_ROOT / "constraints.txt")
    # A user's environment: keras-nightly beside the backends (found in the
    # test environment; the venv gets what their pins need, e.g. setuptools).
    stack = [base.requirement, "tensorflow-cpu", "jax", "torch"]
    subprocess.run(pip + ["install", "-c", constraints, *stack], check=True)
    for command in _documented_commands(base.wheel_name):
        assert command[0] == "pip"
        subprocess.run(pip + command[1:], cwd=pins.REPO_ROOT, check=True)
    check = subprocess.run(
        pip[:-1] + ["check"], capture_output=True, text=True, cwd=tmp_path
    )
    assert check.returncode == 0, check.stdout + check.stderr
    code = (
        "import importlib.metadata as m, keras\n"
        "names = [d.metadata['Name'] for d in m.distributions()]\n"
        "print(keras.__version__, names.count('keras'), "
        "names.count('keras-nightly') + names.count('keras_nightly'))\n"
    )
    env = dict(os.environ, KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [py, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [base.fork_version, "1", "0"], out.stdout
