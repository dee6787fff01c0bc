"""``verify``: which cells apply to an installed keras, how a run's JUnit
becomes fixed / broken / n/a, and what it writes. The end-to-end runs
against real keras wheels are release checks (``test_release.py``)."""

import argparse
import json
import xml.etree.ElementTree as ET

import pytest

from integration_tests.harness import catalog
from integration_tests.harness import run
from integration_tests.harness import topologies
from integration_tests.harness import verify
from integration_tests.harness.junit import read_junit

BASES = ("3.7.0", "3.15.1", "3.16.0.dev2026102704")


@pytest.mark.parametrize(
    "version, base",
    [
        ("3.15.1", "3.15.1"),
        ("3.15.1+fork.13", "3.15.1"),
        ("3.16.0.dev2026102704", "3.16.0.dev2026102704"),
        ("3.16.0.dev2026102704+fork.5", "3.16.0.dev2026102704"),
        ("3.16.0", "3.16.0.dev2026102704"),  # an editable master checkout
        ("3.16.0.dev2026010101", "3.15.1"),  # an older nightly
        ("3.10.0", "3.7.0"),
        ("3.2.0", "3.7.0"),  # before every base: the oldest
    ],
)
def test_a_keras_version_reads_the_cells_of_its_base(version, base):
    assert verify.base_for(version, BASES) == base


def test_a_version_that_is_not_pep_440_is_refused():
    with pytest.raises(verify.VerifyError, match="not PEP 440"):
        verify.base_for("master", BASES)


def test_placement_on_cpu_gpus_and_one_gpu(monkeypatch):
    monkeypatch.setattr(run, "visible_gpus", lambda: ["0"])
    assert verify.placement("tensorflow", "mirrored-4", "cpu", 0) == (
        "cpu",
        "",
    )
    assert verify.placement("torch", "1", "gpu", 1) == ("gpu", "")
    where, note = verify.placement("torch", "ddp-2", "gpu", 1)
    assert where == topologies.SHARED_GPU and "not 2 devices" in note
    assert verify.placement("torch", "ddp-2", "gpu", 2) == ("gpu", "")
    where, reason = verify.placement("jax", "procs-2", "gpu", 1)
    assert where is None
    assert reason == "too few devices: needs 2 GPUs; this machine has 1"


def test_one_gpu_mode_puts_every_worker_on_the_first_gpu_over_gloo(
    monkeypatch,
):
    from integration_tests.harness import workers

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    env = run.topology_env("torch", "ddp-2", topologies.SHARED_GPU)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["NVIDIA_TF32_OVERRIDE"] == "0"
    monkeypatch.setenv("PROOF_ACCELERATOR", topologies.SHARED_GPU)
    assert topologies.on_gpu() and topologies.shared_gpu()
    assert workers.worker_gpus(2) == [{"CUDA_VISIBLE_DEVICES": "3"}] * 2
    assert workers.collective_backend() == "gloo"
    monkeypatch.setenv("PROOF_ACCELERATOR", "gpu")
    assert workers.collective_backend() == "nccl"
    with pytest.raises(ValueError, match="one-GPU mode"):
        run.topology_env("jax", "procs-2", topologies.SHARED_GPU)


def _fix(fid, cells, bases=("3.15.1",)):
    return catalog.Fix(
        id=fid,
        issue="keras-team/keras#1",
        bases=bases,
        summary="",
        notice="",
        upstream="",
        cells={b: dict(cells) for b in bases},
        folder=None,
    )


def test_the_plan_runs_applicable_cells_and_says_why_others_are_na(
    monkeypatch,
):
    monkeypatch.setattr(verify, "installed_backends", lambda: ["jax", "torch"])
    fixes = [
        _fix("a", {"jax/1": "proven", "jax/8": "n/a: one reason"}),
        _fix("b", {"jax/1": "guard", "tensorflow/1": "proven"}),
        _fix("c", {"jax/1": "proven"}, bases=("3.16.0.dev2026102704",)),
    ]
    keras = verify.Keras("3.15.1", "/k", "3.15.1")
    wanted = {"fix": None, "backend": None, "topology": {"1", "8"}}
    runs, results = verify.plan(fixes, keras, wanted, "cpu", 0)
    assert [(r.backend, r.topology, r.fixes) for r in runs] == [
        ("jax", "1", ("a", "b"))
    ]
    na = {(r.fix, r.backend, r.topology): r.detail for r in results}
    assert na[("a", "jax", "8")] == "one reason"
    assert na[("b", "tensorflow", "1")].startswith("wrong backend")
    assert na[("c", "jax", "1")].startswith("not in the series of base")
    assert na[("a", "torch", "1")] == "no cell torch/1 in fix.toml"
    assert all(r.status == "n/a" for r in results)
    assert not any(r.topology == "unit" for r in results)


def _junit(tmp_path, cases):
    """A JUnit file with ``(name, fix, outcome, message)`` cases."""
    suite = ET.Element("testsuite", tests=str(len(cases)))
    for name, fix, outcome, message in cases:
        case = ET.SubElement(suite, "testcase", name=name)
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="fix", value=fix)
        if outcome != "passed":
            ET.SubElement(case, outcome, message=message)
    path = tmp_path / "run.xml"
    path.write_text(ET.tostring(suite, encoding="unicode"))
    return read_junit(path)


def test_a_runs_cases_give_each_fix_its_status(tmp_path):
    junit = _junit(
        tmp_path,
        [
            ("test_ok", "fixed-one", "passed", ""),
            ("test_skip", "fixed-one", "skipped", "too few devices: 1"),
            ("test_ok", "broken-one", "passed", ""),
            ("test_bad", "broken-one", "failure", "AssertionError: 3 != 4"),
            ("test_skip", "skipped-one", "skipped", "wrong backend: tf"),
        ],
    )
    log = tmp_path / "run.log"
    log.write_text("line 1\nSegmentation fault\n")
    r = verify.Run(
        "torch",
        "ddp-2",
        ("fixed-one", "broken-one", "skipped-one", "crashed"),
        "gpu-shared",
        verify.SHARED_GPU_NOTE,
    )
    got = {x.fix: x for x in verify.results_of(r, junit, -11, log)}
    assert got["fixed-one"].status == "fixed"
    assert got["broken-one"].status == "broken"
    assert got["broken-one"].detail.startswith(
        "test_bad: AssertionError: 3 != 4"
    )
    assert got["skipped-one"].status == "n/a"
    assert got["skipped-one"].detail.startswith("wrong backend: tf")
    assert got["crashed"].status == "broken"
    assert "exit -11" in got["crashed"].detail
    assert "Segmentation fault" in got["crashed"].detail
    assert all("not 2 devices" in x.detail for x in got.values())


def test_the_table_and_the_junit_file(tmp_path):
    results = [
        verify.Result("b", "jax", "1", "fixed", "2 test(s) passed"),
        verify.Result("a", "jax", "8", "broken", "test_x: boom"),
        verify.Result("a", "jax", "1", "n/a", "one device"),
    ]
    table = verify.render_table(results)
    assert table.splitlines()[1].startswith("a    jax      1         n/a")
    assert table.rstrip().endswith("1 fixed, 1 broken, 1 n/a")
    path = tmp_path / "out" / "verify.xml"
    verify.write_junit(results, path, 1.5)
    suite = ET.parse(path).getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("3", "1")
    assert suite.get("skipped") == "1"
    broken = suite.find("testcase[@name='jax/8']")
    assert broken.get("classname") == "a"
    assert broken.find("failure").get("message") == "test_x: boom"
    assert list((tmp_path / "out").iterdir()) == [path]  # no temp file left


def _args(tmp_path, **kw):
    p = argparse.ArgumentParser()
    verify.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path)])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


@pytest.mark.parametrize(
    "axis, value, valid",
    [
        ("fix", "no-such-fix", "seeded-shuffle"),
        ("backend", "mxnet", "jax, tensorflow, torch"),
        ("topology", "unit", "mirrored-2"),
    ],
)
def test_an_unknown_filter_value_is_named_with_the_valid_ones(
    tmp_path, capsys, axis, value, valid
):
    args = _args(tmp_path, **{axis: [value]})
    assert verify.run_verify(args) == 2
    err = capsys.readouterr().err
    assert f"unknown --{axis} {value}; valid:" in err
    assert valid in err
    assert not (tmp_path / "verify.xml").exists()


def test_no_keras_to_verify_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # no keras there
    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "__init__.py").write_text("raise ImportError('x')")
    assert verify.run_verify(_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "no keras to verify" in err and "ImportError: x" in err


def test_json_output_has_the_documented_fields(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        verify,
        "verify",
        lambda args: (
            verify.Keras("3.15.1", "/k", "3.15.1"),
            [verify.Result("a", "jax", "1", "broken", "x")],
        ),
    )
    args = _args(tmp_path, json=True)
    args.out = tmp_path
    assert verify.run_verify(args) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["keras"]["base"] == "3.15.1"
    assert payload["results"] == [
        {
            "fix": "a",
            "backend": "jax",
            "topology": "1",
            "status": "broken",
            "detail": "x",
        }
    ]
