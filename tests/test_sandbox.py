"""The sandbox worker's trusted prelude: what it sets up before any candidate code runs."""

from __future__ import annotations


def test_a_read_only_flashinfer_cache_is_linked_into_a_workspace_of_the_workers_own(tmp_path, monkeypatch):
    """FlashInfer writes a log into its JIT cache at import; in the sandbox that cache is read-only."""
    import os

    from ksearch_ray.evaluation.sandbox import worker

    shared = tmp_path / "ficache"
    arch = shared / ".cache" / "flashinfer" / "0.7.2" / "90a"
    (arch / "cached_ops" / "gqa").mkdir(parents=True)
    (arch / "flashinfer_jit.log").write_text("old log\n")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(shared))
    monkeypatch.setattr(worker.os, "access", lambda path, mode: False)  # as on the read-only mount
    workdir = tmp_path / "job"
    workdir.mkdir()
    worker._private_flashinfer_workspace(workdir)
    mine = workdir / "flashinfer_workspace" / ".cache" / "flashinfer" / "0.7.2" / "90a"
    assert os.environ["FLASHINFER_WORKSPACE_BASE"] == str(workdir / "flashinfer_workspace")
    assert (mine / "cached_ops").is_symlink() and (mine / "cached_ops" / "gqa").is_dir()
    assert not (mine / "flashinfer_jit.log").exists()  # the worker's own log, written where it may write
    (mine / "flashinfer_jit.log").write_text("new\n")
    assert (arch / "flashinfer_jit.log").read_text() == "old log\n"
