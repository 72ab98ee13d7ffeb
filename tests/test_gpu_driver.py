"""The start-time check of the image's torch against the node's NVIDIA driver (evaluation/gpu_driver.py).

This machine has no GPU and no driver, so the driver is a stand-in: the decision on fabricated
versions; the command line with fabricated facts; and an evaluator actor on a real Ray whose worker
loads a stand-in libcuda.so.1 (a C library answering cuDriverGetVersion) and runs a stand-in
nvidia-smi, so the real readers run too.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cli_runner import ksearch

from ksearch_ray.evaluation import gpu_driver
from ksearch_ray.evaluation.gpu_driver import DriverFacts, GpuDriverError, problem

ROOT = Path(__file__).resolve().parent.parent
TORCH_CU130 = dict(torch_version="2.11.0+cu130", torch_cuda="13.0")
DRIVER_535 = dict(driver_version="535.104.05", driver_cuda="12.2")


def facts(**kw: object) -> DriverFacts:
    return DriverFacts(**{**TORCH_CU130, "cuda_available": False, **DRIVER_535, **kw})  # type: ignore[arg-type]


def test_a_driver_older_than_torchs_cuda_is_one_line_naming_both_versions() -> None:
    line = problem(facts())
    assert line == ("torch 2.11.0+cu130 is built for CUDA 13.0, but this node's NVIDIA driver 535.104.05 (CUDA 12.2) "
                    "supports CUDA up to 12.2: use a torch built for CUDA 12.2 or older (or an image with one), "
                    "or a newer driver")
    assert "\n" not in line


@pytest.mark.parametrize(("case", "given", "expected"), [
    ("no driver: not a GPU node", dict(driver_version=None, driver_cuda=None), None),
    ("usable, same version", dict(torch_cuda="12.8", driver_cuda="12.8", cuda_available=True), None),
    ("usable, older driver minor (CUDA minor-version compatibility)",
     dict(torch_cuda="12.8", driver_cuda="12.2", cuda_available=True), None),
    ("older driver major, even if torch claims a GPU", dict(cuda_available=True), "supports CUDA up to 12.2"),
    ("versions compare as numbers: 12.10 is newer than 12.9",
     dict(torch_cuda="12.10", driver_cuda="12.9"), "supports CUDA up to 12.9"),
    ("not older, yet unusable", dict(torch_cuda="12.8", driver_cuda="12.8"), "torch.cuda.is_available() is false"),
    ("a CPU build of torch on a GPU node", dict(torch_version="2.11.0+cpu", torch_cuda=None),
     "torch 2.11.0+cpu is a CPU build, but this node has NVIDIA driver 535.104.05 (CUDA 12.2)"),
    ("no nvidia-smi: the driver library's CUDA version alone", dict(driver_version=None),
     "this node's NVIDIA driver (CUDA 12.2) supports CUDA up to 12.2"),
])
def test_the_decision_on_fabricated_versions(case: str, given: dict, expected: str | None) -> None:
    line = problem(facts(**given))
    if expected is None:
        assert line is None, case
    else:
        assert line is not None and expected in line, (case, line)


@pytest.fixture
def old_driver(monkeypatch: pytest.MonkeyPatch) -> DriverFacts:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fabricated = facts()
    monkeypatch.setattr(gpu_driver, "facts", lambda: fabricated)
    return fabricated


@pytest.mark.parametrize("command", [
    ["run", "--task", "trimul", "--no-ray", "--rounds", "1"],
    ["run", "--task", "trimul", "--no-ray", "--device", "cuda", "--rounds", "1"],
    ["eval", "--task", "trimul", "triton_fused"],
])
def test_the_command_line_says_it_in_one_line_and_starts_nothing(command: list[str], old_driver: DriverFacts,
                                                                   tmp_path: Path) -> None:
    done = ksearch(tmp_path, *command)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()  # after the phase lines of a run's start, if any
    assert lines[-1] == f"error: {problem(old_driver)}" and "Traceback" not in done.stderr, done.stderr
    assert [line for line in lines if "error" in line] == lines[-1:]
    assert not (tmp_path / "runs").exists()


def test_the_cpu_path_asks_nothing_of_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    from ksearch_ray.config import RunConfig
    from ksearch_ray.session import _Backend

    def never() -> DriverFacts:
        raise AssertionError("the CPU path read the driver")

    monkeypatch.setattr(gpu_driver, "facts", never)
    config = RunConfig.model_validate({"task": "trimul", "evaluation": {"device": "cpu"}, "cluster": {"ray": False}})
    assert _Backend(config).device(config) == "cpu"


def test_an_evaluator_on_such_a_node_refuses_before_its_sandbox_starts(old_driver: DriverFacts, tmp_path: Path) -> None:
    from ksearch_ray.evaluation.evaluator import Evaluator

    with pytest.raises(GpuDriverError) as caught:
        Evaluator("cuda", tmp_path / "work", start=True)
    assert str(caught.value) == problem(old_driver)
    assert not (tmp_path / "work").exists()


@pytest.fixture
def stand_in_driver(tmp_path: Path) -> dict[str, str]:
    """A libcuda.so.1 whose cuDriverGetVersion says 12020 (CUDA 12.2), and an nvidia-smi saying driver 535.104.05."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "cuda.c").write_text("int cuDriverGetVersion(int *version) { *version = 12020; return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libcuda.so.1"), str(tmp_path / "cuda.c")], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 535.104.05\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {"LD_LIBRARY_PATH": str(lib), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_an_evaluator_actor_on_such_a_node_stops_the_run_with_that_line(ray_session, stand_in_driver: dict[str, str]) -> None:
    """On a real Ray worker that loads the stand-in driver: the actor's first call raises the line
    (not "the actor died", which the pool would retry three times and then report without it)."""
    import torch
    from ksearch_ray.actors.evaluator_actor import EvaluatorActor

    from ksearch_ray.config import EvaluationConfig

    actor = EvaluatorActor.options(num_cpus=0, num_gpus=1, runtime_env={"env_vars": stand_in_driver}).remote(
        "cuda", EvaluationConfig().model_dump_json())
    with pytest.raises(GpuDriverError) as caught:
        ray_session.get(actor.describe.remote(), timeout=120)
    expected = problem(DriverFacts(torch_version=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=False,
                                   driver_version="535.104.05", driver_cuda="12.2"))
    assert caught.value.cause is not None and str(caught.value.cause) == expected
    ray_session.kill(actor)
