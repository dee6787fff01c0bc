"""A tiny fake upstream keras sdist for testing the recipe without PyPI."""

import hashlib
import io
import tarfile
from pathlib import Path

from keras_fork.recipe import pins
from keras_fork.recipe import series

VERSION = "9.9.9"
EPOCH = 1_700_000_000

FILES = {
    "PKG-INFO": f"Metadata-Version: 2.1\nName: keras\nVersion: {VERSION}\n",
    "pyproject.toml": (
        '[build-system]\nrequires = ["setuptools >=61.0"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "keras"\ndynamic = ["version"]\n\n'
        "[tool.setuptools.dynamic]\n"
        'version = {attr = "keras.src.version.__version__"}\n\n'
        "[tool.setuptools.package-dir]\n"
        '"keras" = "keras/api"\n"keras.src" = "keras/src"\n'
    ),
    "keras/api/__init__.py": "from keras.src.version import __version__\n",
    "keras/src/__init__.py": "",
    "keras/src/version.py": (
        "# Unique source of truth for the version number.\n"
        f'__version__ = "{VERSION}"\n'
    ),
    "keras/src/shuffle.py": "def order(n):\n    return list(range(n))\n",
}


NIGHTLY = "9.10.0.dev2026010101"


def nightly_files(shuffle: str) -> dict[str, str]:
    """A fake keras-nightly sdist's files: no test files, the project named
    ``keras-nightly``, ``keras/src/shuffle.py`` holding ``shuffle``."""
    files = {
        name: text.replace(VERSION, NIGHTLY)
        for name, text in FILES.items()
        if not name.endswith("_test.py")
    }
    files["pyproject.toml"] = files["pyproject.toml"].replace(
        'name = "keras"', 'name = "keras-nightly"'
    )
    files["keras/src/shuffle.py"] = shuffle
    return files


def make_sdist(folder: Path, files=FILES, stem=f"keras-{VERSION}") -> Path:
    """Writes ``<stem>.tar.gz`` (default keras-9.9.9) into ``folder``;
    returns its path."""
    path = folder / f"{stem}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in [""] + sorted(files):
            info = tarfile.TarInfo(f"{stem}/{name}".rstrip("/"))
            info.mtime = EPOCH
            if not name:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            data = files[name].encode()
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def make_layout(root: Path, sha256: str, fork_build: int = 1) -> pins.Layout:
    """A Layout under ``root`` pinning the fake base (with ``sha256``) and
    an empty series."""
    layout = pins.Layout.default(root)
    layout.pins.parent.mkdir(parents=True)
    layout.pins.write_text(
        f'["{VERSION}"]\nsdist_sha256 = "{sha256}"\nfork_build = {fork_build}\n'
    )
    (layout.patches / VERSION).mkdir(parents=True)
    (layout.patches / VERSION / ".patches").write_text("")
    return layout


def make_upstream(tmp_path: Path):
    """The fake sdist (in ``tmp_path/upstream``), a layout under
    ``tmp_path/repo`` pinning it with its sdist already in the cache, and
    its base: ``(layout, base, sdist path outside the cache)``."""
    src = tmp_path / "upstream"
    src.mkdir()
    archive = make_sdist(src)
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    layout = make_layout(tmp_path / "repo", sha)
    layout.cache.mkdir(parents=True)
    (layout.cache / archive.name).write_bytes(archive.read_bytes())
    return layout, pins.get_base(layout, VERSION), archive


def add_fix(layout, base, tree):
    """Commits a fix (fix id ``reverse``, ``Fixes keras-team/keras#1``) in the
    materialized ``tree`` and exports the series; returns its file names."""
    f = tree / "keras/src/shuffle.py"
    f.write_text(f.read_text().replace("range(n)", "reversed(range(n))"))
    env = series.git_env(EPOCH)
    series.git(tree, "add", "-A", env=env)
    series.git(
        tree,
        "commit",
        "-q",
        "-m",
        "Reverse the order\n\nBecause tests want it.\n\n"
        "Fixes keras-team/keras#1\n\n"
        "Fork-Fix: reverse\nBug: https://github.com/keras-team/keras/issues/1\n"
        "Forwarded: no\nApplied-Upstream: no",
        env=env,
    )
    return series.export(tree, series.series_dir(layout, base))
