"""The GPU set-up (``--accelerator gpu``), checked without a GPU: how many
GPUs each topology needs, which cells a machine cannot run, which GPU each
worker gets, the collectives and the float32 environment."""

import os
import stat

import pytest

from integration_tests.harness import run
from integration_tests.harness import schedule
from integration_tests.harness import topologies
from integration_tests.harness import workers
from keras_fork.proof import cells as cells_lib


def _fake_nvidia_smi(folder, gpus):
    """An ``nvidia-smi`` on ``folder`` whose ``-L`` lists ``gpus`` GPUs."""
    lines = "".join(
        f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i:08d})'\n"
        for i in range(gpus)
    )
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{lines}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.fixture
def no_visibility_set(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_every_replica_is_a_gpu_and_jax_8_needs_two():
    assert topologies.gpus_needed("tensorflow", "mirrored-4") == 4
    assert topologies.gpus_needed("tensorflow", "mirrored-2") == 2
    for backend, topology in topologies.MULTI_PROCESS:
        assert topologies.gpus_needed(backend, topology) == 2
    assert topologies.gpus_needed("jax", "8") == 2  # every GPU, at least 2
    for backend in ("jax", "tensorflow", "torch"):
        assert topologies.gpus_needed(backend, "1") == 1
        assert (
            topologies.gpus_needed(
                backend, cells_lib.device_topology(cells_lib.UNIT)
            )
            == 1
        )
    with pytest.raises(KeyError):
        topologies.gpus_needed("torch", "mirrored-2")


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch, tmp_path):
    # nvidia-smi lists 4, but the variable decides when it is set.
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path, 4)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert run.visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert run.visible_gpus() == []
    assert schedule.accelerator("auto") == ("cpu", 0)
    with pytest.raises(ValueError, match="shows no GPU"):
        schedule.accelerator("gpu")


def test_visible_gpus_are_what_nvidia_smi_lists(
    monkeypatch, tmp_path, no_visibility_set
):
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path, 3)))
    assert run.visible_gpus() == ["0", "1", "2"]
    assert schedule.accelerator("auto") == ("gpu", 3)
    assert schedule.accelerator("cpu") == ("cpu", 3)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert run.visible_gpus() == []
    assert schedule.accelerator("auto") == ("cpu", 0)


def _cell(backend, topology, expect="proven", reason=""):
    return cells_lib.Cell(
        "3.15.1", "f", "#1", backend, topology, expect, reason
    )


def test_cells_short_of_gpus_are_na_with_the_counts():
    cells = [
        _cell("tensorflow", "1"),
        _cell("tensorflow", "mirrored-2", "guard"),
        _cell("tensorflow", "mirrored-4"),
        _cell("torch", "ddp-2"),
        _cell("jax", "8"),
        _cell("jax", "procs-2", "n/a", "no 2-process test"),
    ]
    two = cells_lib.short_of_gpus(cells, 2)
    assert [c.expect for c in two] == [
        "proven",
        "guard",
        "n/a",
        "proven",
        "proven",
        "n/a",
    ]
    assert two[2].reason == "needs 4 GPUs; this machine has 2"
    assert two[5].reason == "no 2-process test"  # its own reason stands
    one = cells_lib.short_of_gpus(cells, 1)
    assert [c.expect for c in one] == ["proven"] + ["n/a"] * 5
    assert one[4].reason == "needs 2 GPUs; this machine has 1"
    assert cells_lib.short_of_gpus(cells, 8) == cells


@pytest.mark.parametrize(
    "visible, used",
    [
        ("0,1,2,3,4,5,6,7,8", "0,1,2,3,4,5,6,7"),
        ("4,5,6,7,0,1", "4,5,6,7"),
        ("1,2,3", "1,2"),
    ],
)
def test_jax_8_takes_8_4_or_2_gpus(monkeypatch, visible, used):
    # A divisor of 8: every batch split over 8 devices splits over them.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    env = run.topology_env("jax", "8", "gpu")
    assert env["CUDA_VISIBLE_DEVICES"] == used
    assert "CUDA_VISIBLE_DEVICES" not in run.topology_env("jax", "1", "gpu")
    assert topologies.jax_gpus(["0"]) == []


def test_gpu_processes_keep_float32_and_share_gpu_memory(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # jax/8 is n/a on it
    for backend, topology in topologies.TOPOLOGIES:
        env = run.topology_env(backend, topology, "gpu")
        # TF32 off: the tests' float32 tolerances hold on GPUs too.
        assert env["NVIDIA_TF32_OVERRIDE"] == "0"
        assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"
        # Processes share GPUs: no whole-GPU preallocation.
        assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
        assert "CUDA_VISIBLE_DEVICES" not in env
        cpu = topologies.env_for(backend, topology, "cpu")
        assert cpu["CUDA_VISIBLE_DEVICES"] == ""
        assert not set(topologies.GPU_ENV) & set(cpu)


@pytest.mark.parametrize(
    "accelerator, visible, seen_by_ranks, backend",
    [
        # One GPU of its own per rank, in the order they are visible.
        ("gpu", "5,7,9", ["5", "7"], "nccl"),
        # On CPU the workers inherit the test process's (no) devices.
        ("cpu", "", ["", ""], "gloo"),
        (None, "", ["", ""], "gloo"),
    ],
)
def test_workers_devices_and_collectives(
    monkeypatch, accelerator, visible, seen_by_ranks, backend
):
    if accelerator is None:
        monkeypatch.delenv("PROOF_ACCELERATOR", raising=False)
    else:
        monkeypatch.setenv("PROOF_ACCELERATOR", accelerator)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    seen = workers.run_workers(
        "tests.mp_targets:environ", world_size=2, timeout=60
    )
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in seen] == seen_by_ranks
    assert workers.collective_backend() == backend


def test_too_few_gpus_start_no_worker(monkeypatch, tmp_path):
    monkeypatch.setenv("PROOF_ACCELERATOR", "gpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(workers.WorkerError, match="need one GPU each"):
        workers.run_workers(
            "tests.mp_targets:hang",
            world_size=2,
            timeout=5,
            env={"PID_DIR": str(tmp_path)},
        )
    assert os.listdir(tmp_path) == []  # no worker wrote its pid
