"""Access is declared where a method is registered (reasonray/api/declarations.py): every method of the API has a
declaration, it agrees with the default roles, and a method without one cannot be registered."""

from __future__ import annotations

import pytest

from reasonray.api.access.auth import Policy, Principal
from reasonray.api.access.tenancy import ShareParams, install_guard
from reasonray.api.app import local_dispatcher
from reasonray.api.declarations import EVERYONE, Access, Resource, Visible
from reasonray.api.jsonrpc import declare
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.auth_settings import DEFAULT_ROLES, AuthSettings
from reasonray.kernel.config import ReasoningSettings
from tests.unit.memory_harness import local_memory, make_bank


@pytest.fixture
def rpc(tmp_path):
    from reasonray.reasoner.builtin_tools import builtin_toolbox
    from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
    from reasonray.stores.sessions import SqliteSessionStore

    llm = SimulatedLLM()
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    rpc = local_dispatcher(
        ReasoningSettings(), llm, data_dir=tmp_path, sessions=sessions, memory=local_memory(make_bank(tmp_path / "bank"))
    )
    install_guard(rpc, guard=_NoGuard())  # adds memory.share_workspace, as with authentication on
    return rpc


class _NoGuard:
    owners = None

    async def __call__(self, call, params, invoke):
        return await invoke()


def test_every_method_declares_its_access_and_the_default_roles_grant_exactly_the_declared_ones(rpc):
    policy = Policy(AuthSettings(jwt_secret="s" * 40))
    assert len(rpc.methods) > 30
    for name, method in rpc.methods.items():
        assert isinstance(method.access, Access), name
        granted = tuple(role for role in DEFAULT_ROLES if policy.may_call(Principal("someone", (role,)), name))
        assert granted == method.access.roles, (name, granted, method.access.roles)


def test_runs_and_only_runs_are_charged_as_runs_and_name_their_strategy(rpc):
    runs = {name for name, m in rpc.methods.items() if m.access.limits == "run"}
    assert runs == {"reasoning.execute", "reasoning.bounded_context", "solve_coding_task", "session.turn", "session.resume"}
    with_strategy = {name: m.access.strategy for name, m in rpc.methods.items() if m.access.strategy is not None}
    assert with_strategy == {"reasoning.execute": "resolved", "reasoning.bounded_context": "bounded_context", "solve_coding_task": "matts"}


def test_every_method_whose_params_name_a_workspace_or_session_declares_it(rpc):
    for name, method in rpc.methods.items():
        fields = set(method.params.model_fields)
        declared = {r.param.split(".")[-1] for r in method.access.resources}
        for field in ("workspace", "session_id"):
            if field in fields:
                assert field in declared, (name, field)


def test_a_method_without_a_declaration_cannot_be_registered(rpc):
    with pytest.raises(TypeError, match=r"test\.undeclared"):
        declare(rpc.methods, "test.undeclared", access=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        declare(rpc.methods, "test.undeclared")  # type: ignore[call-arg]
    assert "test.undeclared" not in rpc.methods


def test_a_resource_is_found_along_its_path_and_names_the_audit_target():
    resource = Resource("workspace", "memory.workspace")

    class Memory:
        workspace = "team"

    class Params:
        memory = Memory()
        agent_id = None

    assert resource.ident(Params()) == "team"
    assert Access(EVERYONE, (resource,)).target(Params()) == "workspace:team"
    Params.memory = None
    assert resource.ident(Params()) is None and Access(EVERYONE, (resource,)).target(Params()) is None
    assert Access(EVERYONE).target(ShareParams(workspace="w", readers=[])) is None


def test_what_a_caller_sees_of_a_kind():
    agents = Visible(frozenset({"mine"}), frozenset({"mine", "theirs"}))
    assert agents.allows("mine") and agents.allows("from-the-agents-file") and not agents.allows("theirs")
    workspaces = Visible(frozenset({"mine"}), unowned=False)
    assert workspaces.allows("mine") and not workspaces.allows("default")
