"""The front door of every authenticated route: the bearer token, the caller's request limit, the metrics right.

`AuthGate` is ASGI middleware, so every route is covered, mounted ones (MCP, A2A) and routes added later
included; only `PUBLIC_PATHS` are open. It is configured through the application object
(`app.state.gate`, a `GateConfig`); an application without one has authentication off.

Every authenticated request is one request against its caller's `requests_per_minute`, whatever the route:
`GET /metrics`, `GET /openapi.json`, MCP's `tools/list` and A2A's task listing count like a JSON-RPC call.
The gate counts it before the route runs; the method guard then takes the first method call of the same
HTTP request as already counted (`HTTP_ADMISSION`), so a call is never counted twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Policy, Principal, TokenVerifier
from reasonray.api.access.tenancy import HTTP_ADMISSION
from reasonray.api.errors import error_headers, openai_error, view_of
from reasonray.api.jsonrpc import error_for, error_response
from reasonray.api.methods import accept_trace_id, new_trace_id
from reasonray.api.surfaces.guard import app_path
from reasonray.gateway.cache import CACHE_SCOPE
from reasonray.kernel.errors import ForbiddenError, RateLimitedError, ReasonRayError, UnauthenticatedError
from reasonray.stores.audit import AuditLog, NoAudit, audit_refusal

PUBLIC_PATHS = frozenset({"/healthz", "/health", "/.well-known/agent-card.json"})
"""The only routes that answer without a bearer token."""
JSONRPC_PATHS = frozenset({"/rpc", "/mcp"})  # refused with a JSON-RPC error response (MCP is JSON-RPC too)
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/models"})  # refused in OpenAI's error shape
METRICS_PATH = "/metrics"
METRICS_RIGHT = "metrics.scrape"
"""The right `GET /metrics` needs: the whole service's activity is for operators (roles granting `*`) and for
a scrape role granting only this name (`[auth.roles.scrape] methods = ["metrics.scrape"]`), not every principal."""


@dataclass
class GateConfig:
    """What the gate needs when authentication is on."""

    verifier: TokenVerifier
    policy: Policy
    admit: Callable[[Principal], Awaitable[None]]
    """Counts one request against the caller's limits; raises RateLimitedError when they are used up."""
    audit: AuditLog = field(default_factory=NoAudit)


class AuthGate:
    """ASGI middleware in front of every route: verifies the bearer token, runs the request as its caller
    (CURRENT_PRINCIPAL) and counts the request against the caller's limits."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        config: GateConfig | None = getattr(getattr(scope.get("app"), "state", None), "gate", None)
        path = app_path(scope)
        if scope["type"] != "http" or config is None or path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        trace_id = accept_trace_id(headers.get("x-trace-id")) or new_trace_id()
        principal: Principal | None = None
        try:
            principal = config.verifier.verify(headers.get("authorization"))
            if not config.policy.known(principal):
                # a valid signature with no role this server knows (a token minted for another service, a
                # role since removed): it gets what an anonymous caller gets, not the docs, metrics or MCP
                raise ForbiddenError(
                    f"forbidden: roles {list(principal.roles)} are not configured on this server; "
                    "only the public routes (/healthz) answer (docs/security.md#roles)"
                )
            if path == METRICS_PATH and not config.policy.may_call(principal, METRICS_RIGHT):
                raise ForbiddenError(
                    f"forbidden: roles {list(principal.roles)} may not read {METRICS_PATH} (the whole service's activity); "
                    f"it needs an operator role or one granting {METRICS_RIGHT!r} (docs/security.md#metrics)",
                    {"method": METRICS_RIGHT},
                )
            await config.admit(principal)
        except (UnauthenticatedError, ForbiddenError, RateLimitedError) as exc:
            await audit_refusal(
                config.audit,
                method=f"{scope['method']} {path}",
                outcome=exc.error_type,
                reason=exc.message,
                trace_id=trace_id,
                principal=principal.sub if principal is not None else None,
            )
            await refusal(exc, path, trace_id)(scope, receive, send)
            return
        # the request runs as `principal`, with a cache scope of its own: its cache hits tell nothing of another's prompts
        as_caller, cache_scope, admission = CURRENT_PRINCIPAL.set(principal), CACHE_SCOPE.set(principal.sub), HTTP_ADMISSION.set([True])
        try:
            await self.app(scope, receive, send)
        finally:
            HTTP_ADMISSION.reset(admission)
            CACHE_SCOPE.reset(cache_scope)
            CURRENT_PRINCIPAL.reset(as_caller)


def refusal(exc: ReasonRayError, path: str, trace_id: str) -> JSONResponse:
    """A refusal at the gate in the shape of the route's protocol, with the HTTP status of the one error table."""
    error = error_for(exc)
    error.data["trace_id"] = trace_id
    body = error.body()
    payload: Mapping[str, Any] = {"error": body}
    if path in JSONRPC_PATHS:
        payload = error_response(None, error)
    elif path in OPENAI_PATHS or path.startswith("/v1/models/"):
        payload = openai_error(body)[1]
    headers = {"X-Trace-Id": trace_id, **error_headers(body)}
    if isinstance(exc, (UnauthenticatedError, ForbiddenError)):
        kind = "invalid_token" if isinstance(exc, UnauthenticatedError) else "insufficient_scope"
        headers["WWW-Authenticate"] = f'Bearer realm="reasonray", error="{kind}", error_description="' + exc.message.replace('"', "'") + '"'
    return JSONResponse(payload, status_code=view_of(body["code"]).http_status, headers=headers)
