"""Remote A2A agents in the agent directory (docs/interop.md): registered by the URL of their A2A card,
reached with the official a2a-sdk client.

- `remote_registration`: at `agent.register`, a card carrying `a2a_card_url` is a remote agent. Its A2A
  card is fetched and validated with the SDK's card resolver (it must offer a JSON-RPC interface and at
  least one skill); its skills are advertised as capabilities `a2a.skill.<id>`, so `agent.discover` finds
  it by them. A remote agent advertises no local strategies.
- Every connection passes the egress policy (`reasonray.api.access.egress`, `[egress]`): allowed host:port only, no
  internal address unless named, bounded in time and in calls in flight per caller and per destination.
- `forward`: `reasoning.execute` naming a remote agent (`agent_id`, also from an A2A message's metadata)
  sends the query to that agent as one A2A message (the request's `strategy`, else the agent's default,
  as the skill in the message metadata) and answers with its reply, in the shape of a local run's result.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any
from urllib.parse import urlsplit

import httpx
import structlog
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import AgentCard as A2ACard
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
from a2a.utils.errors import A2AError
from google.protobuf import json_format
from pydantic import ValidationError

from reasonray.api.access.auth import CURRENT_PRINCIPAL
from reasonray.api.access.egress import Egress
from reasonray.api.service import ExecuteResult
from reasonray.kernel.errors import InvalidParamsError, ReasonRayError
from reasonray.stores.audit import ANONYMOUS
from reasonray.strategies.agents import REMOTE_SKILL, STRATEGY_CAPABILITY, AgentRegistration, remote_strategy
from reasonray.strategies.base import ReasoningMetrics
from reasonray.strategies.registry import Resolution

log = structlog.get_logger(__name__)

SLOT_MARGIN_S = 10.0
"""How much longer than its call the cluster keeps an outbound slot a replica took (freed at once when the call ends;
this bounds only a slot whose replica died holding it)."""


class RemoteAgentError(ReasonRayError):
    """A remote A2A agent could not be reached, or did not complete the task (the provider code: -32013)."""

    code, http_status, error_type = -32013, 502, "remote_agent_failed"


def _slot(egress: Egress, url: str, call_s: float) -> AbstractAsyncContextManager[None]:
    """One of the caller's and one of the destination's outbound slots, for a call of `call_s` seconds to `url`."""
    host, port = egress.policy.check_url(url)
    principal = CURRENT_PRINCIPAL.get()
    return egress.gate.slot(f"{host}:{port}", principal.sub if principal is not None else ANONYMOUS, call_s + SLOT_MARGIN_S)


async def fetch_card(url: str, egress: Egress, http: httpx.AsyncClient | None = None) -> A2ACard:
    """The A2A card at `url` (whose egress slot the caller holds: `_slot` checked the URL), validated by the SDK's
    resolver; InvalidParamsError when no usable card came back (without saying what answered)."""
    parts = urlsplit(url)
    base, path = f"{parts.scheme}://{parts.netloc}", parts.path + (f"?{parts.query}" if parts.query else "")
    timeout_s = egress.settings.card_timeout_s
    try:
        # a client of the caller's stays open; one of our own is closed here
        async with asyncio.timeout(timeout_s), nullcontext(http) if http is not None else egress.client(timeout_s) as client:
            card = await A2ACardResolver(client, base, agent_card_path=path).get_agent_card()
    except (A2AError, httpx.HTTPError, ValidationError, ValueError, TimeoutError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    else:
        lacks = {
            "no JSONRPC interface": not any(i.protocol_binding == "JSONRPC" for i in card.supported_interfaces),
            "no skills": not card.skills,
        }
        if not (problem := "; ".join(k for k, missing in lacks.items() if missing)):
            return card
    # the caller learns that no usable card came, not why: a closed port, a timeout, a status, a page
    # that is not a card would otherwise tell it what listens where (the operator's log has it)
    log.warning("agent.card_unusable", url=url, error=problem[:500])
    raise InvalidParamsError(
        f"a2a_card_url {url!r}: no valid A2A agent card could be fetched there within {timeout_s:g} s "
        "(one offering a JSONRPC interface and at least one skill); give the URL of a running agent's card "
        "(…/.well-known/agent-card.json)",
        {"a2a_card_url": url},
    )


async def remote_registration(registration: AgentRegistration, egress: Egress, http: httpx.AsyncClient | None = None) -> AgentRegistration:
    """A remote agent's registration with its card's skills as `a2a.skill.<id>` capabilities (kept with the
    caller's free-form labels); the description defaults to the card's."""
    assert registration.a2a_card_url is not None
    if wrong := [c for c in registration.capabilities if c.startswith(STRATEGY_CAPABILITY)]:
        raise InvalidParamsError(
            f"agent {registration.id!r} is a remote A2A agent: it advertises its card's skills, not local strategies ({wrong}); "
            "drop the reasoning.strategy.* capabilities",
            {"capabilities": wrong},
        )
    async with _slot(egress, registration.a2a_card_url, egress.settings.card_timeout_s):
        card = await fetch_card(registration.a2a_card_url, egress, http)
    skills = [REMOTE_SKILL + s.id for s in card.skills]
    labels = [c for c in registration.capabilities if not c.startswith(REMOTE_SKILL)]
    log.info("agent.remote_card", agent_id=registration.id, url=registration.a2a_card_url, skills=[s.id for s in card.skills])
    return registration.model_copy(
        update={"capabilities": list(dict.fromkeys([*skills, *labels])), "description": registration.description or card.description[:2000]}
    )


async def forward(
    agent: dict[str, Any],
    query: str,
    skill: str | None,
    trace_id: str,
    egress: Egress,
    *,
    deadline_s: float | None = None,
    http: httpx.AsyncClient | None = None,
) -> ExecuteResult:
    """Send `query` to the remote agent `agent` (a registered card) as one A2A message; its answer as a
    `reasoning.execute` result (`strategy_used` is `a2a:<agent id>`; token counts are the remote's business: 0).

    The call holds one of the caller's and one of the destination's outbound slots, ends by the
    earlier of `[egress] call_timeout_s` and the request's `deadline_s`, and is cancelled with the
    request (a caller that goes away leaves no connection behind)."""
    skill = skill or agent.get("default_strategy")
    started = time.perf_counter()
    limit_s = min(d for d in (egress.settings.call_timeout_s, deadline_s) if d is not None)
    failure: str | None = None
    try:
        async with _slot(egress, agent["a2a_card_url"], limit_s), asyncio.timeout(limit_s):
            connection = http or egress.client(limit_s)
            try:
                card = await fetch_card(agent["a2a_card_url"], egress, connection)
                client = await create_client(card, ClientConfig(httpx_client=connection, streaming=False))
                message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=query)])
                message.metadata.update({"traceId": trace_id, **({"skill": skill} if skill else {})})
                replies = [r async for r in client.send_message(SendMessageRequest(message=message))]
            finally:
                if http is None:
                    # shielded: the request can be cancelled twice when its caller leaves (Serve's watch and the front
                    # door's), and a second cancel in the middle of the close left the remote's connection open
                    await asyncio.shield(connection.aclose())
    except TimeoutError:
        failure = f"did not answer within {limit_s:g} s ([egress] call_timeout_s or budget.deadline_s)"
    except InvalidParamsError:
        failure = "is unreachable: its card could not be fetched"
    except (A2AError, A2AClientError, httpx.HTTPError) as exc:
        log.warning("agent.remote_failed", agent_id=agent["id"], trace_id=trace_id, error=f"{type(exc).__name__}: {exc}"[:500])
        failure = "gave no usable answer (the server log has the detail)"
    if failure is not None:  # raised outside the handlers: the caller sees no chained transport error
        raise RemoteAgentError(f"remote agent {agent['id']!r} {failure}", {"agent_id": agent["id"]})
    answer, remote = _answer(agent["id"], replies)
    used = remote_strategy(agent["id"])
    return ExecuteResult(
        answer=answer,
        strategy_used=used,
        metrics=ReasoningMetrics(
            **dict.fromkeys(("total_tokens", "prompt_tokens", "completion_tokens", "llm_calls", "cache_hits", "retries"), 0),
            execution_time_ms=round((time.perf_counter() - started) * 1000),
            model=f"a2a:{agent['id']}",
            simulated=False,
            strategy_specific={"remote": remote},
        ),
        trace_id=trace_id,
        resolution=Resolution(strategy=used, agent_id=agent["id"], strategy_decided_by="agent", config={}, config_sources={}),
    )


def _answer(agent_id: str, replies: list[Any]) -> tuple[str, dict[str, Any]]:
    """The text of the remote's reply (a completed task's artifacts, or a message) and where it came from."""
    for reply in reversed(replies):
        if reply.HasField("task"):
            task = reply.task
            remote = {"agent_id": agent_id, "task_id": task.id, "context_id": task.context_id, "state": TaskState.Name(task.status.state)}
            if task.status.state != TaskState.TASK_STATE_COMPLETED:
                why = " ".join(p.text for p in task.status.message.parts if p.text) or TaskState.Name(task.status.state)
                raise RemoteAgentError(
                    f"remote agent {agent_id!r} did not complete the task: {why[:500]}", {"agent_id": agent_id, "remote": remote}
                )
            return "\n".join(p.text for a in task.artifacts for p in a.parts if p.text), remote
        if reply.HasField("message"):
            remote = {"agent_id": agent_id, **json_format.MessageToDict(reply.message)}
            return "\n".join(p.text for p in reply.message.parts if p.text), remote
    raise RemoteAgentError(f"remote agent {agent_id!r} sent no answer", {"agent_id": agent_id})
