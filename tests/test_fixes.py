"""The fix catalog: one folder a fix, in step with the series."""

import argparse
import dataclasses
import json
import re
import shutil

import pytest

from keras_fork import cli
from keras_fork.errors import ForkError
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import fixes
from keras_fork.recipe import patchfile
from keras_fork.recipe import pins
from keras_fork.recipe import series

LAYOUT = pins.Layout.default()


def test_the_fix_folders_and_the_series_agree():
    """Every Fork-Fix trailer names a fix folder, every fix has a patch on
    a base it lists, and every fix has a cell for every topology."""
    assert fixes.problems(LAYOUT) == []


def test_every_fix_is_proven_somewhere_and_valid():
    cells = cells_lib.load_matrix(LAYOUT.fixes)
    bases = pins.load_bases(LAYOUT)
    ids = {c.fix for c in cells}
    assert len(ids) == len(list(LAYOUT.fixes.glob("*/fix.toml")))
    for fix in ids:
        assert any(c.fix == fix and c.expect == "proven" for c in cells), fix
    for c in cells:
        assert c.base in bases, c
        assert c.expect in ("proven", "guard", "n/a")
        assert c.expect != "n/a" or (c.reason and not c.reason.startswith("@"))


def test_every_fix_folder_holds_its_own_marked_tests():
    for fix in cells_lib.load_fixes(LAYOUT.fixes):
        source = "".join(p.read_text() for p in fix.folder.glob("test_*.py"))
        marked = set(re.findall(r'pytest\.mark\.fix\(\s*"([\w-]+)"', source))
        assert marked == {fix.id}, (fix.folder, marked)
        assert (fix.folder / "__init__.py").is_file(), fix.folder


def _scratch(tmp_path):
    """A copy of the real fix folders and series to plant mistakes in."""
    for name in ("patches", "integration_tests/fixes"):
        shutil.copytree(
            pins.CODE_ROOT / name,
            tmp_path / name,
            ignore=shutil.ignore_patterns("test_*.py", "__pycache__"),
        )
    return dataclasses.replace(
        LAYOUT,
        patches=tmp_path / "patches",
        fixes=tmp_path / "integration_tests" / "fixes",
        root=tmp_path,
    )


def test_a_trailer_typo_a_fix_without_patch_and_a_missing_cell_are_named(
    tmp_path,
):
    layout = _scratch(tmp_path)
    name = patchfile.patch_file_name(
        "Normalize distributed losses by the step's global batch size"
    )
    for patch in layout.patches.glob(f"*/{name}"):  # the fix on every base
        patch.write_text(
            patch.read_text().replace(
                "Fork-Fix: uneven-batch", "Fork-Fix: uneven-bacth"
            )
        )
    patch = layout.patches / "3.15.1" / name
    toml = layout.fixes / "replica_rng" / "fix.toml"
    toml.write_text(toml.read_text().replace('"torch/ddp-2" = "guard"\n', ""))
    found = "\n".join(fixes.problems(layout))
    assert f"{patch.name}: Fork-Fix: uneven-bacth names no fix folder" in found
    assert "fix uneven-batch: no patch on any base" in found
    assert "fix replica-rng on 3.15.1: no cell for ['torch/ddp-2']" in found


def _fix_toml(tmp_path, cells, extra="", folder="f"):
    (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "reasons.toml").write_text('[reasons]\nshared = "a reason"\n')
    path = tmp_path / folder / "fix.toml"
    path.write_text(
        'id = "f"\nissue = "keras-team/keras#1"\nbases = ["3.7.0", "3.15.1"]\n'
        f'summary = "s"\n[cells]\n{cells}\n{extra}'
    )
    return tmp_path


@pytest.mark.parametrize(
    "cell, error",
    [
        ('"jax/64" = "proven"', "unknown cell jax/64"),
        ('"jax/1" = "maybe"', "expectation 'maybe'"),
        ('"jax/1" = "n/a"', "n/a needs a reason"),
        ('"jax/1" = "n/a: @nope"', "no shared reason '@nope'"),
    ],
)
def test_bad_cells_are_refused(tmp_path, cell, error):
    with pytest.raises(ForkError, match=re.escape(error)):
        cells_lib.load_matrix(_fix_toml(tmp_path, cell))


def test_a_folder_not_named_after_its_fix_is_refused(tmp_path):
    folder = _fix_toml(tmp_path, '"jax/1" = "guard"', folder="g")
    with pytest.raises(ForkError, match="must be named 'f'"):
        cells_lib.load_fixes(folder)


def test_shared_reasons_and_base_cells(tmp_path):
    folder = _fix_toml(
        tmp_path,
        '"jax/1" = "proven"\n"jax/8" = "n/a: @shared"',
        '[base_cells."3.15.1"]\n"jax/1" = "guard"\n',
    )
    got = {
        (c.base, c.topology): (c.expect, c.reason)
        for c in cells_lib.load_matrix(folder)
    }
    assert got == {
        ("3.7.0", "1"): ("proven", ""),
        ("3.7.0", "8"): ("n/a", "a reason"),
        ("3.15.1", "1"): ("guard", ""),
        ("3.15.1", "8"): ("n/a", "a reason"),
    }
    _fix_toml(tmp_path, '"jax/1" = "guard"', '[base_cells."9.9.9"]\n')
    with pytest.raises(ForkError, match="not in its bases"):
        cells_lib.load_matrix(folder)


def test_missing_cells_name_each_topology():
    fix = cells_lib.load_fixes(LAYOUT.fixes)[0]
    table = dict(fix.cells)
    first = next(iter(table))
    table[first] = {"jax/1": "guard"}
    missing = cells_lib.missing_cells(dataclasses.replace(fix, cells=table))
    assert len(missing[first]) == len(cells_lib.cell_keys()) - 1


def test_fixes_json_lists_every_fix_named_by_a_trailer(capsys):
    assert cli.main(["fixes", "--json"]) == 0
    listed = {f["id"]: f for f in json.loads(capsys.readouterr().out)["fixes"]}
    named = set()
    for base in pins.load_bases(LAYOUT).values():
        for p in series.read_series(LAYOUT, base) + series.read_repo_only(
            LAYOUT, base
        ):
            named.update(patchfile.parse_patch(p).fixes)
    assert named == set(listed)
    row = listed["uneven-batch"]
    name = "normalize-distributed-losses-by-the-step-s-global-batch-size.patch"
    assert row["patches"]["3.15.1"] == [name]
    assert set(row["patches"]) == set(row["bases"])
    assert set(row["cells"]) >= {"proven", "guard", "n/a", "source"}
    assert listed["aggregation-none"]["upstream"].startswith("fixed upstream")


def test_fixes_check_fails_on_a_planted_problem(tmp_path, capsys):
    layout = _scratch(tmp_path)
    (layout.fixes / "extra_fix").mkdir()
    (layout.fixes / "extra_fix" / "fix.toml").write_text(
        'id = "extra-fix"\nissue = "x#1"\nbases = ["3.15.1"]\nsummary = "s"\n'
    )
    args = cli.parser().parse_args(["fixes", "--check"])
    assert fixes.main(args, layout) == 1
    assert "fix extra-fix: no patch on any base" in capsys.readouterr().out


def _filters(**given):
    """A ``prove`` filter namespace: the given lists, every other None."""
    names = ("base", "fix", "backend", "topology")
    return argparse.Namespace(**{n: given.get(n) for n in names})


@pytest.mark.parametrize(
    ("given", "named", "valid"),
    [
        ({"fix": ["nosuch"]}, "--fix 'nosuch'", "seeded-shuffle"),
        ({"backend": ["mxnet"]}, "--backend 'mxnet'", "jax, tensorflow"),
        ({"topology": ["9"]}, "--topology '9'", "mirrored-2"),
        ({"base": ["9.9.9"]}, "--base '9.9.9'", "3.15.1"),
    ],
)
def test_an_unknown_filter_value_is_named_with_the_valid_ones(
    given, named, valid
):
    matrix = cells_lib.load_matrix(LAYOUT.fixes)
    with pytest.raises(ForkError, match="unknown") as e:
        cells_lib.select(matrix, _filters(**given))
    assert named in str(e.value) and valid in str(e.value)


def test_a_fix_filtered_off_its_bases_names_where_its_cells_are():
    matrix = cells_lib.load_matrix(LAYOUT.fixes)
    torch_only = {c.base for c in matrix if c.fix == "torch-uneven-steps"}
    assert "3.7.0" not in torch_only
    args = _filters(base=["3.7.0"], fix=["torch-uneven-steps"])
    with pytest.raises(ForkError) as e:
        cells_lib.select(matrix, args)
    message = str(e.value)
    assert "no matrix cell matches --base 3.7.0 --fix torch-uneven-steps" in (
        message
    )
    assert f"has cells on base {', '.join(sorted(torch_only))}" in message


def test_filters_that_match_select_those_cells_only():
    matrix = cells_lib.load_matrix(LAYOUT.fixes)
    chosen = cells_lib.select(
        matrix, _filters(fix=["seeded-shuffle"], backend=["jax", "torch"])
    )
    assert chosen and {c.fix for c in chosen} == {"seeded-shuffle"}
    assert {c.backend for c in chosen} == {"jax", "torch"}


def test_skip_topology_leaves_out_that_topology_only():
    matrix = cells_lib.load_matrix(LAYOUT.fixes)
    args = _filters(backend=["tensorflow"])
    args.skip_topology = ["mirrored-4"]
    chosen = cells_lib.select(matrix, args)
    every = {c.topology for c in matrix if c.backend == "tensorflow"}
    assert {c.topology for c in chosen} == every - {"mirrored-4"}
    args.skip_topology = ["mirrored-5"]
    with pytest.raises(ForkError, match="--skip-topology 'mirrored-5'"):
        cells_lib.select(matrix, args)
    both = _filters(topology=["mirrored-4"])
    both.skip_topology = ["mirrored-4"]
    with pytest.raises(ForkError, match="--skip-topology mirrored-4"):
        cells_lib.select(matrix, both)


def test_catalog_counts_a_problem_verdict_under_its_own_name():
    fix = next(
        f
        for f in cells_lib.load_fixes(LAYOUT.fixes)
        if any(c.expect == "guard" for c in cells_lib.fix_cells(f))
    )
    cells = cells_lib.fix_cells(fix)
    proof = {c.key: {"verdict": c.expect} for c in cells}
    guard = next(c for c in cells if c.expect == "guard")
    proof[guard.key] = {"verdict": "guard-failed-on-stock"}
    counted = fixes.counts(fix, proof)
    assert counted["guard-failed-on-stock"] == 1
    assert counted["guard"] == sum(c.expect == "guard" for c in cells) - 1
    assert counted["source"] == "dist/proof.json"


def test_a_running_cell_whose_prerequisites_share_its_patch_is_named(
    tmp_path,
):
    """On master one patch carries seeded-shuffle and shuffle-epochs: stock
    plus shuffle-epochs would be seeded-shuffle's fix too."""
    layout = _scratch(tmp_path)
    toml = layout.fixes / "seeded_shuffle" / "fix.toml"
    toml.write_text(
        toml.read_text() + '\n[prerequisites]\n"jax/1" = ["shuffle-epochs"]\n'
    )
    found = fixes.problems(layout)
    master = "3.16.0.dev2026102704-seeded-shuffle-jax-1"
    assert [line.split(":")[0] for line in found] == [master]
    assert "also carries seeded-shuffle" in found[0]
    assert found[0].endswith("declare it n/a")
