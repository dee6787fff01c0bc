"""The recipe on a fake upstream: pins, sdist checks, series, wheel.

These tests need no network and no real Keras; each builds a small fake
``keras-9.9.9`` sdist in a temporary folder.
"""

import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from keras_fork.errors import ForkError
from keras_fork.recipe import patchfile
from keras_fork.recipe import pins
from keras_fork.recipe import sdist
from keras_fork.recipe import series
from keras_fork.recipe import submission
from keras_fork.recipe import wheel
from tests import fake_upstream as fake


@pytest.fixture
def upstream(tmp_path):
    """(layout, base, sdist path outside the cache)."""
    return fake.make_upstream(tmp_path)


def _two_chained_patches(layout, base, tree):
    """Exports a series of two patches where patch 2 edits what patch 1
    wrote; returns ``(names, paths)``."""
    fake.add_fix(layout, base, tree)
    f = tree / "keras/src/shuffle.py"
    f.write_text(f.read_text().replace("reversed(range(n))", "range(n)[::-1]"))
    env = series.git_env(fake.EPOCH)
    series.git(
        tree, "commit", "-qam", "Slice instead\n\nFork-Fix: reverse", env=env
    )
    names = series.export(tree, series.series_dir(layout, base))
    return names, [series.series_dir(layout, base) / n for n in names]


def test_unknown_base_lists_known_bases(upstream):
    layout, _, _ = upstream
    with pytest.raises(ForkError, match=r"unknown base.*'1\.2\.3'.*9\.9\.9"):
        pins.get_base(layout, "1.2.3")


def test_real_pins_are_valid():
    bases = pins.load_bases(pins.Layout.default())
    assert "3.15.1" in bases
    assert {"3.15.1", "3.7.0"} <= set(bases)
    b = bases["3.15.1"]
    assert b.wheel_name == f"keras-3.15.1+fork.{b.fork_build}-py3-none-any.whl"


def test_test_overlay_replaces_the_pins_it_names():
    base = pins.Base("3.7.0", "0" * 64, 1, ("JAX==0.4.38", "jaxlib==0.4.38"))
    text = "# c\njax==0.10.2\njaxlib==0.10.2\njax-cuda==1\ntorch==2.13.0\n"
    lines = base.test_constraints(text).splitlines()
    assert "jax==0.10.2" not in lines and "jaxlib==0.10.2" not in lines
    assert {
        "JAX==0.4.38",
        "jaxlib==0.4.38",
        "jax-cuda==1",
        "torch==2.13.0",
    } <= set(lines)
    assert pins.Base("3.15.1", "0" * 64, 1).test_constraints(text) == text


def test_invalid_test_overlay_is_refused(upstream):
    layout, _, _ = upstream
    text = layout.pins.read_text()
    layout.pins.write_text(text + 'test_overlay = ["jax>=0.4"]\n')
    with pytest.raises(ForkError, match="test_overlay must be a list of exact"):
        pins.load_bases(layout)


def test_local_version_is_accepted_by_base_specifiers():
    from packaging.specifiers import SpecifierSet

    version = pins.Base("3.15.1", "0" * 64, 1).fork_version
    for spec in ("==3.15.1", "~=3.15.0", "==3.15.*", ">=3.15"):
        assert SpecifierSet(spec).contains(version), spec


@pytest.mark.parametrize("how", ["tampered", "truncated"])
def test_bad_cached_sdist_is_refused_and_nothing_unpacked(upstream, how):
    layout, base, _ = upstream
    cached = layout.cache / base.sdist_name
    data = cached.read_bytes()
    cached.write_bytes(data[:100] if how == "truncated" else data + b"x")
    actual = hashlib.sha256(cached.read_bytes()).hexdigest()
    with pytest.raises(ForkError) as e:
        series.materialize(layout, base)
    assert base.sdist_sha256 in str(e.value) and actual in str(e.value)
    assert not layout.tree(base.version).exists()


def test_no_network_and_no_cache_says_how_to_provide_the_sdist(
    upstream, monkeypatch
):
    layout, base, archive = upstream
    (layout.cache / base.sdist_name).unlink()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(layout.cache))
    with pytest.raises(ForkError, match="--sdist PATH"):
        sdist.fetch(layout, base)
    assert not (layout.cache / base.sdist_name).exists()
    # The offered way works offline and fills the cache.
    assert sdist.fetch(layout, base, archive).is_file()


def test_given_sdist_with_wrong_hash_is_not_cached(upstream, tmp_path):
    layout, base, archive = upstream
    (layout.cache / base.sdist_name).unlink()
    bad = tmp_path / base.sdist_name
    bad.write_bytes(archive.read_bytes() + b"!")
    with pytest.raises(ForkError, match="is corrupt") as e:
        sdist.fetch(layout, base, bad)
    assert "Delete" not in str(e.value)  # the user's file, not our cache
    assert not (layout.cache / base.sdist_name).exists()


def _snapshot(folder: Path) -> dict:
    """``{relative path: bytes}`` of every file under ``folder``."""
    return {
        p.relative_to(folder): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _bad_sdist(case: str, archive: Path, tmp_path: Path) -> Path:
    """A ``--sdist`` argument that is not the pinned sdist, by ``case``."""
    bad = tmp_path / "bad" / archive.name
    bad.parent.mkdir()
    if case == "garbage":
        bad.write_bytes(b"not a tarball at all\n" * 40)
    elif case == "one byte flipped":
        data = bytearray(archive.read_bytes())
        data[len(data) // 2] ^= 0x01
        bad.write_bytes(bytes(data))
    elif case == "another version":
        other = fake.make_sdist(bad.parent, stem="keras-9.9.8")
        bad = other
    return bad  # "missing": never written


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("garbage", "is corrupt (not a readable .tar.gz)"),
        ("one byte flipped", "is corrupt"),
        ("missing", "no such file"),
        ("another version", "is the sdist of keras-9.9.8, not of keras=="),
    ],
)
def test_a_bad_sdist_leaves_dist_byte_identical(
    upstream, tmp_path, case, message
):
    """Issue 37: the sdist is checked before any output changes, by
    ``build`` and by ``pr-series`` (scripts/build passes ``--sdist`` to
    both); the message names the case and never asks to delete the user's
    file."""
    layout, base, archive = upstream
    root = layout.pins.parent.parent
    repo = Path(__file__).parent.parent
    cmd = [sys.executable, "-m", "keras_fork", "--root", str(root)]
    tree = series.materialize(layout, base)
    fake.add_fix(layout, base, tree)
    for verb in ("build", "pr-series"):
        ok = subprocess.run(
            [*cmd, verb], capture_output=True, text=True, cwd=repo
        )
        assert ok.returncode == 0, ok.stderr
    before = _snapshot(layout.dist)
    assert Path(base.wheel_name) in before
    assert any(p.parts[0] == "pr-series" for p in before)
    bad = _bad_sdist(case, archive, tmp_path)
    for verb in ("build", "pr-series"):
        proc = subprocess.run(
            [*cmd, verb, "--base", base.version, "--sdist", str(bad)],
            capture_output=True,
            text=True,
            cwd=repo,
        )
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr
        assert "Traceback" not in proc.stderr and "Delete" not in proc.stderr
        assert _snapshot(layout.dist) == before


def test_series_round_trip_is_byte_identical(upstream):
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    names = fake.add_fix(layout, base, tree)
    assert names == ["reverse-the-order.patch"]
    before = {
        p.name: p.read_bytes()
        for p in series.series_dir(layout, base).iterdir()
    }
    tree = series.materialize(layout, base)  # fresh: pristine + git am
    assert series.check(layout, base, tree) == []
    series.export(tree, series.series_dir(layout, base))
    after = {
        p.name: p.read_bytes()
        for p in series.series_dir(layout, base).iterdir()
    }
    assert after == before
    info = patchfile.parse_patch(series.series_dir(layout, base) / names[0])
    assert info.fix == "reverse"
    assert info.upstream_issue == "keras-team/keras#1"
    assert info.trailers["Forwarded"] == "no"
    assert "Fork-Fix" not in info.message


def test_a_tree_is_materialized_again_only_when_it_is_not_the_series(upstream):
    layout, base, _ = upstream
    fake.add_fix(layout, base, series.materialize(layout, base))
    tree = series.materialize(layout, base)
    marker = tree / "untracked.txt"  # gone whenever the tree is made again
    marker.write_text("")
    assert series.tree_of(layout, base) == tree and marker.exists()
    # A tracked file changed in the work tree: made again.
    (tree / "keras/src/shuffle.py").write_text("edited\n")
    series.tree_of(layout, base)
    assert not marker.exists()
    assert "edited" not in (tree / "keras/src/shuffle.py").read_text()
    # A commit on top (HEAD moved): made again.
    marker.write_text("")
    env = series.git_env(fake.EPOCH)
    series.git(tree, "commit", "-q", "--allow-empty", "-m", "x", env=env)
    series.tree_of(layout, base)
    assert not marker.exists()
    assert "x" not in series.git(tree, "log", "-1", "--format=%s")
    # Another series (a patch's bytes changed): made again.
    marker.write_text("")
    (patch,) = series.read_series(layout, base)
    text = patch.read_bytes().replace(b"tests want it", b"the tests want it")
    patch.write_bytes(text)
    series.tree_of(layout, base)
    assert not marker.exists()


def test_check_reports_a_patch_not_in_canonical_form(upstream):
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    (name,) = fake.add_fix(layout, base, tree)
    patch = series.series_dir(layout, base) / name
    # As exported without --full-index: still applies, but re-export churns.
    text = re.sub(
        r"^index ([0-9a-f]{7})[0-9a-f]{33}\.\.([0-9a-f]{7})[0-9a-f]{33}",
        r"index \1..\2",
        patch.read_text(),
        flags=re.M,
    )
    assert text != patch.read_text()
    patch.write_text(text)
    tree = series.materialize(layout, base)
    assert series.check(layout, base, tree) == [name]


def test_failing_patch_names_patch_and_file_and_leaves_no_tree(upstream):
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    (name,) = fake.add_fix(layout, base, tree)
    # Make the patch's context disagree with upstream.
    patch = series.series_dir(layout, base) / name
    patch.write_text(patch.read_text().replace("def order(n):", "def o(n):"))
    with pytest.raises(ForkError) as e:
        series.materialize(layout, base)
    assert name in str(e.value)
    assert "keras/src/shuffle.py" in str(e.value)
    assert not layout.tree(base.version).exists()
    assert list(layout.tree(base.version).parent.iterdir()) == []


def test_series_order_file_must_match_the_folder(upstream):
    layout, base, _ = upstream
    folder = series.series_dir(layout, base)
    (folder / "stray.patch").write_text("x")
    with pytest.raises(ForkError, match="not in .patches"):
        series.read_series(layout, base)
    (folder / ".patches").write_text("gone.patch\n")
    with pytest.raises(ForkError, match="missing patches: gone.patch"):
        series.read_series(layout, base)


def _wheel_sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_wheel_is_reproducible_labelled_and_carries_the_manifest(upstream):
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    fake.add_fix(layout, base, tree)
    tree = series.materialize(layout, base)
    first = wheel.build(layout, base, tree)
    sha = _wheel_sha(first)
    second = wheel.build(layout, base, series.materialize(layout, base))
    assert first == second and _wheel_sha(second) == sha
    assert first.name == "keras-9.9.9+fork.1-py3-none-any.whl"
    with zipfile.ZipFile(first) as z:
        names = z.namelist()
        version_py = z.read("keras/src/version.py").decode()
        manifest = json.loads(
            z.read("keras-9.9.9+fork.1.dist-info/FORK_PATCHES.json")
        )
        shuffle_py = z.read("keras/src/shuffle.py").decode()
    assert '__version__ = "9.9.9+fork.1"' in version_py
    assert "reversed(range(n))" in shuffle_py
    assert "keras-9.9.9+fork.1.dist-info/RECORD" in names
    assert manifest["patches"][0]["fix"] == "reverse"
    assert manifest["patches"][0]["upstream_issue"] == "keras-team/keras#1"
    assert [p.name for p in layout.dist.iterdir()] == [first.name]


def test_wheel_carries_its_changelog_entry(upstream):
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    (layout.root / wheel.CHANGELOG).write_text(
        "# Changelog\n\n## 9.9.9+fork.10\n\nNot this one.\n\n"
        "## 8.0.0+fork.3 and 9.9.9+fork.1\n\n- What changed.\n"
    )
    built = wheel.build(layout, base, tree)
    with zipfile.ZipFile(built) as z:
        entry = z.read(f"keras-9.9.9+fork.1.dist-info/{wheel.CHANGELOG_ENTRY}")
    assert (
        entry.decode()
        == "## 8.0.0+fork.3 and 9.9.9+fork.1\n\n- What changed.\n"
    )
    (layout.root / wheel.CHANGELOG).write_text("## 9.9.9+fork.10\n")
    with pytest.raises(ForkError, match="no entry for 9.9.9\\+fork.1"):
        wheel.build(layout, base, tree)


def test_every_wheel_version_has_a_changelog_entry():
    layout = pins.Layout.default()
    for base in pins.select_bases(layout, None):
        entry = wheel.changelog_entry(layout, base)
        assert base.fork_version in entry.splitlines()[0]


def test_wheel_manifest_readable_through_importlib_metadata(upstream, tmp_path):
    layout, base, _ = upstream
    whl = wheel.build(layout, base, series.materialize(layout, base))
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(whl),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import importlib.metadata as m, json, keras;"
        "d = m.distribution('keras');"
        "print(d.version, keras.__version__,"
        " json.loads(d.read_text('FORK_PATCHES.json'))['version'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["9.9.9+fork.1"] * 3


def test_failed_wheel_build_leaves_dist_empty(upstream, monkeypatch):
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    (tree / "pyproject.toml").write_text("not toml [[[")
    env = series.git_env(fake.EPOCH)
    series.git(tree, "commit", "-qam", "break the build", env=env)
    with pytest.raises(ForkError, match="building the wheel"):
        wheel.build(layout, base, tree)
    assert not any(layout.dist.glob("*.whl"))
    assert not any(p.name.startswith(".wheel.") for p in layout.build.iterdir())


def test_build_cli_reports_errors_without_traceback(upstream):
    layout, _, _ = upstream
    root = layout.pins.parent.parent
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_fork",
            "--root",
            str(root),
            "build",
            "--base",
            "0.0.1",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown base version '0.0.1'")
    assert "Traceback" not in proc.stderr


def test_build_cli_failing_patch_leaves_the_last_outputs_as_they_were(
    upstream,
):
    """Neither ``build`` nor ``pr-series`` changes ``dist/`` when a patch
    does not apply."""
    layout, base, _ = upstream
    root = layout.pins.parent.parent
    repo = Path(__file__).parent.parent
    cmd = [sys.executable, "-m", "keras_fork", "--root", str(root)]
    tree = series.materialize(layout, base)
    (name,) = fake.add_fix(layout, base, tree)
    for verb in ("build", "pr-series"):
        ok = subprocess.run(
            [*cmd, verb], capture_output=True, text=True, cwd=repo
        )
        assert ok.returncode == 0, ok.stderr
    assert (layout.dist / base.wheel_name).is_file()
    assert (layout.dist / "pr-series" / base.version).is_dir()
    before = _snapshot(layout.dist)
    patch = series.series_dir(layout, base) / name
    patch.write_text(patch.read_text().replace("def order(n):", "def o(n):"))
    for verb in ("pr-series", "build"):
        bad = subprocess.run(
            [*cmd, verb], capture_output=True, text=True, cwd=repo
        )
        assert bad.returncode == 2
        assert f"patch {name} does not apply" in bad.stderr
        assert "keras/src/shuffle.py" in bad.stderr
        assert _snapshot(layout.dist) == before
        assert not [p for p in layout.dist.rglob(".*")]
    assert not layout.tree(base.version).exists()
    assert not [p for p in layout.build.iterdir() if p.name.startswith(".")]


def test_status_classifies_patches_by_content(upstream, tmp_path):
    from keras_fork.upstream import status

    layout, base, archive = upstream
    tree = series.materialize(layout, base)
    (name,) = fake.add_fix(layout, base, tree)
    patch = series.series_dir(layout, base) / name
    pristine = tmp_path / "pristine"
    sdist.unpack(archive, base, pristine)
    assert status.classify(pristine, patch) == "applies"
    assert status.classify(tree, patch) == "upstream"  # already has it
    (pristine / "keras/src/shuffle.py").write_text("def other():\n    pass\n")
    assert status.classify(pristine, patch) == "conflict"


def test_status_checks_a_series_cumulatively(upstream, tmp_path):
    """Patch 2 edits what patch 1 wrote: alone on the base it conflicts,
    after patch 1 it applies (a shipped series must not look broken)."""
    from keras_fork.upstream import status

    layout, base, archive = upstream
    tree = series.materialize(layout, base)
    _, patches = _two_chained_patches(layout, base, tree)
    pristine = tmp_path / "pristine"
    sdist.unpack(archive, base, pristine)
    assert status.classify(pristine, patches[1]) == "conflict"
    assert status.check_series(pristine, patches) == ["applies", "applies"]
    assert "range(n)[::-1]" in (pristine / "keras/src/shuffle.py").read_text()


def test_status_leaves_out_test_files_the_sdist_lacks(upstream, tmp_path):
    """keras-nightly sdists ship no ``*_test.py``: a patch's test hunks are
    left out there (and said so), its source hunks still decide."""
    from keras_fork.upstream import status

    layout, base, archive = upstream
    tree = series.materialize(layout, base)
    test_file = tree / "keras/src/shuffle_test.py"
    test_file.write_text("def test_order():\n    pass\n")
    env = series.git_env(fake.EPOCH)
    series.git(tree, "add", "-A", env=env)
    series.git(tree, "commit", "-qm", "Add a test file", env=env)
    f = tree / "keras/src/shuffle.py"
    f.write_text(f.read_text().replace("range(n)", "reversed(range(n))"))
    test_file.write_text("def test_order():\n    assert True\n")
    series.git(tree, "commit", "-qam", "Reverse\n\nFork-Fix: reverse", env=env)
    patch = tmp_path / "reverse.patch"
    patch.write_text(series.git(tree, "format-patch", "-1", "--stdout"))
    nightly = tmp_path / "nightly"  # the base's sources, no test file
    sdist.unpack(archive, base, nightly)
    assert series.missing_tests(nightly, patch) == ["keras/src/shuffle_test.py"]
    state = "applies (1 test files not in the sdist)"
    assert status.classify(nightly, patch) == state
    assert status.check_series(nightly, [patch]) == [state]
    assert "reversed" in (nightly / "keras/src/shuffle.py").read_text()
    (nightly / "keras/src/shuffle.py").write_text("def other():\n    pass\n")
    assert status.classify(nightly, patch).startswith("conflict (1 test")


def test_patch_file_names_are_whole_lowercase_slugs():
    name = patchfile.patch_file_name(
        "Normalize distributed losses by the step's global batch size"
    )
    assert name == (
        "normalize-distributed-losses-by-the-step-s-global-batch-size.patch"
    )
    long = " ".join(["word"] * 30)  # 149 characters
    cut = patchfile.patch_file_name(long).removesuffix(".patch")
    assert len(cut) <= patchfile.SLUG_MAX
    assert cut.split("-") == ["word"] * len(cut.split("-"))  # whole words
    assert patchfile.patch_file_name("`training`!") == "training.patch"


SUBJECTS = [
    "Shuffle array inputs with a private, seeded generator",
    "Draw independent random numbers on each tf.distribute replica",
    "Reduce the loss of an empty batch to zero, not to an empty array",
    "Pass `training` to stateless_call in the JAX distributed demo",
    "Dots... and more.. dots.",
    "Ünïcode and trailing dashes --",
]


def test_format_patch_name_follows_git(tmp_path):
    """The PR series names repo-only patches as git names the others: the
    rule must give what ``git format-patch`` writes."""
    env = series.git_env(fake.EPOCH)
    series.git(tmp_path, "init", "-q", env=env)
    for i, subject in enumerate(SUBJECTS):
        (tmp_path / "f").write_text(str(i))
        series.git(tmp_path, "add", "f", env=env)
        series.git(tmp_path, "commit", "-qm", subject, env=env)
    out = tmp_path / "out"
    series.git(
        tmp_path,
        "format-patch",
        "-q",
        "-o",
        str(out),
        "--root",
        "HEAD",
        env=env,
    )
    made = [f.name[5:] for f in sorted(out.glob("*.patch"))]
    assert made == [patchfile.format_patch_name(s) for s in SUBJECTS]


def test_not_alone_names_a_patch_that_needs_an_earlier_one(upstream):
    """A master PR must apply on master by itself: patch 2 edits what patch
    1 wrote, so it applies only as part of the chain."""
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    names, patches = _two_chained_patches(layout, base, tree)
    head = series.git(tree, "rev-parse", "HEAD")
    (failed,) = series.not_alone(tree, patches)
    assert failed.startswith(f"{names[1]}: error: patch failed")
    assert series.not_alone(tree, patches[:1]) == []
    assert series.git(tree, "rev-parse", "HEAD") == head
    assert series.git(tree, "status", "--porcelain") == ""


def test_a_carried_patch_need_not_apply_alone_on_master(upstream):
    """A master series may carry a patch that is not a PR (``[[carried]]``
    of ``submission.toml``): it may build on an earlier PR; every PR must
    still apply alone."""
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    names, _ = _two_chained_patches(layout, base, tree)
    (failed,) = series.not_alone(tree, submission.read_submission(layout, base))
    assert failed.startswith(f"{names[1]}: error: patch failed")
    toml = series.series_dir(layout, base) / submission.SUBMISSION_FILE

    def carry(pr, carried):
        toml.write_text(
            f'[[pr]]\npatch = "{pr}"\n[[carried]]\npatch = "{carried}"\n'
            'why = "builds on the PR"\nupstream = "keras-team/keras#1"\n'
        )
        return submission.read_submission(layout, base)

    prs = carry(names[0], names[1])
    assert [p.name for p in prs] == [names[0]]
    assert series.not_alone(tree, prs) == []
    # Carrying the first patch does not exempt the second, which needs it.
    (failed,) = series.not_alone(tree, carry(names[1], names[0]))
    assert failed.startswith(f"{names[1]}: error: patch failed")


def test_export_keeps_the_test_hunks_a_tree_without_tests_lacks(upstream):
    """A keras-nightly tree has no test files: re-exporting an edited commit
    keeps the test hunks of the patch file of the same name."""
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    (name,) = fake.add_fix(layout, base, tree)
    folder = series.series_dir(layout, base)
    test_block = (
        "diff --git a/keras/src/shuffle_test.py b/keras/src/shuffle_test.py\n"
        "index 1111111111111111111111111111111111111111.."
        "2222222222222222222222222222222222222222 100644\n"
        "--- a/keras/src/shuffle_test.py\n+++ b/keras/src/shuffle_test.py\n"
        "@@ -1 +1,2 @@\n def test_order():\n+    assert True\n"
    )
    (folder / name).write_text((folder / name).read_text() + test_block)
    f = tree / "keras/src/shuffle.py"
    f.write_text(f.read_text() + "\n")
    env = series.git_env(fake.EPOCH)
    series.git(tree, "commit", "-qa", "--amend", "--no-edit", env=env)
    assert series.export(tree, folder, carry_tests=True) == [name]
    text = (folder / name).read_text()
    assert text.endswith(test_block)
    assert text.index("a/keras/src/shuffle.py") < text.index("shuffle_test.py")
    series.export(tree, folder)
    assert "shuffle_test.py" not in (folder / name).read_text()


@pytest.mark.parametrize(
    "forwarded, applied, expected",
    [
        ("no", "no", "not-yet"),
        (
            "https://github.com/keras-team/keras/pull/1",
            "no",
            "submitted https://github.com/keras-team/keras/pull/1",
        ),
        ("not-needed", "3.8.0", "fixed-upstream 3.8.0"),
    ],
)
def test_status_shows_each_patch_s_upstream_status(
    tmp_path, forwarded, applied, expected
):
    """DEP-3 trailers, kept out of the PR series, give the radar's
    upstream status column (issue 24)."""
    patch = tmp_path / "x.patch"
    patch.write_text(
        "From 0 Mon Sep 17 00:00:00 2001\nFrom: A <a@b.c>\n"
        "Subject: Fix it\n\nBody.\n\nFork-Fix: reverse\n"
        f"Forwarded: {forwarded}\nApplied-Upstream: {applied}\n\n"
        "diff --git a/x b/x\n"
    )
    assert patchfile.parse_patch(patch).upstream_status == expected


def test_a_patch_may_carry_several_fixes(tmp_path):
    """One ``Fork-Fix:`` trailer a fix, repeated (the master shuffle PR)."""
    patch = tmp_path / "x.patch"
    patch.write_text(
        "From 0 Mon Sep 17 00:00:00 2001\nFrom: A <a@b.c>\n"
        "Subject: Fix it\n\nBody.\n\nFork-Fix: reverse\nFork-Fix: other\n"
        "Forwarded: no\n\ndiff --git a/x b/x\n"
    )
    info = patchfile.parse_patch(patch)
    assert info.fixes == ("reverse", "other")
    assert "Fork-Fix" not in info.message


def test_added_tests_are_module_functions_and_class_methods_only(tmp_path):
    patch = tmp_path / "x.patch"
    patch.write_text(
        "From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] Add tests\n\n"
        "Why.\n---\n"
        "diff --git a/keras/src/a_test.py b/keras/src/a_test.py\n"
        "--- a/keras/src/a_test.py\n+++ b/keras/src/a_test.py\n"
        "@@ -1,1 +1,12 @@\n"
        " import keras\n"
        "+def test_module_level():\n"
        "+    class T:\n"
        "+        def test_step(self, data):\n"
        "+            pass\n"
        "+class CTest(testing.TestCase):\n"
        "+    def test_method(self):\n"
        "+        pass\n"
        "+class CustomModel(models.Sequential):\n"
        "+    def test_step(self, data):\n"
        "+        pass\n"
        "@@ -20,3 +28,6 @@ class OldTest(testing.TestCase):\n"
        "     def test_old(self):\n"
        "         pass\n"
        "+\n"
        "+    def test_added(self):\n"
        "+        pass\n"
    )
    # The model's test_step overrides (nested, or a method of a model
    # class) are not tests pytest collects; a method added to a test class
    # that only the hunk header names is.
    assert patchfile.parse_patch(patch).added_tests() == [
        "keras/src/a_test.py::test_module_level",
        "keras/src/a_test.py::test_method",
        "keras/src/a_test.py::test_added",
    ]
