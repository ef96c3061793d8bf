"""Tenancy: who owns which session, agent card and memory workspace, and the guard every method call passes.

The guard (built by `build_guard`, installed on the dispatcher with `install_guard`) runs around each
call and reads only the method's declared `Access` (`reasonray.api.declarations`): the caller must be
authenticated (`CURRENT_PRINCIPAL`), its roles must allow the method and the strategy, the session /
card / workspace it names must be its own (or shared with it, for reads), its rate limits and token
budgets must have room; a method that lists resources is handed what the caller may see; then the
call runs, the tokens it used are charged, what it created is claimed, what it removed is released,
and the call is audited. Another principal's resource and a resource that does not exist get the same
ForbiddenError.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Policy, Principal
from reasonray.api.access.limits import Decision, KeyedLimits, Limits, limited, refusal_error
from reasonray.api.declarations import REASONERS, RESOLVED, Access, Resource, Visible
from reasonray.api.jsonrpc import Call, Dispatcher, declare, error_for
from reasonray.api.results import ShareResult
from reasonray.kernel.errors import ForbiddenError, InvalidParamsError, NotFoundError, ReasonRayError, UnauthenticatedError
from reasonray.memory.items import WORKSPACE
from reasonray.stores.audit import ANONYMOUS, AuditLog, AuditRecord, NoAudit, open_audit
from reasonray.stores.ownership import OwnerRecord, OwnershipRepository, OwnershipTable
from reasonray.strategies.agents import STRATEGY_CAPABILITY, AgentCard, remote_strategy

if TYPE_CHECKING:
    from reasonray.api.registry_service import Registry
    from reasonray.kernel.config import Settings

log = structlog.get_logger(__name__)

RUN_TOKENS: ContextVar[list[int] | None] = ContextVar("reasonray_run_tokens", default=None)
"""Tokens the current call's runs used, added by the reasoning service as each run ends (ok or not)."""
HTTP_ADMISSION: ContextVar[list[bool] | None] = ContextVar("reasonray_http_admission", default=None)
"""[True] while the HTTP request that the gate counted against its caller's limits has not yet been taken by a
method call (the first call of the request takes it; a batch's other calls count as requests of their own)."""


def charge_tokens(tokens: int) -> None:
    """Count tokens a run used towards the caller's budget (a no-op outside a guarded call)."""
    spent = RUN_TOKENS.get()
    if spent is not None:
        spent.append(tokens)


def personal_workspace(sub: str) -> str:
    """The workspace a principal gets when it names none: its own, never the shared default."""
    return "p-" + hashlib.sha256(sub.encode()).hexdigest()[:24]


PERSONAL_WORKSPACE = re.compile(r"p-[0-9a-f]{24}")
RESERVED_WORKSPACES = frozenset({"default", "shared", "public", "global"})  # an admin's to fill; nobody claims them


class Owners(Protocol):
    """The ownership repository as the guard uses it: in this process (`LocalOwners`) or the cluster's
    shared actor (`reasonray.actors.tenancy.RayOwners`). The methods are `OwnershipRepository`'s."""

    async def get(self, kind: str, ident: str) -> OwnerRecord | None: ...

    async def claim(self, kind: str, ident: str, sub: str) -> bool: ...

    async def share(self, kind: str, ident: str, readers: list[str]) -> None: ...

    async def drop(self, kind: str, ident: str) -> None: ...

    async def readable(self, kind: str, sub: str) -> list[str]: ...

    async def owned(self, kind: str) -> set[str]: ...


class LocalOwners:
    """`Owners` over a repository in this process (tests, scripts, one process serving alone)."""

    def __init__(self, table: OwnershipRepository | None = None) -> None:
        self.table = table or OwnershipTable()

    async def get(self, kind: str, ident: str) -> OwnerRecord | None:
        return self.table.get(kind, ident)

    async def claim(self, kind: str, ident: str, sub: str) -> bool:
        return self.table.claim(kind, ident, sub)

    async def share(self, kind: str, ident: str, readers: list[str]) -> None:
        self.table.share(kind, ident, readers)

    async def drop(self, kind: str, ident: str) -> None:
        self.table.drop(kind, ident)

    async def readable(self, kind: str, sub: str) -> list[str]:
        return self.table.readable(kind, sub)

    async def owned(self, kind: str) -> set[str]:
        return self.table.owned(kind)


class ShareParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workspace: str = Field(pattern=WORKSPACE, description="Your workspace to share.")
    readers: list[str] = Field(max_length=100, description="Principals (`sub`) that may read it; replaces the list. Empty: unshare.")


@dataclass
class Guard:
    """Authorization, ownership, limits and audit around every method of a dispatcher, read from each method's
    declared `Access` (see the module docstring and `reasonray.api.declarations`)."""

    policy: Policy
    owners: Owners
    limits: Limits
    _: KW_ONLY
    agent_exists: Callable[[str], Awaitable[bool]]
    strategy_of: Callable[[Any], Awaitable[str]]
    agent_strategies: Callable[[str], Awaitable[list[str]]]
    audit: AuditLog = field(default_factory=NoAudit)

    async def __call__(self, call: Call, params: BaseModel, invoke: Callable[[], Awaitable[Any]]) -> Any:
        principal = CURRENT_PRINCIPAL.get()
        access = call.access
        if access is None:  # declare refuses such a method; a hand-made Call must not slip through
            raise ForbiddenError(f"forbidden: {call.method} declares no access", {"method": call.method})
        target = access.target(params)
        outcome, reason = "ok", None
        try:
            if principal is None:
                raise UnauthenticatedError("missing credentials: send `Authorization: Bearer <token>` (see docs/security.md)")
            if not self.policy.may_call(principal, call.method):
                raise ForbiddenError(
                    f"forbidden: roles {list(principal.roles)} may not call {call.method}; ask an operator for a role that may",
                    {"method": call.method},
                )
            strategy = await self._admit(principal, call, access, params)
            target = access.target(params)  # an omitted workspace is now the caller's own
            result = await self._limited(principal, access, strategy, invoke)
            # what the call created is claimed for the caller, what it removed released
            if access.creates is not None:
                created = result[f"{access.creates}_id"] if isinstance(result, dict) else getattr(result, f"{access.creates}_id")
                await self.owners.claim(access.creates, str(created), principal.sub)
            for resource in access.resources:
                if resource.mode == "drop" and (ident := resource.ident(params)) is not None:
                    await self.owners.drop(resource.kind, ident)
            return result
        except Exception as exc:
            error = error_for(exc)
            outcome, reason = error.data.get("error_type", "error"), error.message[:500]
            raise
        finally:
            await self.audit.write(
                AuditRecord(
                    principal=principal.sub if principal else ANONYMOUS,
                    roles=list(principal.roles) if principal else [],
                    method=call.method,
                    target=target,
                    outcome=outcome,
                    trace_id=call.trace_id,
                    reason=reason,
                )
            )

    async def admit_request(self, principal: Principal) -> None:
        """Count one request against the caller's own limits (the gate's, for every authenticated route)."""
        if own := limited(self.policy.limits(principal)):
            await self._count(principal, [(principal.sub, own)], run=False)

    async def _count(self, principal: Principal, keyed: KeyedLimits, *, run: bool, requests: int = 1) -> Decision:
        """Count the call against every key's limits, or refuse it naming the limit it reached."""
        decision = await self.limits.admit(keyed, run=run, requests=requests)
        if not decision["ok"]:
            raise refusal_error(decision, principal.sub)
        return decision

    async def _limited(self, principal: Principal, access: Access, strategy: str | None, invoke: Callable[[], Awaitable[Any]]) -> Any:
        keyed = [(principal.sub, limited(self.policy.limits(principal)))]
        if strategy is not None and strategy in self.policy.strategy_limits:
            keyed.append((f"{principal.sub}|{strategy}", limited(self.policy.strategy_limits[strategy])))
        keyed = [(k, lim) for k, lim in keyed if lim]
        if not keyed:
            return await invoke()
        run = access.limits == "run"
        requests = 1
        if (admission := HTTP_ADMISSION.get()) is not None and admission[0]:
            admission[0] = False  # the gate counted this request against the caller's own limits
            requests = 0
            if by_strategy := [(k, lim) for k, lim in keyed if k != principal.sub]:  # the gate could not know the strategy
                await self._count(principal, by_strategy, run=False)
            if not run:
                return await invoke()
        decision = await self._count(principal, keyed, run=run, requests=requests)
        if not run:
            return await invoke()
        spent: list[int] = []
        token = RUN_TOKENS.set(spent)
        reported = 0  # what a run in another process (a session host) says it used, in its result or its error
        try:
            result = await invoke()
            reported = _tokens_in(result)
            return result
        except ReasonRayError as exc:
            reported = _tokens_in(exc.data)
            raise
        finally:
            RUN_TOKENS.reset(token)
            await self.limits.finish([k for k, _ in keyed], decision.get("run_id"), sum(spent) if spent else reported)

    async def _admit(self, principal: Principal, call: Call, access: Access, params: BaseModel) -> str | None:
        """Check (and where declared, fill in) what the call names; returns the strategy the call runs, if any."""
        sees_all = self.policy.sees_all(principal)
        if access.right is not None and (right := access.right(params)) is not None and not self.policy.may_call(principal, right):
            raise ForbiddenError(f"forbidden: roles {list(principal.roles)} may not do this: it needs {right!r}", {"method": right})
        for check in access.checks:
            check(params, sees_all)
        for resource in access.resources:
            found = resource.holder_and_name(params) if resource.applies is None or resource.applies(params) else None
            if found is None:
                continue
            holder, name = found
            ident = getattr(holder, name)
            if ident is None and resource.personal and not sees_all:
                ident = personal_workspace(principal.sub)  # an omitted workspace is the caller's own, never the shared default
                setattr(holder, name, ident)
            if ident is None:
                continue
            mode = "claim" if resource.claims is not None and resource.claims(params) else resource.mode
            write, claim = mode != "read", mode == "claim"
            if resource.kind == "agent":
                await self._agent(principal, ident, write=write, claim=claim)
            elif not sees_all:
                await self._require(resource.kind, ident, principal, write=write, claim=claim)
        if access.lists is not None and not sees_all:  # what the caller may see of what the method lists (admins: everything)
            readable = frozenset(await self.owners.readable(access.lists, principal.sub))
            if access.lists == "workspace":
                call.visible = Visible(readable, default=personal_workspace(principal.sub), unowned=False)
            else:
                call.visible = Visible(readable, frozenset(await self.owners.owned(access.lists)))
        if access.own_usage and not sees_all:
            call.usage = await self.limits.usage(principal.sub)
        return await self._strategy(principal, call.method, access.strategy, params) if access.strategy is not None else None

    async def _strategy(self, principal: Principal, method: str, declared: str, params: BaseModel) -> str:
        agent_id = getattr(params, "agent_id", None)
        if principal.agent_id is not None:
            if agent_id not in (None, principal.agent_id):
                raise ForbiddenError(f"forbidden: {principal.sub!r} runs as agent {principal.agent_id!r} and cannot act as another agent")
            if hasattr(params, "agent_id"):
                params.agent_id = principal.agent_id
        elif agent_id is not None:
            await self._agent(principal, agent_id, write=False)
        fixed = declared != RESOLVED  # the method always runs this strategy
        strategy = declared if fixed else await self.strategy_of(params)
        # a resolved strategy goes through the agent's card; a method that names its strategy itself has the
        # card's restrictions checked here
        if fixed and principal.agent_id is not None and strategy not in await self.agent_strategies(principal.agent_id):
            raise ForbiddenError(
                f"forbidden: {principal.sub!r} runs as agent {principal.agent_id!r}, whose card does not offer "
                f"strategy {strategy!r} (which {method} runs)",
                {"strategy": strategy, "agent_id": principal.agent_id},
            )
        if not self.policy.may_run(principal, strategy):
            raise ForbiddenError(f"forbidden: roles {list(principal.roles)} may not run strategy {strategy!r}", {"strategy": strategy})
        return strategy

    async def _agent(self, principal: Principal, agent_id: str, *, write: bool, claim: bool = False) -> None:
        """Cards registered through the API belong to their registrant; cards from the agents file to operators."""
        if principal.agent_id is not None and agent_id != principal.agent_id and write:
            raise ForbiddenError(f"forbidden: {principal.sub!r} is agent {principal.agent_id!r} and cannot change another agent")
        if self.policy.sees_all(principal):
            return
        record = await self.owners.get("agent", agent_id)
        if record is None and await self.agent_exists(agent_id):
            if write:
                raise _not_yours("agent", agent_id)
            return  # a card of the server's agents file: readable by everyone
        await self._require("agent", agent_id, principal, write=write, claim=claim)

    async def _require(self, kind: str, ident: str, principal: Principal, *, write: bool, claim: bool = False) -> None:
        """Refuse a principal that does not see every owner's data unless `ident` is its own (or shared with it, to read)."""
        record = await self.owners.get(kind, ident)
        if record is None and kind == "workspace" and PERSONAL_WORKSPACE.fullmatch(ident):
            if ident != personal_workspace(principal.sub):
                raise _not_yours(kind, ident)  # another principal's personal workspace: nobody else may claim it
            if not claim:
                return  # your own personal workspace, still empty: it is yours before you store anything in it
        if record is None and claim and kind == "workspace" and ident in RESERVED_WORKSPACES:
            # first come, first served would let one principal take the name every client defaults to
            raise ForbiddenError(
                f"forbidden: workspace {ident!r} is reserved; store in your own (omit workspace) or another name", {kind: ident}
            )
        if record is None and claim and await self.owners.claim(kind, ident, principal.sub):
            return
        if record is not None and (record["owner"] == principal.sub or (not write and principal.sub in record["readers"])):
            return
        raise _not_yours(kind, ident)


def _not_yours(kind: str, ident: str) -> ForbiddenError:
    # the same words whether `ident` exists under another owner or not at all: nothing to probe with
    return ForbiddenError(f"forbidden: no {kind} {ident!r} that you may use", {kind: ident})


def _tokens_in(result: Any) -> int:
    """Tokens a run used, from its result or its error's data (runs in other processes, e.g. session hosts, report them there)."""
    if isinstance(result, BaseModel):
        result = result.model_dump()
    if not isinstance(result, dict):
        return 0
    # a run's metrics, a session turn's or resumption's usage, or the result itself
    for holder in (result.get("metrics"), result.get("usage"), result):
        if isinstance(holder, dict) and "total_tokens" in holder:
            return int(holder["total_tokens"])
    return 0


def install_guard(rpc: Dispatcher, guard: Guard) -> None:
    """Put `guard` around every method of `rpc`, and add memory.share_workspace when there is a memory bank."""
    rpc.guard = guard
    if "memory.store" not in rpc.methods:
        return

    @declare(rpc.methods, "memory.share_workspace", access=Access(REASONERS, (Resource("workspace", "workspace", "write"),)))
    async def share_workspace(params: ShareParams, call: Call) -> ShareResult:
        """Let named principals read one of your workspaces (read-only); replaces its reader list."""
        if await guard.owners.get("workspace", params.workspace) is None:
            raise InvalidParamsError(f"workspace {params.workspace!r} has no owner yet; store a memory in it first", {})
        await guard.owners.share("workspace", params.workspace, params.readers)
        return ShareResult.of({"workspace": params.workspace, "readers": sorted(set(params.readers))}, call.trace_id)


class _Resolves(Protocol):
    """What the guard needs of the reasoning service: which strategy a request would run (typed here, not
    imported, because the service charges runs through this module)."""

    async def resolve(self, params: Any) -> Any: ...


def build_guard(settings: Settings, registry: Registry, service: _Resolves, owners: Owners, limits: Limits) -> Guard:
    """The guard of an application, the same for every entry point (the Serve ingress, `reasonray mcp`,
    benchmarks): the configured roles, ownership and limits where the caller keeps them (`owners`,
    `limits`: in this process or on the cluster's actors), the audit log of the configured store."""

    async def strategy_of(params: Any) -> str:
        agent_id = getattr(params, "agent_id", None)
        if agent_id is not None and (await registry.get_agent(agent_id)).a2a_card_url:
            return remote_strategy(agent_id)  # forwarded to a remote A2A agent: roles allow it as `a2a:<id>`
        return str((await service.resolve(params)).strategy)

    auth = settings.auth
    return Guard(
        Policy(auth),
        owners,
        limits,
        agent_exists=lambda agent_id: agent_exists_via(registry.get_agent, agent_id),
        strategy_of=strategy_of,
        agent_strategies=lambda agent_id: agent_strategies_via(registry.get_agent, agent_id),
        audit=open_audit(settings.store.url, settings.data_dir) if auth.audit else NoAudit(),
    )


async def agent_strategies_via(get_agent: Callable[[str], Awaitable[AgentCard]], agent_id: str) -> list[str]:
    """The strategies an agent's card advertises (its `reasoning.strategy.*` capabilities)."""
    card = await get_agent(agent_id)
    return [c.removeprefix(STRATEGY_CAPABILITY) for c in card.capabilities if c.startswith(STRATEGY_CAPABILITY)]


async def agent_exists_via(get_agent: Callable[[str], Awaitable[Any]], agent_id: str) -> bool:
    try:
        await get_agent(agent_id)
    except NotFoundError:
        return False
    return True
