"""The Triton seeds compile for Hopper (sm_90) on this CPU machine: experiments/compile_sm90.py builds
every kernel a call launches with Triton's CUDA backend, launches nothing, and refuses what the GPU
would refuse before a kernel runs. Triton's interpreter, which the other CPU tests use, accepts code
the compiler refuses; these tests catch that before device time is spent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "experiments" / "compile_sm90.py"
BRANCH_TYPES = ROOT / "tests" / "data" / "candidates" / "trimul_branch_types.py"
INTERPRETER_SWITCH = ROOT / "tests" / "data" / "candidates" / "trimul_interpreter_switch.py"


def _compile(*args: str) -> tuple[int, list[dict], str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(TOOL), "--json", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    rows = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else []
    if not rows:  # Triton's driver interface moved (the tool's stand-in driver needs updating), or worse
        pytest.fail(f"the sm_90 compile check produced nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode, rows, proc.stderr


@pytest.mark.parametrize(("settings", "kernels"), [
    ((), {"_layernorm_kernel", "_project_kernel", "_contract_tma_kernel", "_output_kernel"}),
    (("--set", "PROJ_TMA=False", "--set", "CONTRACT_TMA=False", "--set", "OUT_TMA=False", "--set", "O_DTYPE=fp32"),
     {"_layernorm_kernel", "_project_kernel", "_contract_kernel", "_output_kernel"}),
], ids=["defaults", "pointer-paths-fp32-O"])
def test_the_trimul_seed_compiles_for_sm90_within_the_shared_memory_limit(settings, kernels):
    rc, rows, err = _compile("--task", "trimul", "--solution", "triton_fused", *settings)
    assert rc == 0, f"{rows}\n{err[-2000:]}"
    assert {r["kernel"] for r in rows} == kernels
    for r in rows:
        assert "error" not in r and 0 < r["reg"] <= 255 and r["shared"] <= 232448, r


def test_a_kernel_the_interpreter_runs_but_the_compiler_refuses_is_reported(monkeypatch):
    # The interpreter runs it and gets the right answer ...
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    probe = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import trimul_branch_types as m; "
             "x = torch.randn(1, 8, 8, 16); print(torch.equal(m.custom_kernel((x, None, None, None)), x))")
    ran = subprocess.run([sys.executable, "-c", probe, str(BRANCH_TYPES.parent)], capture_output=True, text=True,
                         timeout=120)
    assert ran.stdout.strip() == "True", ran.stderr[-2000:]
    monkeypatch.delenv("TRITON_INTERPRET")
    # ... and the sm_90 compile says why it would not build on the GPU.
    rc, rows, _ = _compile("--task", "trimul", "--solution", str(BRANCH_TYPES))
    assert rc == 1
    assert rows[-1]["kernel"] == "_copy_kernel" and "Mismatched type for dst" in rows[-1]["error"]


def test_a_configuration_beyond_the_shared_memory_of_a_block_is_refused():
    rc, rows, _ = _compile("--task", "trimul", "--solution", "triton_fused",
                           "--set", "BLOCK_N=256", "--set", "BLOCK_K=128", "--set", "NUM_STAGES=5")
    assert rc == 1
    [failed] = [r for r in rows if "error" in r]
    assert failed["kernel"] == "_contract_tma_kernel" and failed["shared"] > 232448
    assert "shared memory" in failed["error"]


def test_the_gpu_path_is_compiled_not_the_interpreters():
    # The kernel refuses to compile with INTERPRET or EMULATE on, which is what a call on CPU tensors passes.
    rc, rows, err = _compile("--task", "trimul", "--solution", str(INTERPRETER_SWITCH))
    assert rc == 0, f"{rows}\n{err[-2000:]}"
    assert [r["kernel"] for r in rows] == ["_copy_kernel"] and "error" not in rows[0]


def test_dump_writes_each_launchs_gpu_ir_and_ptx_for_sm90(tmp_path):
    rc, rows, err = _compile("--task", "trimul", "--solution", str(INTERPRETER_SWITCH), "--dump", str(tmp_path / "ir"))
    assert rc == 0, f"{rows}\n{err[-2000:]}"
    assert sorted(f.name for f in (tmp_path / "ir").iterdir()) == ["1-_copy_kernel.ptx", "1-_copy_kernel.ttgir"]
    assert ".target sm_90" in (tmp_path / "ir" / "1-_copy_kernel.ptx").read_text()
    assert "ttg." in (tmp_path / "ir" / "1-_copy_kernel.ttgir").read_text()  # Triton's GPU dialect


@pytest.mark.parametrize(("task", "solution"), [
    ("gqa_paged_decode_h32_kv4_d128_ps1", "triton_seed"), ("gqa_paged_decode_h32_kv4_d128_ps1", "triton_splitkv"),
    ("mla_paged_decode_h16_ckv512_kpe64_ps1", "triton_seed"), ("mla_paged_decode_h16_ckv512_kpe64_ps1", "triton_splitkv"),
    ("mla_paged_prefill_causal_h16_ckv512_kpe64_ps1", "triton_seed"),
    ("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "triton_grouped")])
def test_the_flashinfer_triton_seeds_compile_for_sm90(task, solution):
    rc, rows, err = _compile("--task", task, "--solution", solution)
    assert rc == 0, f"{rows}\n{err[-2000:]}"
    assert all("error" not in r and r["shared"] <= 232448 for r in rows), rows


def test_a_calls_kernels_are_compiled_again_one_after_another_and_in_threads():
    """experiments/triton_builds.py threads (issue 40: may a build compile its kernels in parallel?): the seed's
    four kernels, recorded from one call, compiled twice more from a fresh cache, once per thread count."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "triton_builds.py"), "threads", "--task", "trimul",
                           "--solution", "triton_fused", "--threads", "2", "--repeats", "1"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "triton_fused: 4 launches of 4 kernels in one call", proc.stdout
    timings = [line.split() for line in lines[1:]]
    assert [t[0] for t in timings] == ["1", "2"] and all(float(t[2]) > 0.05 for t in timings), proc.stdout
