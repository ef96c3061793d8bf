"""A remote A2A agent that never answers, on 127.0.0.1 (what an attacker registers to hold the service's
outbound calls): its card answers, its endpoint takes the message and holds the connection until the caller
closes it. `open` counts the connections held now, `holding` names what each was sent."""

from __future__ import annotations

import asyncio
import json
import re
import threading

CARD_PATH = "/.well-known/agent-card.json"


class Tarpit:
    """A remote A2A agent on 127.0.0.1: its card answers, its endpoint takes the message and never replies."""

    def __init__(self) -> None:
        self.open = 0
        self.connections = 0
        self.holding: dict[int, str] = {}  # the held connections: what each was sent (the report names a leak)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def card(self) -> bytes:
        return json.dumps(
            {
                "name": "tarpit",
                "description": "never answers",
                "version": "1",
                "supportedInterfaces": [
                    {"url": f"http://127.0.0.1:{self.port}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
                ],
                "capabilities": {},
                "defaultInputModes": ["text/plain"],
                "defaultOutputModes": ["text/plain"],
                "skills": [{"id": "anything", "name": "anything", "description": "d", "tags": ["t"]}],
            }
        ).encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        try:
            while True:  # keep-alive: several requests may come on one connection
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = next((int(v) for k, _, v in (f.partition(":") for f in head.split("\r\n")) if k.lower() == "content-length"), 0)
                body = await reader.readexactly(length) if length else b""
                if not head.startswith(f"GET {CARD_PATH}"):
                    held = re.search(rb"hold \d+", body)
                    self.holding[id(writer)] = held.group().decode() if held else head.split("\r\n", 1)[0]
                    await reader.read()  # the tarpit: hold on until the caller closes
                    return
                body = self.card()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            self.holding.pop(id(writer), None)
            writer.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
