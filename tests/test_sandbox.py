"""The sandbox worker's trusted prelude: what it sets up before any candidate code runs."""

from __future__ import annotations

import os

import pytest

from ksearch_ray.evaluation.sandbox import worker


@pytest.mark.parametrize("arch_level", [("0.7.2", "90a"), ("0.7.2",)], ids=["with-arch", "without-arch"])
def test_a_read_only_flashinfer_cache_is_mirrored_into_a_workspace_of_the_workers_own(tmp_path, monkeypatch, arch_level):
    """FlashInfer writes into its JIT cache at import (a log) and at a module's first use (a lock
    under cached_ops/tmp, generated sources and build.ninja where they differ); in the sandbox that
    cache is read-only. Without a GPU FlashInfer leaves the architecture level out of the path.
    (On the H200 the same is checked for real: experiments/gpu/h200_flashinfer_baselines.sh.)"""
    shared = tmp_path / "ficache"
    arch = shared / ".cache" / "flashinfer" / os.path.join(*arch_level)
    (arch / "cached_ops" / "gqa").mkdir(parents=True)
    (arch / "cached_ops" / "gqa" / "gqa.so").write_text("built")
    (arch / "cached_ops" / "tmp").mkdir()
    (arch / "cached_ops" / "tmp" / "gqa.lock").write_text("")
    (arch / "generated" / "gqa").mkdir(parents=True)
    (arch / "flashinfer_jit.log").write_text("old log\n")
    (shared / ".cache" / "flashinfer" / "cubins").mkdir()
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(shared))
    monkeypatch.setattr(worker.os, "access", lambda path, mode: False)  # as on the read-only mount
    workdir = tmp_path / "job"
    workdir.mkdir()
    worker._private_flashinfer_workspace(workdir)

    assert os.environ["FLASHINFER_WORKSPACE_BASE"] == str(workdir / "flashinfer_workspace")
    mine = workdir / "flashinfer_workspace" / ".cache" / "flashinfer" / os.path.join(*arch_level)
    for real in (mine, mine / "cached_ops", mine / "generated"):
        assert real.is_dir() and not real.is_symlink()
    assert (mine / "cached_ops" / "gqa").is_symlink() and (mine / "generated" / "gqa").is_symlink()
    # FlashInfer resolves the paths it writes into build.ninja: through the links they are the
    # shared ones, so the file it makes matches the one the warm-up left and ninja does nothing.
    assert (mine / "cached_ops" / "gqa" / "gqa.so").resolve() == (arch / "cached_ops" / "gqa" / "gqa.so").resolve()
    assert not (mine / "cached_ops" / "tmp").exists() and not (mine / "flashinfer_jit.log").exists()
    (mine / "cached_ops" / "tmp").mkdir()  # what FlashInfer does first: lock files of the worker's own
    (mine / "cached_ops" / "tmp" / "gqa.lock").write_text("")
    (mine / "flashinfer_jit.log").write_text("new\n")
    (mine / "cached_ops" / "mla").mkdir()  # a module the warm-up did not build is built here
    assert (arch / "flashinfer_jit.log").read_text() == "old log\n"
    assert sorted(p.name for p in (arch / "cached_ops").iterdir()) == ["gqa", "tmp"]
    assert (workdir / "flashinfer_workspace" / ".cache" / "flashinfer" / "cubins").is_dir()  # cubin downloads


def test_a_writable_or_absent_flashinfer_cache_is_left_alone(tmp_path, monkeypatch):
    workdir = tmp_path / "job"
    workdir.mkdir()
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    worker._private_flashinfer_workspace(workdir)  # writable: isolation is off, the cache is used as it is
    assert os.environ["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path) and not (workdir / "flashinfer_workspace").exists()
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE")
    worker._private_flashinfer_workspace(workdir)
    assert "FLASHINFER_WORKSPACE_BASE" not in os.environ
