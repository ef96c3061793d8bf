"""The local HTTP servers tests and benchmarks stand up (an OTLP receiver, a recording proxy): a threading server on
a free loopback port, served from a daemon thread."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class BackgroundHTTP:
    """Mixin: `_serve(Handler)` builds `self.server`; start() serves it from a daemon thread and returns the object,
    stop() shuts it down and frees the port."""

    server: ThreadingHTTPServer

    def _serve(self, handler: type[BaseHTTPRequestHandler], name: str | None = None) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True  # a handler still running never holds the process open
        self._thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
