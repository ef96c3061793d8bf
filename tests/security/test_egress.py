"""The egress policy as an attacker meets it: URLs a caller names for a remote A2A agent, against real
local servers that count the connections they get (a refused destination must see none)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time

import pytest

from reasonray.api.a2a_remote import RemoteAgentError, forward, remote_registration
from reasonray.api.access.auth import CURRENT_PRINCIPAL, Principal
from reasonray.api.access.egress import Egress, EgressPolicy, EgressRefusedError, OutboundGate, internal_address
from reasonray.kernel.egress_settings import EgressSettings
from reasonray.kernel.errors import InvalidParamsError, OverloadedError, RateLimitedError
from reasonray.strategies.agents import AgentRegistration

CARD_PATH = "/.well-known/agent-card.json"


class Listener:
    """A TCP server on 127.0.0.1 answering every request with `reply(path, headers)` (None: never answers)."""

    def __init__(self, reply) -> None:
        self.reply = reply
        self.connections = 0
        self.open = 0
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Listener:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *fields = head.split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
            if int(headers.get("content-length", 0)):
                await reader.readexactly(int(headers["content-length"]))
            self.requests.append((line.split(" ")[1], headers))
            answer = self.reply(line.split(" ")[1], headers)
            if answer is None:  # the tarpit: hold the connection until the client goes away
                await reader.read()
                return
            status, extra, body = answer
            writer.write(f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n".encode() + body.encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def card(base: str) -> str:
    return json.dumps(
        {
            "name": "far",
            "description": "a remote agent",
            "version": "1",
            "supportedInterfaces": [{"url": f"{base}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
            "capabilities": {},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "chain_of_thought", "name": "cot", "description": "d", "tags": ["t"]}],
        }
    )


def registration(url: str) -> AgentRegistration:
    return AgentRegistration(id="far", name="Far", capabilities=["remote"], a2a_card_url=url)


def egress(*hosts: str, **settings) -> Egress:
    return Egress(EgressSettings(allow_hosts=list(hosts), **settings))


async def test_with_no_allow_list_remote_agents_are_off_and_nothing_is_connected():
    async with Listener(lambda *_: ("200 OK", "", "{}")) as target:
        with pytest.raises(EgressRefusedError, match=r"remote agents are off.*allow_hosts is empty"):
            await remote_registration(registration(f"http://127.0.0.1:{target.port}{CARD_PATH}"), Egress())
        assert target.connections == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{other}/.well-known/agent-card.json",  # the API's own ports, the dashboard, the GCS...
        "http://169.254.169.254/latest/meta-data/",  # the cloud metadata service
        "http://[::1]:{port}/x",
        "http://0.0.0.0:{port}/x",
        "http://127.1:{port}/x",  # another spelling of loopback
        "http://2130706433:{port}/x",  # and another
        "http://localhost:{port}/x",  # a name for loopback that the list does not name
    ],
)
async def test_a_destination_off_the_list_is_refused_before_any_connection(url):
    async with Listener(lambda *_: ("200 OK", "", "{}")) as listed, Listener(lambda *_: ("200 OK", "", "{}")) as other:
        policy = egress(f"127.0.0.1:{listed.port}")
        with pytest.raises(EgressRefusedError, match="egress refused"):
            await remote_registration(registration(url.format(port=listed.port, other=other.port)), policy)
        assert listed.connections == 0 and other.connections == 0


async def test_a_listed_name_that_resolves_to_an_internal_address_is_refused_unless_that_address_is_listed():
    async with Listener(lambda path, _: ("200 OK", "", card("http://agents.example.test"))) as target:
        for internal in ("127.0.0.1", "10.1.2.3", "169.254.169.254", "::ffff:127.0.0.1", "fd00:ec2::254", "100.64.0.1"):
            policy = egress(f"agents.example.test:{target.port}")

            async def dns(host, port, answer=internal):
                return [ipaddress.ip_address(answer)]

            policy.policy.lookup = dns
            with pytest.raises(EgressRefusedError, match="resolves to an internal"):
                await remote_registration(registration(f"http://agents.example.test:{target.port}{CARD_PATH}"), policy)
        # a name answering with a public and an internal address (rebinding in one answer) is refused as well
        policy = egress(f"agents.example.test:{target.port}")

        async def mixed(host, port):
            return [ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("127.0.0.1")]

        policy.policy.lookup = mixed
        with pytest.raises(EgressRefusedError, match="resolves to an internal"):
            await remote_registration(registration(f"http://agents.example.test:{target.port}{CARD_PATH}"), policy)
        assert target.connections == 0
        # the operator names the address as well: the name is reached, at the address that was checked
        policy = egress(f"agents.example.test:{target.port}", f"127.0.0.1:{target.port}")

        async def loopback(host, port):
            return [ipaddress.ip_address("127.0.0.1")]

        policy.policy.lookup = loopback
        registered = await remote_registration(registration(f"http://agents.example.test:{target.port}{CARD_PATH}"), policy)
        assert registered.remote_skills == ["chain_of_thought"] and target.connections == 1
        assert target.requests[0][1]["host"] == f"agents.example.test:{target.port}"  # the name travels, the address was pinned


async def test_every_redirect_passes_the_policy_again():
    async with Listener(lambda *_: ("200 OK", "", "{}")) as inside:
        to_inside = f"location: http://127.0.0.1:{inside.port}/.well-known/agent-card.json\r\n"
        to_metadata = "location: http://169.254.169.254/latest/meta-data/\r\n"
        async with (
            Listener(lambda *_: ("302 Found", to_inside, "")) as hop,
            Listener(lambda *_: ("307 Temporary Redirect", to_metadata, "")) as hop2,
        ):
            policy = egress(f"127.0.0.1:{hop.port}", f"127.0.0.1:{hop2.port}")
            for start in (hop, hop2):
                with pytest.raises(EgressRefusedError, match="egress refused"):
                    await remote_registration(registration(f"http://127.0.0.1:{start.port}{CARD_PATH}"), policy)
            assert hop.connections == 1 and hop2.connections == 1 and inside.connections == 0


async def test_what_answered_is_not_told_a_closed_port_a_status_a_page_and_silence_read_the_same():
    async with (
        Listener(lambda *_: ("500 Internal Server Error", "", "boom")) as failing,
        Listener(lambda *_: ("200 OK", "", "<html>dashboard</html>")) as page,
        Listener(lambda *_: ("200 OK", "", '{"not": "a card"}')) as json_page,
        Listener(lambda *_: None) as silent,
    ):
        closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        closed_port = closed.sockets[0].getsockname()[1]
        closed.close()
        await closed.wait_closed()
        ports = [failing.port, page.port, json_page.port, silent.port, closed_port]
        policy = egress(*(f"127.0.0.1:{p}" for p in ports), card_timeout_s=1.0)
        messages = set()
        for port in ports:
            with pytest.raises(InvalidParamsError) as caught:
                await remote_registration(registration(f"http://127.0.0.1:{port}{CARD_PATH}"), policy)
            messages.add(caught.value.message.replace(str(port), "PORT"))
        assert len(messages) == 1, messages
        [message] = messages
        assert "no valid A2A agent card could be fetched" in message
        for telling in ("500", "refused", "parse", "html", "timed out", "Timeout", "Connect", "HTTP"):
            assert telling not in message


async def test_credentials_go_to_their_host_only_also_across_a_redirect(monkeypatch):
    async with Listener(lambda path, _: ("200 OK", "", card("http://x"))) as second:
        hop_to_second = f"location: http://127.0.0.1:{second.port}{CARD_PATH}\r\n"
        async with Listener(lambda *_: ("302 Found", hop_to_second, "")) as first:
            settings = {
                "credentials": {
                    f"127.0.0.1:{first.port}": {"token_env": "FIRST_AGENT_TOKEN"},
                    f"127.0.0.1:{second.port}": {"token_env": "SECOND_AGENT_KEY", "header": "X-Api-Key", "scheme": ""},
                }
            }
            policy = Egress(
                EgressSettings(allow_hosts=[f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"], **settings),
                environ={"FIRST_AGENT_TOKEN": "first-secret", "SECOND_AGENT_KEY": "second-secret"},
            )
            await remote_registration(registration(f"http://127.0.0.1:{first.port}{CARD_PATH}"), policy)
            assert first.requests[0][1]["authorization"] == "Bearer first-secret" and "x-api-key" not in first.requests[0][1]
            assert second.requests[0][1]["x-api-key"] == "second-secret" and "authorization" not in second.requests[0][1]


def test_only_http_and_https_urls_pass():
    policy = egress("127.0.0.1:80").policy
    for url in ("file:///etc/passwd", "gopher://127.0.0.1:80/x", "ftp://127.0.0.1:80/", "http:///nohost", "http://127.0.0.1:99999/"):
        with pytest.raises(EgressRefusedError, match="egress refused"):
            policy.check_url(url)
    assert policy.check_url("http://127.0.0.1/x") == ("127.0.0.1", 80)


def test_credentials_must_name_a_listed_host_and_entries_must_be_host_port():
    with pytest.raises(ValueError, match="not in allow_hosts"):
        EgressSettings(allow_hosts=["a.example:443"], credentials={"b.example:443": {"token_env": "B"}})
    for wrong in ("a.example", "http://a.example:443", "a.example:0", "a.example:99999", "*:443"):
        with pytest.raises(ValueError, match="is not host:port"):
            EgressSettings(allow_hosts=[wrong])


@pytest.mark.parametrize(
    ("address", "internal"),
    [
        ("8.8.8.8", False),
        ("2606:4700::1111", False),
        ("10.0.0.1", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("127.0.0.1", True),
        ("169.254.169.254", True),
        ("100.64.0.1", True),
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("::1", True),
        ("fe80::1", True),
        ("fd00:ec2::254", True),
        ("::ffff:10.0.0.1", True),
        ("2002:7f00:1::", True),  # 6to4 around 127.0.0.1
    ],
)
def test_internal_addresses(address, internal):
    assert internal_address(ipaddress.ip_address(address)) is internal


async def test_the_outbound_gate_refuses_beyond_its_caps_and_never_queues():
    gate = OutboundGate(per_destination=3, per_principal=2)
    async with gate.slot("a:1", "alice"), gate.slot("a:1", "alice"):
        with pytest.raises(RateLimitedError, match="max_per_principal") as caught:
            async with gate.slot("b:1", "alice"):
                pass
        assert caught.value.data["retry_after_s"] > 0
        async with gate.slot("a:1", "bob"):
            with pytest.raises(OverloadedError, match="max_per_destination"):
                async with gate.slot("a:1", "carol"):
                    pass
            async with gate.slot("b:1", "carol"):  # another destination and principal: room
                assert gate.destinations.total() == 4
    assert gate.destinations.total() == 0 and not gate.principals


class ClusterSlots:
    """`SharedSlots` as the limiter actor answers them, in this process: one `RateLimiter` behind several gates."""

    def __init__(self) -> None:
        from reasonray.api.access.limits import RateLimiter

        self.limiter = RateLimiter()
        self.taken: list[float] = []

    async def take(self, keyed, ttl_s):
        self.taken.append(ttl_s)
        return self.limiter.admit(keyed, requests=0, run=True, runs=1, lease_s=ttl_s)

    async def give_back(self, keys, slot):
        self.limiter.release(keys, [slot])


async def test_the_caps_hold_across_replicas_that_share_the_clusters_count():
    shared = ClusterSlots()
    one, two = OutboundGate(3, 2, shared), OutboundGate(3, 2, shared)  # two replicas of one application
    async with one.slot("a:1", "alice", 40), two.slot("a:1", "alice", 40):
        with pytest.raises(RateLimitedError, match="max_per_principal"):
            async with two.slot("b:1", "alice"):  # this replica holds one of hers: the cluster holds two
                pass
        async with two.slot("a:1", "bob"):
            with pytest.raises(OverloadedError, match="max_per_destination"):
                async with one.slot("a:1", "carol"):
                    pass
        assert one.destinations.total() == 1 and two.destinations.total() == 1  # a refusal holds nothing, here or in the cluster
    await asyncio.sleep(0)  # the slots go back in the background
    assert shared.limiter.usage("egress:principal:alice")["runs_in_flight"] == 0
    assert shared.limiter.usage("egress:destination:a:1")["runs_in_flight"] == 0
    assert 40 in shared.taken  # the call's own limit bounds a slot its replica died holding


async def test_a_slot_whose_replica_died_holding_it_is_free_after_its_ttl():
    shared = ClusterSlots()
    now = [1000.0]
    shared.limiter.clock = lambda: now[0]
    gate = OutboundGate(3, 1, shared)
    held = gate.slot("a:1", "alice", 30)
    await held.__aenter__()  # and the replica dies: nothing gives it back
    with pytest.raises(RateLimitedError):
        async with OutboundGate(3, 1, shared).slot("a:1", "alice"):
            pass
    now[0] += 31
    async with OutboundGate(3, 1, shared).slot("a:1", "alice"):  # another replica, after the slot's TTL
        pass


async def test_a_tarpit_is_left_at_the_deadline_and_at_once_when_the_caller_goes_away():
    async with Listener(lambda path, _: ("200 OK", "", card(f"http://127.0.0.1:{tarpit.port}")) if path == CARD_PATH else None) as tarpit:
        policy = egress(f"127.0.0.1:{tarpit.port}", call_timeout_s=30)
        agent = {"id": "far", "a2a_card_url": f"http://127.0.0.1:{tarpit.port}{CARD_PATH}", "default_strategy": None}
        started = time.monotonic()
        with pytest.raises(RemoteAgentError, match=r"did not answer within 1 s"):
            await forward(agent, "hello", None, "trace-1", policy, deadline_s=1.0)
        assert time.monotonic() - started < 3
        await asyncio.sleep(0.2)
        assert tarpit.open == 0 and policy.gate.destinations.total() == 0  # the connection was closed, the slot given back
        # the caller goes away (Serve cancels the handler's task): the connection goes with it
        token = CURRENT_PRINCIPAL.set(Principal("mallory", ("reasoner",)))
        try:
            call = asyncio.create_task(forward(agent, "hello", None, "trace-2", policy))
            while tarpit.open == 0:
                await asyncio.sleep(0.02)
            assert policy.gate.principals == {"mallory": 1}
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.2)
            assert tarpit.open == 0 and policy.gate.destinations.total() == 0
        finally:
            CURRENT_PRINCIPAL.reset(token)


@pytest.mark.parametrize(("host", "port"), [("agents.example.test", 8444), ("93.184.215.14", 444), ("AGENTS.example.test", 80)])
async def test_a_listed_public_host_on_a_port_the_list_does_not_name_is_refused_by_the_list_itself(host, port):
    """The allow-list names host:port pairs: a listed host at another port is refused by the list, not only by the
    later internal-address rule (these destinations are public, so only the list can refuse them)."""
    policy = EgressPolicy(EgressSettings(allow_hosts=["agents.example.test:8443", "93.184.215.14:443"]))

    async def public(host, port):
        return [ipaddress.ip_address("93.184.215.14")]

    policy.lookup = public
    with pytest.raises(EgressRefusedError, match=r"is not in \[egress\] allow_hosts"):
        await policy.resolve(host, port)
    assert await policy.resolve("agents.example.test", 8443) == "93.184.215.14"  # the listed pair itself is reached
