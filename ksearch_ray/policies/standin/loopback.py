"""An HTTP server on 127.0.0.1 in a thread of its own: the lifecycle the stand-in, the wire-habit
proxies and the tests' scripted servers share (start, stop, `with`, the port and the API base)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class LoopbackServer:
    """A subclass builds its handler class and calls `_listen(handler, port, name)` in __init__."""

    _closing: threading.Event  # set on stop, so that slow replies stop sleeping and the server closes promptly

    def _listen(self, handler: type[BaseHTTPRequestHandler], port: int = 0, name: str = "loopback",
                poll_s: float = 0.05) -> None:
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, and tests stop many servers.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": poll_s},
                                        name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
