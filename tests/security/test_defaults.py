"""Safe defaults without configuration: the shipped roles are limited, a remote agent is an operator's to
register, and bodies holding values no answer can echo are refused at the door."""

from __future__ import annotations

import pytest

from reasonray.api.access.auth import REMOTE_AGENTS, Policy, Principal
from reasonray.api.surfaces.guard import GuardSettings, Refusal, check_body
from reasonray.kernel.auth_settings import DEFAULT_ROLES, AuthSettings, LimitSettings, RoleSettings
from reasonray.kernel.config import load_settings
from tests.unit.test_tenancy import ALICE, BOB, api, call


def test_every_shipped_role_carries_limits_and_a_config_can_change_them(tmp_path):
    policy = Policy(AuthSettings(jwt_secret="s" * 40))
    for role in DEFAULT_ROLES:
        limits = policy.limits(Principal("p", (role,)))
        assert limits.requests_per_minute is not None, role
    reasoner = policy.limits(Principal("p", ("reasoner",)))
    assert (reasoner.requests_per_minute, reasoner.concurrent_runs, reasoner.tokens_per_minute) == (120, 4, 200_000)
    assert reasoner.tokens_per_day == 5_000_000
    # the most generous of a principal's roles counts: reasoner + operator is an operator's
    assert policy.limits(Principal("p", ("reasoner", "operator"))).concurrent_runs == 16
    # an operator raises them in config.toml or the environment
    (tmp_path / "c.toml").write_text(
        '[auth]\njwt_secret = "' + "s" * 32 + '"\n[auth.roles.reasoner]\nmethods = ["*"]\nstrategies = ["*"]\n'
        "[auth.roles.reasoner.limits]\nrequests_per_minute = 1000\nconcurrent_runs = 50\n"
    )
    raised = Policy(load_settings(tmp_path / "c.toml", environ={}).auth).limits(Principal("p", ("reasoner",)))
    assert (raised.requests_per_minute, raised.concurrent_runs, raised.tokens_per_minute) == (1000, 50, None)


def test_a_principal_with_no_known_role_is_not_known_and_gets_the_tightest_limits():
    policy = Policy(AuthSettings(jwt_secret="s" * 40))
    stranger = Principal("eve", ("superuser", "root"))
    assert not policy.known(stranger) and policy.known(Principal("p", ("reader", "superuser")))
    assert policy.limits(stranger) == LimitSettings(requests_per_minute=1, concurrent_runs=1, tokens_per_minute=1, tokens_per_day=1)


def test_registering_a_remote_agent_is_an_operators_right(tmp_path):
    policy = Policy(AuthSettings(jwt_secret="s" * 40))
    assert not policy.may_call(Principal("p", ("reasoner",)), REMOTE_AGENTS)
    assert policy.may_call(Principal("p", ("operator",)), REMOTE_AGENTS) and policy.may_call(Principal("p", ("admin",)), REMOTE_AGENTS)
    custom = Policy(AuthSettings(jwt_secret="s" * 40, roles={"integrator": RoleSettings(methods=["agent.register", REMOTE_AGENTS])}))
    assert custom.may_call(Principal("p", ("integrator",)), REMOTE_AGENTS)


async def test_a_reasoner_registering_a_remote_agent_is_refused_before_any_fetch(tmp_path):
    rpc, _ = api(tmp_path)
    card = {"id": "far", "name": "Far", "capabilities": ["x"], "a2a_card_url": "http://169.254.169.254/latest/meta-data/"}
    refused = await call(rpc, ALICE, "agent.register", card)
    assert refused["error"]["code"] == -32003 and REMOTE_AGENTS in refused["error"]["message"]
    # a local card stays every reasoner's to register
    local = {"id": "near", "name": "Near", "capabilities": ["reasoning.strategy.chain_of_thought"]}
    assert "result" in await call(rpc, BOB, "agent.register", local)


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": NaN}, "id": 1}',
        b'{"query": Infinity}',
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": -Infinity}',
        b'{"a": [1, 2, {"b": 1e999}]}',
        b'{"a": -1E400}',
    ],
)
def test_nan_infinity_and_overflowing_numbers_are_refused_at_the_door(body):
    with pytest.raises(Refusal) as refused:
        check_body(body, GuardSettings())
    assert refused.value.status == 400 and refused.value.code == -32600
    assert "finite number" in refused.value.message


def test_finite_numbers_pass():
    check_body(b'{"a": 1e308, "b": -0.0, "c": 12345678901234567890, "d": "NaN"}', GuardSettings())
