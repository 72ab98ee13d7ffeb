"""Outputs from the worker to the judge: the hand-over buffers, the descriptors on the channel, the typed protocol.

In process, no sandbox: these are the properties the evaluator relies on when it reads what a
hostile worker handed over (the buffer cannot change after it is handed over, and nothing outside
it is read), and the frames it refuses.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import socket

import pytest
import torch

from ksearch_ray.evaluation.sandbox.channel import Channel, ChannelForgery
from ksearch_ray.evaluation.sandbox.handover import Exporter, HandoverError, Importer
from ksearch_ray.evaluation.sandbox.protocol import Fail, Handover, ProtocolError, TensorMeta, parse_report
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import Status


def outputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"y": torch.randn(3, 5, generator=g), "idx": torch.arange(7, dtype=torch.int64),
            "half": torch.randn(4, generator=g).to(torch.bfloat16)}


def test_a_sealed_memory_file_carries_the_outputs_bit_for_bit_without_a_copy():
    sent = outputs()
    handover, fds = Exporter("cpu").export(sent)
    assert handover.transport == "memfd" and len(fds) == 1
    got = Importer("cpu").take(handover, fds)
    assert set(got) == set(sent)
    for name, t in sent.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)


def test_nobody_can_change_a_handed_over_buffer():
    handover, (fd,) = Exporter("cpu").export(outputs())
    try:
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"\0" * 8, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, handover.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # F_SEAL_SEAL: the seals themselves are final
    finally:
        os.close(fd)


def _memfd(data: bytes, seal: bool) -> int:
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    return fd


def _claim(size: int, meta: TensorMeta) -> Handover:
    return Handover(transport="memfd", buffer=1, size=size, fds=1, tensors=[meta])


@pytest.mark.parametrize(("seal", "size", "meta", "fragment"), [
    (False, 64, TensorMeta(name="y", dtype="float32", shape=[16], offset=0, nbytes=64), "not sealed"),
    (True, 128, TensorMeta(name="y", dtype="float32", shape=[16], offset=0, nbytes=64), "holds 64 bytes"),
    (True, 64, TensorMeta(name="y", dtype="float32", shape=[16], offset=32, nbytes=64), "outside"),
    (True, 64, TensorMeta(name="y", dtype="float32", shape=[8], offset=0, nbytes=64), "do not hold"),
    (True, 64, TensorMeta(name="y", dtype="object", shape=[8], offset=0, nbytes=64), "unknown dtype"),
])
def test_a_hand_over_that_claims_more_than_its_buffer_holds_is_refused(seal, size, meta, fragment):
    fd = _memfd(b"\1" * 64, seal)
    with pytest.raises(HandoverError, match=fragment):
        Importer("cpu").take(_claim(size, meta), [fd])
    with pytest.raises(OSError) as closed:
        os.fstat(fd)  # the importer owns what it was handed, refused or not
    assert closed.value.errno == errno.EBADF


def test_a_descriptor_that_is_no_memory_file_is_refused():
    r, w = os.pipe()
    os.close(w)
    meta = TensorMeta(name="y", dtype="uint8", shape=[0], offset=0, nbytes=0)
    with pytest.raises(HandoverError, match="not a memory file"):
        Importer("cpu").take(_claim(0, meta), [r])


def test_descriptors_travel_with_their_frame_and_a_flood_of_them_is_forgery():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender, receiver = Channel(a, b"k" * 32), Channel(b, b"k" * 32)
    try:
        fd = _memfd(b"abc", seal=True)
        sender.send({"type": "x", "fds": 1}, [fd])
        os.close(fd)
        assert receiver.recv(5) == {"type": "x", "fds": 1}
        (got,) = receiver.take_fds(1)
        assert os.pread(got, 3, 0) == b"abc"
        os.close(got)
        with pytest.raises(ChannelForgery):
            receiver.take_fds(1)  # a frame that announces a descriptor it did not bring
        many = [os.open(os.devnull, os.O_RDONLY) for _ in range(9)]
        sender.send({"type": "y"}, many)
        for fd in many:
            os.close(fd)
        with pytest.raises(ChannelForgery, match="descriptors"):
            receiver.recv(5)
    finally:
        sender.close()
        receiver.close()


def test_the_evaluator_parses_reports_into_typed_messages_and_refuses_the_rest():
    fail = parse_report({"type": "fail", "status": "TIMEOUT", "message": "m"})
    assert isinstance(fail, Fail) and fail.status is Status.TIMEOUT
    for bad in ({"type": "fail", "status": "PASSED!", "message": "m"}, {"type": "verdict", "status": "PASSED"},
                {"type": "output", "index": 0, "file": "/tmp/x.pt", "sha256": "0"}, {"no": "type"}, [1, 2]):
        with pytest.raises(ProtocolError):
            parse_report(bad)


def test_settings_refuse_unknown_fields_and_state_their_rule():
    with pytest.raises(ValueError, match="idel"):
        Limits.model_validate({"idel": 3})
    with pytest.raises(ValueError):
        TimingPolicy.model_validate({"max_calls": 0})
    rule = TimingPolicy().rule("cuda", "fresh")
    assert "CUDA graph" in rule and "0.10%" in rule and "fresh inputs" in rule
    assert TimingPolicy.for_device("cpu").max_calls == 20
