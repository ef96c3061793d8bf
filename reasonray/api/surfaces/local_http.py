"""The JSON-RPC endpoint of an application in this process, as an ASGI app: `reasonray.AsyncClient` without a server.

    rpc = build_application(settings, llm=SimulatedLLM(), data_dir=None).dispatcher
    async with in_process_client(rpc) as rr:           # the same client and calls as against `make serve`
        print((await rr.execute("What is 17 * 23?"))["answer"])

`POST /rpc` answers as the service's does: single calls and batches, notifications (204), the trace id
in `X-Trace-Id`, and `reasoning.execute` with `stream: true` as Server-Sent Events. Nothing else of the
service is here (no authentication, no HTTP guard, no REST mirrors): it is for notebooks, scripts and
docs examples that want the API without starting Ray, and runs only what the process was given.
"""

from __future__ import annotations

from typing import Any

import httpx
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reasonray.api.jsonrpc import Dispatcher
from reasonray.api.methods import accept_trace_id, new_trace_id
from reasonray.api.surfaces.streaming import rpc_sse, streaming_call
from reasonray.client import AsyncClient

LOCAL_URL = "http://reasonray.local"


def in_process_client(rpc: Dispatcher, **options: Any) -> AsyncClient:
    """A `reasonray.AsyncClient` whose requests go to `rpc` in this process (no socket, no server): an ASGI app
    serving `POST /rpc` over it."""

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        trace_id = accept_trace_id(request.headers.get("x-trace-id"))
        if (call := streaming_call(rpc, body)) is not None:
            trace_id = trace_id or new_trace_id()
            return EventSourceResponse(rpc_sse(rpc, call, trace_id), headers={"X-Trace-Id": trace_id})
        payload, trace_ids = await rpc.handle(body, trace_id)
        headers = {"X-Trace-Id": trace_ids[0]} if len(trace_ids) == 1 else {}
        if payload is None:
            return Response(status_code=204, headers=headers)
        return JSONResponse(payload, headers=headers)

    app = Starlette(routes=[Route("/rpc", endpoint, methods=["POST"])])
    return AsyncClient(LOCAL_URL, transport=httpx.ASGITransport(app=app), **options)
