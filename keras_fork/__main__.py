"""Command line of the fork recipe: ``python -m keras_fork <command>``.

Commands (the ``scripts/`` entry points call these):
  build    materialize each base, check the series, build the wheel and the
           PR series into dist/
  export   rewrite patches/<base>/ from the materialized tree (after editing)
  check    fail when re-exporting the materialized tree changes patches/
  prove    run the stock-vs-fork proof matrix (see keras_fork.prove)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from keras_fork import pins
from keras_fork import prove
from keras_fork import prseries
from keras_fork import series
from keras_fork import wheel
from keras_fork.errors import ForkError


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def cmd_build(args, layout: pins.Layout) -> int:
    bases = pins.select_bases(layout, args.base)
    if args.sdist and len(bases) != 1:
        raise ForkError("--sdist needs exactly one --base")
    console = _console()
    # Scratch folders of a build that was killed (no cleanup ran).
    for scratch in [
        *layout.build.glob(".wheel.*"),
        *layout.build.glob("trees/.*"),
        *layout.dist.glob("pr-series/.pr.*"),
    ]:
        shutil.rmtree(scratch, ignore_errors=True)
    for base in bases:
        # Outputs of an earlier build (any fork build number of this base)
        # must not survive a failed one.
        for old in layout.dist.glob(f"keras-{base.version}+fork.*.whl"):
            old.unlink()
        stale = prseries.pr_series_dir(layout, base)
        if stale.exists():
            shutil.rmtree(stale)
        with console.status(f"keras {base.version}: materializing"):
            tree = series.materialize(layout, base, args.sdist)
        drift = series.check(layout, base, tree)
        if drift:
            raise ForkError(
                f"re-exporting the {base.version} tree changes {drift}: "
                f"patches/{base.version} is not in canonical form; run "
                f"`python -m keras_fork export --base {base.version}`"
            )
        with console.status(f"keras {base.version}: building the wheel"):
            whl = wheel.build(layout, base, tree)
        pr = prseries.write(layout, base, tree)
        console.print(f"[green]built[/] {whl.relative_to(layout.dist.parent)}")
        console.print(f"[green]wrote[/] {pr.relative_to(layout.dist.parent)}/")
    return 0


def cmd_export(args, layout: pins.Layout) -> int:
    base = pins.get_base(layout, args.base)
    tree = layout.tree(base.version)
    if not (tree / ".git").is_dir():
        raise ForkError(f"no materialized tree at {tree}: run scripts/build")
    names = series.export(tree, series.series_dir(layout, base))
    _console().print(f"exported {len(names)} patches to patches/{base.version}")
    return 0


def cmd_check(args, layout: pins.Layout) -> int:
    status = 0
    for base in pins.select_bases(layout, args.base):
        tree = series.materialize(layout, base, None)
        drift = series.check(layout, base, tree)
        if drift:
            print(f"{base.version}: re-export differs in {drift}")
            status = 1
        else:
            print(f"{base.version}: re-export reproduces patches/ exactly")
        if args.upstream_git:
            failed = series.check_repo_only(layout, base, args.upstream_git)
            for line in failed:
                print(f"{base.version}: repo-only patch does not apply: {line}")
            status = status or int(bool(failed))
            if not failed:
                n = len(series.read_repo_only(layout, base))
                print(
                    f"{base.version}: {n} repo-only patch(es) apply to "
                    f"v{base.version} of {args.upstream_git}"
                )
    return status


def cmd_prove(args, layout: pins.Layout) -> int:
    return prove.main(args, layout)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m keras_fork")
    p.add_argument(
        "--root", type=Path, default=pins.REPO_ROOT, help=argparse.SUPPRESS
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="wheels and PR series into dist/")
    b.add_argument("--base", action="append", help="base version (repeat)")
    b.add_argument("--sdist", type=Path, help="use this sdist (offline)")
    b.set_defaults(func=cmd_build)
    e = sub.add_parser("export", help="rewrite patches/<base> from the tree")
    e.add_argument("--base", required=True)
    e.set_defaults(func=cmd_export)
    c = sub.add_parser("check", help="re-export must reproduce patches/")
    c.add_argument("--base", action="append")
    c.add_argument(
        "--upstream-git",
        type=Path,
        help="a keras-team/keras clone: also apply patches/<V>/repo-only "
        "to its tag v<V>",
    )
    c.set_defaults(func=cmd_check)
    prove.add_parser(sub).set_defaults(func=cmd_prove)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    layout = pins.Layout.default(args.root)
    try:
        return args.func(args, layout)
    except ForkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
