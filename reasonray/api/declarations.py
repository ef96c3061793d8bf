"""What a method may touch, declared where it is registered: the roles that may call it, the resources it
names (session, workspace, agent card, task) and how, the strategy it runs and the limits it is charged
against (`reasonray.api.jsonrpc.declare`, which refuses a method without a declaration); the one guard
(`reasonray.api.access.tenancy.Guard`) reads it for every surface and never looks at a method's name.

    @declare(SESSIONS, "session.turn", access=Access(REASONERS, (Resource("session", "session_id", "write"),), limits="run"))
    async def session_turn(ctx: Context, params: TurnParams, call: Call) -> TurnResult: ...

Transport-free and Ray-free.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["session", "workspace", "agent", "task"]
Mode = Literal["read", "write", "claim", "drop"]

# the roles of the default configuration that may call a method ([auth.roles] can grant more or fewer:
# the guard asks the configured policy; a unit test holds these and the defaults together)
EVERYONE: tuple[str, ...] = ("reader", "reasoner", "operator", "admin")
REASONERS: tuple[str, ...] = ("reasoner", "operator", "admin")
OPERATORS: tuple[str, ...] = ("operator", "admin")

RESOLVED = "resolved"  # `Access.strategy`: the strategy is resolved from the params and the agent card


@dataclass(frozen=True)
class Resource:
    """One thing a call names, owned per principal.

    `param` is the dotted path of its id in the params (`session_id`, `memory.workspace`). `mode`: `read`
    (its owner or a reader it is shared with), `write` (its owner), `claim` (its owner; an unowned one
    becomes the caller's), `drop` (its owner; released once the call succeeded). `personal`: an omitted
    workspace is the caller's personal one. `applies` and `claims` refine the mode from the params (a run
    that uses no memory names no workspace; a run that learns writes and claims it)."""

    kind: Kind
    param: str
    mode: Mode = "read"
    personal: bool = False
    applies: Callable[[Any], bool] | None = None
    claims: Callable[[Any], bool] | None = None

    def holder_and_name(self, params: Any) -> tuple[Any, str] | None:
        """The object holding the id and the id's attribute name (None: the params hold no such part)."""
        *path, name = self.param.split(".")
        holder = functools.reduce(lambda held, part: getattr(held, part, None), path, params)
        return (holder, name) if holder is not None and hasattr(holder, name) else None

    def ident(self, params: Any) -> str | None:
        found = self.holder_and_name(params)
        return getattr(found[0], found[1]) if found is not None else None


Check = Callable[[Any, bool], None]
"""A rule on the params of one method, given whether the caller sees every owner's data; raises ForbiddenError."""


@dataclass(frozen=True)
class Access:
    """How a method is admitted.

    `roles`: the default roles that may call it. `resources`: what it names, checked (and where they are
    claimed or dropped, recorded) around the call. `strategy`: `resolved` (from the params and the agent
    card, as reasoning.execute resolves it), a strategy's name (the method always runs that one), or None
    (no run). `limits`: `request` (the caller's request rate) or `run` (also its concurrent runs, and the
    tokens the run used are charged). `creates`: the kind of resource the result names as `<kind>_id`,
    claimed for the caller. A method that runs a strategy acts as the caller's agent when its token binds it
    to one (the params' `agent_id` is set to it). `lists`: the kind of resource the method lists; the guard hands the handler
    what the caller may see (`Call.visible`), so nothing is filtered after the call. `checks`: rules on the
    params the resources cannot say."""

    roles: tuple[str, ...]
    resources: tuple[Resource, ...] = ()
    strategy: str | None = None
    limits: Literal["request", "run"] = "request"
    creates: Kind | None = None
    lists: Kind | None = None
    checks: tuple[Check, ...] = ()
    right: Callable[[Any], str | None] | None = None
    """A further right the params ask for (e.g. `agent.register_remote` for a card URL), checked against the caller's roles."""
    own_usage: bool = False
    """The caller sees its own activity only: the guard hands a non-admin handler its usage (`Call.usage`)."""

    def target(self, params: Any) -> str | None:
        """What the call names, for the audit log: `<kind>:<id>` of its first resource that is named."""
        for resource in self.resources:
            if (ident := resource.ident(params)) is not None:
                return f"{resource.kind}:{ident}"
        agent_id = getattr(params, "agent_id", None)  # a run as an agent names that agent
        return f"agent:{agent_id}" if agent_id else None


@dataclass(frozen=True)
class Visible:
    """What a caller may see of one kind of resource: those it owns or that are shared with it, and those
    nobody owns (agent cards of the server's agents file); `default` is its personal workspace."""

    readable: frozenset[str]
    owned: frozenset[str] = frozenset()
    default: str | None = None
    unowned: bool = True  # whether those nobody owns are visible (cards of the agents file: yes; workspaces: no)

    def allows(self, ident: str) -> bool:
        return ident in self.readable or (self.unowned and ident not in self.owned)
