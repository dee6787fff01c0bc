"""Upstream pins: the Keras releases the fork is based on; where things live.

The pins are data (``keras_fork/bases.toml``); nothing in the code names a
version, so a new base is a new table there plus ``patches/<version>/.patches``.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from keras_fork.errors import ForkError

# The folder holding the tool's and the harness's code (keras_fork/,
# integration_tests/): what a child process imports them from. Inputs and
# outputs are the layout's (``Layout.root``, ``--root``).
CODE_ROOT = Path(__file__).resolve().parents[2]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# PyPI projects that publish Keras's source: releases and master's nightlies.
PACKAGES = ("keras", "keras-nightly")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the recipe reads its inputs and writes its outputs.

    Inputs: ``pins`` (``keras_fork/bases.toml``), ``patches`` (a series
    folder a base) and ``fixes`` (``integration_tests/fixes``: a folder a
    fix, its ``fix.toml`` and proof tests). ``docs`` holds the committed,
    generated tables. ``cache``, ``build`` and ``dist`` are generated and
    git-ignored. Tests build a Layout in a temporary folder to exercise
    the tooling on a small fake upstream.
    """

    pins: Path
    patches: Path
    cache: Path
    build: Path
    dist: Path
    root: Path = CODE_ROOT
    fixes: Path = CODE_ROOT / "integration_tests" / "fixes"
    docs: Path = CODE_ROOT / "docs"

    @classmethod
    def default(cls, root: Path = CODE_ROOT) -> "Layout":
        return cls(
            pins=root / "keras_fork" / "bases.toml",
            patches=root / "patches",
            cache=root / ".cache" / "sdist",
            build=root / "build",
            dist=root / "dist",
            root=root,
            fixes=root / "integration_tests" / "fixes",
            docs=root / "docs",
        )

    def tree(self, version: str) -> Path:
        """The materialized (pristine + series) git tree of a base."""
        return self.build / "trees" / version

    def variant(self, version: str, variant: str) -> Path:
        """The `pip install --target` folder of `stock` or `fork` keras."""
        return self.build / "variants" / version / variant

    @property
    def proof(self) -> Path:
        """The proof matrix's record, ``dist/proof.json`` (``prove``
        writes it; its format is docs/proof.md's)."""
        return self.dist / "proof.json"


@dataclasses.dataclass(frozen=True)
class Base:
    """One pinned upstream release.

    Attributes:
        version: the PyPI version of ``package``, e.g. ``"3.15.1"`` or
            ``"3.16.0.dev2026102704"``.
        sdist_sha256: 64 lowercase hex digits, the sha256 of the sdist
            (``sdist_name``) as published on PyPI.
        fork_build: N of the PEP 440 local label ``+fork.N`` (PEP 440,
            "Local version identifiers"), >= 1.
        test_overlay: requirement pins that replace those of
            ``constraints.txt`` when testing this base (e.g. an older jax).
        pip_check_known: substrings of ``pip check`` lines that are known
            and accepted for this base beside the pinned stack (e.g. a
            tensorflow that requires a newer keras than the base).
        package: the PyPI project of the sdist: ``keras`` (a release) or
            ``keras-nightly`` (upstream master, published nightly). The
            fork wheel is named ``keras`` either way: a drop-in.
        sdist_tests: whether the sdist ships Keras's ``*_test.py`` files.
            Release sdists do; ``keras-nightly`` sdists do not, so the
            series' test hunks cannot apply to them (see
            ``series.materialize``).
        absent: why a fix this base's series does not carry is absent from
            it, for every such fix that gives no reason of its own
            (``fix.toml``'s ``[absent]``); empty: each fix must give one.
    """

    version: str
    sdist_sha256: str
    fork_build: int
    test_overlay: tuple[str, ...] = ()
    pip_check_known: tuple[str, ...] = ()
    package: str = "keras"
    sdist_tests: bool = True
    absent: str = ""

    @property
    def fork_version(self) -> str:
        """The fork's version, e.g. ``3.15.1+fork.1``; ``keras==3.15.1``
        accepts it."""
        return f"{self.version}+fork.{self.fork_build}"

    def overlay_names(self) -> set[str]:
        """Normalized project names the test overlay pins (PEP 503)."""
        return {_project_name(pin) for pin in self.test_overlay}

    def test_constraints(self, constraints: str) -> str:
        """``constraints.txt`` text with this base's overlay applied.

        Args:
            constraints: the text of the repository's constraints file.

        Returns:
            The same lines, minus the pins of every project the overlay
            names, plus the overlay pins (a venv for this base's tests is
            built with ``pip install -c`` on it).
        """
        names = self.overlay_names()
        kept = [
            line
            for line in constraints.splitlines()
            if not line.strip()
            or line.lstrip().startswith("#")
            or _project_name(line) not in names
        ]
        if self.test_overlay:
            kept.append(f"# test_overlay of base {self.version}")
            kept.extend(self.test_overlay)
        return "\n".join(kept) + "\n"

    @property
    def sdist_stem(self) -> str:
        """``<project>-<version>`` as the sdist spells it (PEP 625: the
        project name with ``-`` as ``_``); also its top folder."""
        return f"{self.package.replace('-', '_')}-{self.version}"

    @property
    def sdist_name(self) -> str:
        return f"{self.sdist_stem}.tar.gz"

    @property
    def requirement(self) -> str:
        """What ``pip download`` asks for, e.g. ``keras==3.15.1``."""
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"keras-{self.fork_version}-py3-none-any.whl"


def _project_name(requirement: str) -> str:
    """``"JAX_lib==0.4.38"`` -> ``"jax-lib"`` (PEP 503 normalization)."""
    name = re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _source(layout: Layout, version: str, table: dict) -> tuple[str, bool]:
    """``(package, sdist_tests)`` of a base's table: ``package`` defaults to
    ``keras``, ``sdist_tests`` to whether the package is ``keras``
    (``keras-nightly`` sdists ship no test files).

    Raises:
        ForkError: an unknown package, or a non-boolean ``sdist_tests``.
    """
    package = table.get("package", "keras")
    if package not in PACKAGES:
        raise ForkError(
            f"{layout.pins}: base {version}: package must be one of "
            f"{', '.join(PACKAGES)}, got {package!r}"
        )
    tests = table.get("sdist_tests", package == "keras")
    if not isinstance(tests, bool):
        raise ForkError(
            f"{layout.pins}: base {version}: sdist_tests must be true or "
            f"false, got {tests!r}"
        )
    return package, tests


def load_bases(layout: Layout) -> dict[str, Base]:
    """Reads every base from the pins file.

    Returns:
        ``{version: Base}`` in file order.

    Raises:
        ForkError: the file is missing, is not TOML, or a table lacks a valid
            ``sdist_sha256`` / ``fork_build``.
    """
    try:
        data = tomllib.loads(layout.pins.read_text())
    except FileNotFoundError:
        raise ForkError(f"pins file not found: {layout.pins}") from None
    except tomllib.TOMLDecodeError as e:
        raise ForkError(f"pins file {layout.pins} is not valid TOML: {e}")
    bases = {}
    for version, table in data.items():
        sha = str(table.get("sdist_sha256", ""))
        build = table.get("fork_build")
        if not _SHA256.match(sha):
            raise ForkError(
                f"{layout.pins}: base {version}: sdist_sha256 must be 64 "
                f"lowercase hex digits, got {sha!r}"
            )
        if not isinstance(build, int) or build < 1:
            raise ForkError(
                f"{layout.pins}: base {version}: fork_build must be an "
                f"integer >= 1, got {build!r}"
            )
        overlay = table.get("test_overlay", [])
        if not isinstance(overlay, list) or not all(
            isinstance(pin, str) and "==" in pin for pin in overlay
        ):
            raise ForkError(
                f"{layout.pins}: base {version}: test_overlay must be a list "
                f'of exact pins like "jax==0.4.38", got {overlay!r}'
            )
        overlay = tuple(overlay)
        known = table.get("pip_check_known", [])
        if not isinstance(known, list) or not all(
            isinstance(k, str) and k for k in known
        ):
            raise ForkError(
                f"{layout.pins}: base {version}: pip_check_known must be a "
                f"list of non-empty strings, got {known!r}"
            )
        package, tests = _source(layout, version, table)
        absent = str(table.get("absent", ""))
        bases[version] = Base(
            version, sha, build, overlay, tuple(known), package, tests, absent
        )
    if not bases:
        raise ForkError(f"pins file {layout.pins} declares no base")
    return bases


def get_base(layout: Layout, version: str) -> Base:
    """Returns the pinned base ``version``.

    Raises:
        ForkError: ``version`` is not pinned; the message lists known bases.
    """
    bases = load_bases(layout)
    if version not in bases:
        raise ForkError(
            f"unknown base version {version!r}; known bases: "
            f"{', '.join(bases)} (pinned in {layout.pins})"
        )
    return bases[version]


def select_bases(layout: Layout, versions: list[str] | None) -> list[Base]:
    """The bases named in ``versions`` (all pinned bases when empty)."""
    if not versions:
        return list(load_bases(layout).values())
    return [get_base(layout, v) for v in versions]
