"""An HTTP endpoint that answers every POST with 200 and what the test set: raw bytes, a JSON body, or (for a
request with `stream: true`) server-sent events. For reading replies no real server sends on demand."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def fixed_endpoint(default: Any = None) -> Iterator[tuple[dict[str, Any], str]]:
    """Yields (answer, base URL); set answer["raw"] (bytes), answer["json"] or answer["events"] (a list of JSON
    chunks). `default` answers a plain request when no JSON is set (a streamed client's own first calls)."""
    answer: dict[str, Any] = {"raw": None, "json": None, "events": None}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            answer["request"] = request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if request.get("stream") and answer["events"] is not None:
                data = ("".join(f"data: {json.dumps(e)}\n\n" for e in answer["events"]) + "data: [DONE]\n\n").encode()
                kind = "text/event-stream"
            elif answer["raw"] is not None:
                data, kind = answer["raw"], "application/json"
            else:
                data, kind = json.dumps(answer["json"] if answer["json"] is not None else default).encode(), "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield answer, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
