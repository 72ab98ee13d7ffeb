"""Framed, authenticated messages over a socket between the evaluator and a sandboxed worker.

Each frame is a 4-byte big-endian length, a JSON body and an HMAC-SHA256 tag keyed per job.
The key travels inside the job message, never through the environment or argv, so a
candidate that prints or writes a fake verdict to stdout or a file forges nothing; one that
digs the key out of its own process memory could, which is why verdicts never rest on the
worker's word alone (the evaluator recomputes references and statistics itself).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import select
import socket
import struct
import time
from typing import Any

_HEADER = struct.Struct(">I")
_TAG = 32
MAX_FRAME = 64 * 1024 * 1024


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

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, separators=(",", ":")).encode()
        tag = hmac.new(self.key, body, hashlib.sha256).digest()
        self.sock.sendall(_HEADER.pack(len(body)) + body + tag)

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """Next message; raises ChannelTimeout, ChannelClosed or ChannelForgery."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frame = self._take_frame()
            if frame is not None:
                return frame
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ChannelTimeout()
            ready, _, _ = select.select([self.sock], [], [], remaining)
            if not ready:
                raise ChannelTimeout()
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                raise ChannelClosed() from None
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
        return json.loads(body)

    def close(self) -> None:
        self.sock.close()
