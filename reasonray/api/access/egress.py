"""Egress: where the service may connect on a caller's behalf, how long it waits, and how many such
calls one caller and one destination may hold (docs/security.md#egress).

A caller steers outbound calls when it registers a remote A2A agent: it names the card's URL, and the
card names the endpoint that receives the caller's text. Those calls go through an `Egress`:

- `EgressPolicy`: the host:port must be in `[egress] allow_hosts` (empty: remote agents are off). It is
  checked on every connection, redirects included, where the name is resolved: an address that is
  private, loopback, link-local (the cloud metadata service) or otherwise not global is refused unless
  an entry names it (an IP address, or `localhost`), and the connection goes to the address that was
  checked, so a name that re-resolves elsewhere (DNS rebinding) gains nothing.
- `Egress.client`: an httpx client on that policy, with a short connect timeout, no proxy taken from
  the environment, and the configured credentials sent to their host only.
- `OutboundGate`: calls in flight per destination and per principal, refused beyond the caps (never
  queued), so one caller's slow remote agent holds at most its own few slots.

Errors say what the policy refused, never what answered where: a refused address, a closed port, a
timeout, an HTTP status and a body that is not a card all give the caller the same words (the log
keeps the detail for the operator).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpcore
import httpx
import structlog

from reasonray.api.access.limits import Decision, KeyedLimits
from reasonray.kernel.config import ip_address_or_none
from reasonray.kernel.egress_settings import EgressSettings, split_host_port
from reasonray.kernel.errors import ForbiddenError, OverloadedError, RateLimitedError

log = structlog.get_logger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_REDIRECTS = 3


class EgressRefusedError(ForbiddenError):
    """The egress policy refused a destination a caller named (not allowed, or an internal address)."""

    error_type = "egress_refused"


def internal_address(address: IPAddress) -> bool:
    """Whether an address is one a caller must not reach through the service: private, loopback,
    link-local (169.254.169.254, the cloud metadata service), shared, reserved, multicast or unspecified,
    also when wrapped in IPv6 (v4-mapped, 6to4, Teredo)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if inner is not None and internal_address(inner):
            return True
    return not address.is_global or address.is_multicast


def _refused(why: str, host: str, port: int) -> EgressRefusedError:
    return EgressRefusedError(f"egress refused: {why}", {"destination": f"{host}:{port}"[:260]})


Lookup = Callable[[str, int], Awaitable[list[IPAddress]]]


async def _getaddrinfo(host: str, port: int) -> list[IPAddress]:
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]


class EgressPolicy:
    """The allow-list and the address rules (module docstring); `resolve` is the one check a connection passes."""

    def __init__(self, settings: EgressSettings) -> None:
        self.settings = settings
        self.allowed = {split_host_port(entry) for entry in settings.allow_hosts}
        self.named_addresses = {(ip, port) for host, port in self.allowed if (ip := ip_address_or_none(host)) is not None}
        self.lookup: Lookup = _getaddrinfo  # name -> addresses (tests give a resolver of their own)

    def check_url(self, url: str) -> tuple[str, int]:
        """(host, port) of an http(s) URL the allow-list admits; EgressRefusedError otherwise (nothing is connected)."""
        parts = urlsplit(url)
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            raise EgressRefusedError(f"egress refused: {url[:200]!r} is not an http(s) URL", {"url": url[:200]})
        try:
            port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError:
            raise EgressRefusedError(f"egress refused: {url[:200]!r} has an invalid port", {"url": url[:200]}) from None
        self.check(parts.hostname, port)
        return parts.hostname.lower(), port

    def check(self, host: str, port: int) -> None:
        if not self.allowed:
            raise _refused(
                "remote agents are off on this server ([egress] allow_hosts is empty; "
                "an operator lists the host:port entries remote agents may be reached at)",
                host,
                port,
            )
        if (host.strip("[]").lower(), port) not in self.allowed:
            raise _refused(f"{host}:{port} is not in [egress] allow_hosts; ask an operator to list it", host, port)

    async def resolve(self, host: str, port: int, timeout: float | None = None) -> str:
        """The address to connect to for an allowed host:port, every one of its addresses checked."""
        self.check(host, port)
        literal = ip_address_or_none(host.strip("[]"))
        if literal is not None:
            addresses = [literal]
        else:
            try:
                async with asyncio.timeout(timeout or self.settings.connect_timeout_s):
                    addresses = list(dict.fromkeys(await self.lookup(host, port)))
            except (OSError, TimeoutError):
                raise _refused(f"{host}:{port} could not be resolved", host, port) from None
        # a name that resolves to both public and internal addresses is refused outright: which one a
        # later lookup returns is the attacker's choice
        # an internal address passes when allow_hosts names it; an entry naming localhost names loopback
        named = {a for a in addresses if (a, port) in self.named_addresses or (host.lower() == "localhost" and a.is_loopback)}
        if not addresses or any(internal_address(a) and a not in named for a in addresses):
            raise _refused(
                f"{host}:{port} resolves to an internal (private, loopback or link-local) address that [egress] allow_hosts does not name",
                host,
                port,
            )
        return str(addresses[0])


class _PolicyBackend(httpcore.AnyIOBackend):
    """httpcore's network backend with the policy in front of every TCP connection (redirects included)."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = await self.policy.resolve(host, port, timeout)
        return await super().connect_tcp(address, port, timeout, local_address, socket_options)


class SharedSlots(Protocol):
    """Slots counted across the cluster (the application's limiter actor, with `[auth]`): `take` holds one slot
    under every key's `concurrent_runs` cap for at most `ttl_s` (a replica that dies holding it frees it then)
    and answers {"ok": True, "run_id"} or {"ok": False, "key", "retry_after_s", ...}; `give_back` frees it."""

    async def take(self, keyed: KeyedLimits, ttl_s: float) -> Decision: ...

    async def give_back(self, keys: list[str], slot: str) -> None: ...


class OutboundGate:
    """Calls in flight per destination and per principal, refused beyond the caps: in this process, and across
    the replicas when `shared` counts them for the cluster (each replica alone would let a caller hold its caps
    once per replica)."""

    def __init__(self, per_destination: int, per_principal: int, shared: SharedSlots | None = None) -> None:
        self.per_destination, self.per_principal = per_destination, per_principal
        self.shared = shared
        self.destinations: Counter[str] = Counter()
        self.principals: Counter[str] = Counter()
        self._giving_back: set[asyncio.Future[None]] = set()

    def _at_cap(self, principal: str | None) -> RateLimitedError | OverloadedError:  # the principal's cap, else the destination's
        if principal is not None:
            return RateLimitedError(
                f"rate limited: {principal!r} already has {self.per_principal} remote-agent calls in flight "
                "([egress] max_per_principal); retry when one ends",
                {"retry_after_s": 1.0, "limit_name": "remote_calls_in_flight", "limit": self.per_principal, "remaining": 0},
            )
        return OverloadedError(
            f"overloaded: {self.per_destination} calls to this remote agent's host are in flight "
            "([egress] max_per_destination); retry later",
            {"retry_after_s": 1.0},
        )

    @asynccontextmanager
    async def slot(self, destination: str, principal: str, ttl_s: float = 300.0) -> AsyncIterator[None]:
        """Hold a slot for one outbound call of `principal` to `destination`; `ttl_s` bounds how long the cluster's
        count keeps it if this process dies holding it (the call's own limit, with a margin)."""
        if self.principals[principal] >= self.per_principal:
            raise self._at_cap(principal)
        if self.destinations[destination] >= self.per_destination:
            raise self._at_cap(None)
        self.principals[principal] += 1
        self.destinations[destination] += 1
        mine, there = f"egress:principal:{principal}", f"egress:destination:{destination}"  # the cluster's counts
        taken: Decision | None = None
        try:
            if self.shared is not None:
                keyed: KeyedLimits = [(mine, {"concurrent_runs": self.per_principal}), (there, {"concurrent_runs": self.per_destination})]
                taken = await self.shared.take(keyed, ttl_s)
                if not taken["ok"]:
                    raise self._at_cap(principal if taken.get("key") == mine else None)
            yield
        finally:
            self.principals -= Counter([principal])  # a count that reaches 0 leaves the Counter
            self.destinations -= Counter([destination])
            if self.shared is not None and taken is not None and taken["ok"]:
                # given back whatever ends the call (a cancelled caller too), without holding up its end
                done = asyncio.ensure_future(self.shared.give_back([mine, there], str(taken.get("run_id"))))
                self._giving_back.add(done)
                done.add_done_callback(self._given_back)

    def _given_back(self, done: asyncio.Future[None]) -> None:
        self._giving_back.discard(done)
        if not done.cancelled() and (error := done.exception()) is not None:
            log.warning("egress.slot_not_given_back", error=f"{type(error).__name__}: {error}"[:200])


class Egress:
    """The policy, the gate and the clients of one application's outbound calls on callers' behalf."""

    def __init__(
        self, settings: EgressSettings | None = None, environ: dict[str, str] | None = None, shared: SharedSlots | None = None
    ) -> None:
        self.settings = settings or EgressSettings()
        self.policy = EgressPolicy(self.settings)
        self.gate = OutboundGate(self.settings.max_per_destination, self.settings.max_per_principal, shared)
        env = os.environ if environ is None else environ
        self._credentials: dict[tuple[str, int], tuple[str, str]] = {}
        for entry, credential in self.settings.credentials.items():
            secret = env.get(credential.token_env)
            if not secret:
                log.warning("egress.credential_missing", destination=entry, variable=credential.token_env)
                continue
            value = f"{credential.scheme} {secret}" if credential.scheme else secret
            self._credentials[split_host_port(entry)] = (credential.header, value)

    def client(self, total_s: float) -> httpx.AsyncClient:
        """An httpx client whose connections pass the policy; `total_s` bounds each read and write, the
        caller bounds the whole call (asyncio.timeout)."""
        # httpx takes no network backend: the pool its transport built is replaced by one whose connections pass the
        # policy (same TLS context, no proxy; no unix socket either: the pool is given no path)
        transport = httpx.AsyncHTTPTransport(trust_env=False, retries=0)
        ssl_context = httpx.create_ssl_context(trust_env=False)
        transport._pool = httpcore.AsyncConnectionPool(ssl_context=ssl_context, network_backend=_PolicyBackend(self.policy), retries=0)
        return httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(total_s, connect=self.settings.connect_timeout_s),
            follow_redirects=True,
            max_redirects=MAX_REDIRECTS,
            trust_env=False,
            event_hooks={"request": [self._credential]},
        )

    async def _credential(self, request: httpx.Request) -> None:
        port = request.url.port or DEFAULT_PORTS.get(request.url.scheme, 0)
        found = self._credentials.get((request.url.host.lower(), port))
        # a redirect's request copies the previous one's headers: another host's secret must not travel on
        for header, _ in self._credentials.values():
            request.headers.pop(header, None)
        if found is not None:
            request.headers[found[0]] = found[1]
