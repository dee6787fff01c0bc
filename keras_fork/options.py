"""Command-line options that several verbs share, declared once (those of
a matrix of cells, which ``verify`` shares too, are
``integration_tests.harness.options``'s: this module is imported by
``build`` and ``pr-series``, which run without the harness).

``--base`` has two meanings: a filter (``add_bases``: repeatable, every
pinned base by default; resolved with ``pins.select_bases``) and one base a
verb works on (``add_base``: required once; ``pins.get_base``).
"""

from __future__ import annotations

from pathlib import Path


def add_bases(p) -> None:
    """``--base V`` (repeatable): only these pinned bases; default all."""
    p.add_argument(
        "--base",
        action="append",
        help="only this base (repeatable; default: every pinned base)",
    )


def add_base(p, what: str) -> None:
    """``--base V`` (required): the one base the verb works on, ``what``
    saying which (e.g. "the base to export")."""
    p.add_argument("--base", required=True, help=what)


def add_sdist(p) -> None:
    """``--sdist PATH``: an sdist file instead of the cached or downloaded
    one, for exactly one ``--base`` (``sdist.fetch`` checks it against the
    pinned sha256)."""
    p.add_argument(
        "--sdist",
        type=Path,
        help="use this sdist instead of the cached or downloaded one "
        "(offline; needs exactly one --base; checked against the pinned "
        "sha256)",
    )
