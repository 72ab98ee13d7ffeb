"""The TriMul task bundle: reference math, input generation, workload files, and its two solutions.

Everything runs on the CPU, the Triton kernels in Triton's interpreter. Triton fixes interpreter
vs compiler for its own library when it is first imported, so the switch is set for the whole
process before anything imports triton, not toggled per test.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from ksearch_ray.taskspec.spec import Workload
from ksearch_ray.taskspec.task import Task, load_module_file, read_workloads
from ksearch_ray.taskspec.tunables import read_tunables, rewrite_tunables  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "tasks" / "trimul"
ATOL = RTOL = 2e-2


@pytest.fixture(scope="module")
def ref() -> ModuleType:
    return load_module_file(ROOT / "reference.py", "trimul_reference_under_test")


@pytest.fixture(scope="module")
def task() -> Task:
    return Task.load(ROOT)


def _workload(n: int, b: int, d: int, *, nomask: bool, dist: str) -> Workload:
    return Workload(
        name=f"N{n}_B{b}_D{d}", axes={"N": n, "B": b, "D": d, "H": 128},
        params={"seed": 0, "nomask": nomask, "distribution": dist},
    )


def _assert_within_tolerance(out: torch.Tensor, expected: torch.Tensor) -> None:
    """GPUMode's rule: |out - expected| <= atol + rtol*|expected| everywhere, all finite here."""
    assert out.shape == expected.shape
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    excess = (out - expected).abs() - (ATOL + RTOL * expected.abs())
    assert excess.max().item() <= 0, f"max excess over tolerance {excess.max().item():.3e}"


# --- (a) the reference against an independent float64 computation ------------------------------


def _float64_trimul(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The same math spelled out with einsum and hand-written LayerNorms, in float64."""
    t = {k: v.double() for k, v in inputs.items()}

    def layer_norm(v: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        mean = v.mean(-1, keepdim=True)
        var = ((v - mean) ** 2).mean(-1, keepdim=True)
        return (v - mean) / torch.sqrt(var + 1e-5) * weight + bias

    def sigmoid(v: torch.Tensor) -> torch.Tensor:
        return 1.0 / (1.0 + torch.exp(-v))

    xn = layer_norm(t["x"], t["norm.weight"], t["norm.bias"])
    m = t["mask"][..., None]
    proj = {name: torch.einsum("bijd,hd->bijh", xn, t[f"{name}.weight"])
            for name in ("left_proj", "right_proj", "left_gate", "right_gate", "out_gate")}
    left = proj["left_proj"] * m * sigmoid(proj["left_gate"])
    right = proj["right_proj"] * m * sigmoid(proj["right_gate"])
    o = torch.einsum("bikh,bjkh->bijh", left, right)
    z = layer_norm(o, t["to_out_norm.weight"], t["to_out_norm.bias"]) * sigmoid(proj["out_gate"])
    return torch.einsum("bijh,dh->bijd", z, t["to_out.weight"])


@pytest.mark.parametrize("dist", ["normal", "cauchy"])
@pytest.mark.parametrize("nomask", [True, False])
@pytest.mark.parametrize(("n", "b", "d"), [(8, 1, 128), (12, 2, 64)])
def test_reference_matches_float64(ref, n, b, d, nomask, dist):
    inputs = ref.generate_inputs(_workload(n, b, d, nomask=nomask, dist=dist), seed=7, device="cpu")
    out = ref.reference(inputs)
    expected = _float64_trimul(inputs)
    assert out.shape == (b, n, n, d) and out.dtype == torch.float32
    assert (out.double() - expected).abs().max().item() < 1e-4


def test_reference_restores_tf32_flags(ref):
    inputs = ref.generate_inputs(_workload(8, 1, 32, nomask=True, dist="normal"), seed=1, device="cpu")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    ref.reference(inputs)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved


# --- (b) input generation ----------------------------------------------------------------------


def test_generate_inputs_layout(ref):
    inputs = ref.generate_inputs(_workload(8, 2, 32, nomask=False, dist="normal"), seed=3, device="cpu")
    assert list(inputs) == ["x", "mask", *ref.WEIGHT_NAMES]
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    assert shapes["x"] == (2, 8, 8, 32) and shapes["mask"] == (2, 8, 8)
    assert shapes["left_proj.weight"] == (128, 32) and shapes["to_out.weight"] == (32, 128)
    assert shapes["norm.weight"] == (32,) and shapes["to_out_norm.bias"] == (128,)
    assert all(v.dtype == torch.float32 for v in inputs.values())
    x, mask, weights, config = ref.pack_data(inputs)
    assert x is inputs["x"] and mask is inputs["mask"]
    assert list(weights) == list(ref.WEIGHT_NAMES)
    assert config == {"dim": 32, "hidden_dim": 128}


@pytest.mark.parametrize("dist", ["normal", "cauchy"])
def test_generate_inputs_is_deterministic(ref, dist):
    wl = _workload(8, 1, 32, nomask=False, dist=dist)
    a = ref.generate_inputs(wl, seed=11, device="cpu")
    b = ref.generate_inputs(wl, seed=11, device="cpu")
    c = ref.generate_inputs(wl, seed=12, device="cpu")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["x"], c["x"])
    assert not torch.equal(a["left_proj.weight"], c["left_proj.weight"])


def test_cauchy_inputs_are_heavy_tailed(ref):
    x = ref.generate_inputs(_workload(16, 1, 64, nomask=True, dist="cauchy"), seed=5, device="cpu")["x"]
    # Cauchy(0, 2) has median |x| = 2 and a tail far beyond what a normal sample of this size reaches.
    assert 1.5 < x.abs().median().item() < 2.5
    assert x.abs().max().item() > 100


def test_mask_semantics(ref):
    masked = _workload(16, 2, 32, nomask=False, dist="normal")
    m = ref.generate_inputs(masked, seed=2, device="cpu")["mask"]
    assert set(m.unique().tolist()) == {0.0, 1.0}
    assert 0.3 < m.mean().item() < 0.7

    unmasked = _workload(16, 2, 32, nomask=True, dist="normal")
    assert torch.equal(ref.generate_inputs(unmasked, seed=2, device="cpu")["mask"], torch.ones(2, 16, 16))

    compat = ref.generate_inputs(masked, seed=2, device="cpu", options=frozenset({"gpumode-compat"}))
    assert torch.equal(compat["mask"], torch.ones(2, 16, 16))
    # The option changes the mask only; everything else is drawn identically.
    plain = ref.generate_inputs(masked, seed=2, device="cpu")
    assert all(torch.equal(compat[k], plain[k]) for k in plain if k != "mask")


# --- (c) the solutions pass on the CPU workloads -----------------------------------------------


@pytest.fixture(scope="module")
def cpu_cases(ref, task):
    cases = []
    for wl in task.workloads("tests", device="cpu"):
        inputs = ref.generate_inputs(wl, seed=wl.params["seed"], device="cpu")
        cases.append((wl.name, inputs, ref.reference(inputs)))
    return cases


def _solution_module(name: str) -> ModuleType:
    meta = json.loads((ROOT / "solutions" / name / "solution.json").read_text())
    path = ROOT / "solutions" / name / meta["entry_file"]
    return load_module_file(path, f"trimul_solution_{name}")


@pytest.mark.parametrize("solution", ["baseline", "triton_fused", "triton_seed"])
def test_solution_passes_cpu_tests(ref, task, cpu_cases, solution):
    entry = getattr(_solution_module(solution), task.definition.entry_point)
    for name, inputs, expected in cpu_cases:
        out = entry(ref.pack_data(inputs))
        try:
            _assert_within_tolerance(out, expected)
        except AssertionError as exc:
            raise AssertionError(f"{solution} on {name}: {exc}") from None


# --- (d) every tunable choice of the Triton seeds ------------------------------------------------

SEEDS = ("triton_fused", "triton_seed")
SEED_SOURCES = {name: (ROOT / "solutions" / name / "submission.py").read_text() for name in SEEDS}
SEED_SOURCE = SEED_SOURCES["triton_seed"]
TUNABLES = read_tunables(SEED_SOURCE)


def _launch_option_only(source: str, name: str) -> bool:
    """Whether a tunable is used only as a launch option (num_warps=, num_stages=): Triton's interpreter ignores
    those, so on the CPU its variants run exactly the default's code (the H200 runs them; compile_sm90 checks
    what they ask of a block)."""
    uses = [m.start() for m in re.finditer(rf"\b{name}\b", source)]
    declared = [m.start() for m in re.finditer(rf"^{name} = ", source, re.MULTILINE)]
    return all(u in declared or re.search(r"num_(warps|stages)=$", source[max(0, u - 12):u]) for u in uses)


VARIANTS = [(seed, t.name, choice) for seed in SEEDS for t in read_tunables(SEED_SOURCES[seed]).values()
            if not _launch_option_only(SEED_SOURCES[seed], t.name) for choice in t.choices if choice != t.value]


def test_seed_declares_required_tunables():
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_WARPS", "NUM_STAGES", "DOT_PRECISION"} <= set(TUNABLES)
    assert {"ieee", "tf32"} <= set(TUNABLES["DOT_PRECISION"].choices)
    assert min(min(TUNABLES[k].choices) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")) >= 16


def test_only_launch_options_are_left_out_of_the_interpreters_variants():
    fused = SEED_SOURCES["triton_fused"]
    assert _launch_option_only(fused, "NUM_WARPS") and _launch_option_only(fused, "PROJ_STAGES")
    assert not any(_launch_option_only(fused, n) for n in ("PROJ_BLOCK_M", "O_DTYPE", "OUT_TMA", "ONE_WORKSPACE"))
    assert ("triton_fused", "O_DTYPE", "fp32") in VARIANTS and ("triton_seed", "DOT_PRECISION", "tf32") in VARIANTS


@pytest.fixture(scope="module")
def small_case(ref):
    # N=24 is not a multiple of any block size, so every variant runs its edge masks.
    inputs = ref.generate_inputs(_workload(24, 2, 64, nomask=False, dist="cauchy"), seed=99, device="cpu")
    return inputs, ref.reference(inputs)


@pytest.mark.parametrize(("seed", "name", "value"), VARIANTS, ids=[f"{s}:{n}={v}" for s, n, v in VARIANTS])
def test_every_tunable_choice_passes(ref, small_case, tmp_path, seed, name, value):
    # Triton reads kernel source from the file, so each variant needs a real file of its own.
    path = tmp_path / "submission.py"
    path.write_text(rewrite_tunables(SEED_SOURCES[seed], {name: value}))
    module_name = f"trimul_{seed}_{name}_{value}"
    module = load_module_file(path, module_name)
    try:
        inputs, expected = small_case
        _assert_within_tolerance(module.custom_kernel(ref.pack_data(inputs)), expected)
    finally:
        sys.modules.pop(module_name, None)


# --- (e) workload files and (f) the bundle -----------------------------------------------------

EXPECTED_COUNTS = {"tests": 18, "benchmarks": 7}


@pytest.mark.parametrize("set_name", ["tests", "benchmarks", "tests-cpu", "benchmarks-cpu"])
def test_workload_files(task, set_name):
    workloads = read_workloads(ROOT / task.definition.workload_sets[set_name])
    if set_name in EXPECTED_COUNTS:
        assert len(workloads) == EXPECTED_COUNTS[set_name]
    else:
        assert 3 <= len(workloads) <= 8
        assert max(w.axes["N"] for w in workloads) <= 32
    assert len({w.name for w in workloads}) == len(workloads)
    for w in workloads:
        assert set(w.axes) == {"N", "B", "D", "H"} and w.axes["H"] == 128
        assert w.params["distribution"] in ("normal", "cauchy")
        assert isinstance(w.params["nomask"], bool) and isinstance(w.params["seed"], int)
        mask_word = "nomask" if w.params["nomask"] else "mask"
        n, b, d = w.axes["N"], w.axes["B"], w.axes["D"]
        assert w.name == f"N{n}_B{b}_D{d}_{w.params['distribution']}_{mask_word}_s{w.params['seed']}"


def test_workload_mix():
    tests = read_workloads(ROOT / "workloads" / "tests.jsonl")
    assert sum(w.params["distribution"] == "cauchy" for w in tests) == 7
    assert sum(not w.params["nomask"] for w in tests) == 7
    assert max(w.axes["N"] for w in tests) == 1024 and max(w.axes["D"] for w in tests) == 768


def test_task_bundle_loads(task):
    definition = task.definition
    assert definition.name == "trimul"
    assert definition.interface == "gpumode" and definition.entry_point == "custom_kernel"
    assert definition.tolerance.rule == "gpumode"
    assert math.isclose(definition.tolerance.atol, ATOL) and math.isclose(definition.tolerance.rtol, RTOL)
    assert list(definition.inputs)[:2] == ["x", "mask"] and len(definition.inputs) == 12
    assert list(definition.outputs) == ["output"]
    assert "gpumode-compat" in definition.compat_options
    assert definition.tolerance.relaxed_dtype_option == "gpumode-compat"
    assert task.solution_names() == ["baseline", "triton_fused", "triton_seed"]
    assert task.baseline().language == "python"
    assert task.solution("triton_seed").language == "triton"
    assert task.workload_set_name("tests", "cpu") == "tests-cpu"
    for name in definition.workload_sets:
        assert (task.root / definition.workload_sets[name]).is_file()


def test_task_inputs_match_generated(ref, task):
    inputs = ref.generate_inputs(_workload(8, 1, 32, nomask=False, dist="normal"), seed=0, device="cpu")
    assert list(inputs) == list(task.definition.inputs)
    axes = {"B": 1, "N": 8, "D": 32, "H": 128}
    for name, spec in task.definition.inputs.items():
        assert tuple(inputs[name].shape) == tuple(axes[a] if isinstance(a, str) else a for a in spec.shape)
        assert spec.dtype == "float32"


def test_framework_path_runs_baseline(task):
    # The way the evaluator drives a bundle: Task.generate_inputs -> Task.call -> Task.reference.
    wl = task.workloads("tests", device="cpu")[0]
    inputs = task.generate_inputs(wl, seed=4, device="cpu")
    entry = getattr(_solution_module("baseline"), task.definition.entry_point)
    out = task.normalize_outputs(task.call(entry, inputs))["output"]
    _assert_within_tolerance(out, task.reference(inputs)["output"])
