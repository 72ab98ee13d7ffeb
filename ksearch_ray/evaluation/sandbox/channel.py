"""Framed, authenticated messages over a socket between the evaluator and a sandboxed worker.

Each frame is a 4-byte big-endian length, a JSON body and an HMAC-SHA256 tag keyed per job.
The key travels inside the job message, never through the environment or argv, so a
candidate that prints or writes a fake verdict to stdout or a file forges nothing; one that
digs the key out of its own process memory could, which is why verdicts never rest on the
worker's word alone (the evaluator recomputes references and statistics itself).

A frame may carry file descriptors (SCM_RIGHTS: the buffers of an output hand-over). They are
queued in arrival order; the frame itself says how many are its own (`take_fds`). At most
MAX_PENDING_FDS may wait at a time: a peer that sends more is forging.
"""

from __future__ import annotations

import array
import collections
import hashlib
import hmac
import json
import os
import select
import socket
import struct
import time
from typing import Any

from pydantic import BaseModel

_HEADER = struct.Struct(">I")
_TAG = 32
MAX_FRAME = 64 * 1024 * 1024
MAX_PENDING_FDS = 8
_FD_SPACE = socket.CMSG_SPACE(MAX_PENDING_FDS * array.array("i").itemsize)


class ChannelClosed(Exception):
    """The peer closed the socket (for a worker: it exited or was killed)."""


class ChannelTimeout(Exception):
    """No complete frame arrived before the deadline."""


class ChannelForgery(Exception):
    """A frame whose tag does not verify: somebody other than the harness wrote it."""


class Channel:
    def __init__(self, sock: socket.socket, key: bytes):
        self.sock = sock
        self.key = key
        self._buf = bytearray()
        self._fds: collections.deque[int] = collections.deque()

    def send(self, message: dict[str, Any] | BaseModel, fds: list[int] | tuple[int, ...] = ()) -> None:
        """Send one frame; `fds` travel with its first byte (the frame must say how many)."""
        if isinstance(message, BaseModel):
            message = message.model_dump(mode="json")
        body = json.dumps(message, separators=(",", ":")).encode()
        tag = hmac.new(self.key, body, hashlib.sha256).digest()
        frame = _HEADER.pack(len(body)) + body + tag
        if fds:
            sent = socket.send_fds(self.sock, [frame], list(fds))
            frame = frame[sent:]
        if frame:
            self.sock.sendall(frame)

    def take_fds(self, count: int) -> list[int]:
        """The next `count` descriptors that arrived (the caller owns them); ChannelForgery if missing."""
        if len(self._fds) < count:
            raise ChannelForgery(f"a frame announced {count} descriptors, {len(self._fds)} arrived")
        return [self._fds.popleft() for _ in range(count)]

    def recv(self, timeout: float | None = None, *, spin: bool = False) -> dict[str, Any]:
        """Next message; raises ChannelTimeout, ChannelClosed or ChannelForgery. `spin`: wait on the CPU
        (polling) rather than asleep, for waits of milliseconds that the next timed call follows."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frame = self._take_frame()
            if frame is not None:
                return frame
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ChannelTimeout()
            if spin:
                if not select.select([self.sock], [], [], 0)[0]:
                    continue
            elif not select.select([self.sock], [], [], remaining)[0]:
                raise ChannelTimeout()
            try:
                chunk, ancillary, flags, _ = self.sock.recvmsg(1 << 20, _FD_SPACE)
            except ConnectionResetError:
                raise ChannelClosed() from None
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                    self._fds.extend(fds)
            if flags & socket.MSG_CTRUNC or len(self._fds) > MAX_PENDING_FDS:
                raise ChannelForgery("more file descriptors than any frame carries")
            if not chunk:
                raise ChannelClosed()
            self._buf += chunk

    def _take_frame(self) -> dict[str, Any] | None:
        if len(self._buf) < _HEADER.size:
            return None
        (length,) = _HEADER.unpack_from(self._buf)
        if length > MAX_FRAME:
            raise ChannelForgery(f"frame of {length} bytes")
        end = _HEADER.size + length + _TAG
        if len(self._buf) < end:
            return None
        body = bytes(self._buf[_HEADER.size : _HEADER.size + length])
        tag = bytes(self._buf[_HEADER.size + length : end])
        del self._buf[:end]
        if not hmac.compare_digest(tag, hmac.new(self.key, body, hashlib.sha256).digest()):
            raise ChannelForgery("bad message tag")
        message: dict[str, Any] = json.loads(body)
        return message

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popleft())
        self.sock.close()
