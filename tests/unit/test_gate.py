"""The gate in front of every authenticated route (`AuthGate`): a route runs as its verified caller, with a cache
scope of its own, and both are gone once the request ends; a request without a token never reaches the route."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Policy, Principal, TokenVerifier, mint_token
from reasonray.api.surfaces.gate import AuthGate, GateConfig
from reasonray.gateway.cache import CACHE_SCOPE
from reasonray.kernel.config import Settings

SECRET = "gate-secret-" + "x" * 32


def gated_app(seen: list[tuple[str | None, str | None]], admitted: list[str]) -> Starlette:
    async def route(request: Request) -> JSONResponse:
        principal = CURRENT_PRINCIPAL.get()
        seen.append((principal.sub if principal is not None else None, CACHE_SCOPE.get()))
        return JSONResponse({"jsonrpc": "2.0", "result": "ok", "id": 1})

    async def admit(principal: Principal) -> None:
        admitted.append(principal.sub)

    auth = Settings(auth={"jwt_secret": SECRET}).auth
    app = Starlette(routes=[Route("/rpc", route, methods=["POST"])])
    app.add_middleware(AuthGate)
    app.state.gate = GateConfig(TokenVerifier(auth), Policy(auth), admit)
    return app


async def call(app: Starlette, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        return await client.post("/rpc", json={"jsonrpc": "2.0", "method": "reasoning.strategies", "id": 1}, headers=headers)


async def test_a_route_runs_as_its_caller_with_the_callers_cache_scope_and_both_end_with_the_request():
    seen: list[tuple[str | None, str | None]] = []
    admitted: list[str] = []
    app = gated_app(seen, admitted)
    token = mint_token(SECRET, "alice", ["reasoner"], 600)
    scope_before = CACHE_SCOPE.get()

    answer = await call(app, {"Authorization": f"Bearer {token}"})

    assert answer.status_code == 200
    assert seen == [("alice", "alice")]
    assert admitted == ["alice"]  # one request counted against the caller's limits
    assert CURRENT_PRINCIPAL.get() is None and CACHE_SCOPE.get() == scope_before


async def test_a_request_without_a_token_is_refused_in_json_rpc_shape_before_the_route():
    seen: list[tuple[str | None, str | None]] = []
    admitted: list[str] = []
    answer = await call(gated_app(seen, admitted), {})

    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == -32016 and answer.json()["id"] is None  # unauthenticated
    assert answer.headers["WWW-Authenticate"].startswith('Bearer realm="reasonray", error="invalid_token"')
    assert seen == [] and admitted == []
