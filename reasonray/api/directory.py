"""The agent directory's methods: `agent.register`, `agent.get`, `agent.list`, `agent.discover`,
`agent.unregister`, declared once with their params, result and access (`AGENTS`)."""

from __future__ import annotations

from pydantic import Field

from reasonray.api import results
from reasonray.api.a2a_remote import remote_registration
from reasonray.api.access.auth import REMOTE_AGENTS
from reasonray.api.context import Context, NoParams
from reasonray.api.declarations import EVERYONE, REASONERS, Access, Resource
from reasonray.api.jsonrpc import Call, Params, Table, declare
from reasonray.kernel.errors import InvalidParamsError
from reasonray.strategies.agents import AGENT_ID, AgentCard, AgentRegistration

AGENTS: Table = {}


class AgentIdParams(Params):
    agent_id: str = Field(pattern=AGENT_ID, description="The agent's id.")


class DiscoverParams(Params):
    capabilities: list[str] = Field(
        default_factory=list, max_length=64, description="Agents advertising all of these are returned; empty: every agent."
    )


# agent ids a client may take for the server's own (as the reserved workspaces are): an admin's to register,
# nobody else's to claim first
RESERVED_AGENT_IDS = frozenset({"default", "shared", "public", "global", "system", "admin", "reasonray"})


def reserved_agent_ids_for_admins(params: AgentRegistration, sees_all: bool) -> None:
    """With authentication on a card id is its first registrant's: a reserved one is left to admins."""
    if params.id in RESERVED_AGENT_IDS and not sees_all:
        raise InvalidParamsError(
            f"agent id {params.id!r} is reserved (reserved ids: {', '.join(sorted(RESERVED_AGENT_IDS))}); register under another id",
            {"id": params.id, "reserved": sorted(RESERVED_AGENT_IDS)},
        )


REGISTER_ACCESS = Access(
    REASONERS,
    (Resource("agent", "id", "claim"),),
    checks=(reserved_agent_ids_for_admins,),
    # the service would call a remote agent on callers' behalf: an operator's right, not every reasoner's
    right=lambda params: REMOTE_AGENTS if params.a2a_card_url is not None else None,
)


@declare(AGENTS, "agent.register", access=REGISTER_ACCESS)
async def agent_register(ctx: Context, params: AgentRegistration, call: Call) -> results.AgentRegisterResult:
    """Register (or replace) an AgentCard; its strategies must exist and be enabled (a remote A2A agent: its card must be valid)."""
    if params.a2a_card_url is not None:  # a remote agent: its card fetched and validated, its skills advertised
        params = await remote_registration(params, ctx.egress)
    registered = await ctx.registry.register_agent(params, sorted(ctx.methods))
    return results.AgentRegisterResult.of(registered, call.trace_id)


@declare(AGENTS, "agent.get", access=Access(EVERYONE, (Resource("agent", "agent_id"),)))
async def agent_get(ctx: Context, params: AgentIdParams, call: Call) -> results.AgentResult:
    """One registered AgentCard."""
    return results.AgentResult.of((await ctx.registry.get_agent(params.agent_id)).model_dump(), call.trace_id)


def visible(agents: list[AgentCard], call: Call) -> list[AgentCard]:
    """The cards the caller may see (the guard says which: `Call.visible`), every card without a guard."""
    return agents if (seen := call.visible) is None else [a for a in agents if seen.allows(a.id)]


@declare(AGENTS, "agent.list", access=Access(EVERYONE, lists="agent"))
async def agent_list(ctx: Context, params: NoParams, call: Call) -> results.AgentListResult:
    """Every registered AgentCard."""
    return results.AgentListResult.of({"agents": visible(await ctx.registry.list_agents(), call)}, call.trace_id)


@declare(AGENTS, "agent.discover", access=Access(EVERYONE, lists="agent"))
async def agent_discover(ctx: Context, params: DiscoverParams, call: Call) -> results.AgentDiscoverResult:
    """The agents advertising all the given capabilities."""
    agents = visible(await ctx.registry.discover_agents(params.capabilities), call)
    return results.AgentDiscoverResult.of({"capabilities": params.capabilities, "agents": agents}, call.trace_id)


@declare(AGENTS, "agent.unregister", access=Access(REASONERS, (Resource("agent", "agent_id", "drop"),)))
async def agent_unregister(ctx: Context, params: AgentIdParams, call: Call) -> results.AgentUnregisterResult:
    """Remove an AgentCard; requests naming it fail from then on."""
    return results.AgentUnregisterResult.of({"unregistered": await ctx.registry.unregister_agent(params.agent_id)}, call.trace_id)
