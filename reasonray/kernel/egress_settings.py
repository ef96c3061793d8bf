"""The `[egress]` section of config.toml: where the service may connect on a caller's behalf, and how long.

Remote A2A agents (their cards and their message endpoints) are the calls a caller steers: the caller
names the URL. They go through the egress policy of `reasonray.api.access.egress`; these are its settings.
Kept out of config.py so the policy reads as one unit; `Settings.egress` is this model.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from reasonray.kernel.auth_settings import Section

_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)):(?P<port>\d{1,5})$")


def split_host_port(entry: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port` for IPv6) -> (lower-cased host, port); ValueError saying what is wrong."""
    match = _HOST_PORT.fullmatch(entry.strip())
    if match is None or not 1 <= int(match["port"]) <= 65535:
        raise ValueError(f"{entry!r} is not host:port (e.g. agents.example.com:443, 10.0.0.7:9000, [fd00::7]:9000)")
    return (match["v6"] or match["name"]).lower(), int(match["port"])


class EgressCredential(Section):
    """What the service sends to one remote host: a secret read from the environment, never from this file."""

    token_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Environment variable holding the secret.")
    header: str = Field("Authorization", pattern=r"^[A-Za-z0-9-]{1,64}$", description="Header that carries it.")
    scheme: str = Field("Bearer", max_length=32, description="Prefix before the secret ('' for a bare value, e.g. an API key header).")


class EgressSettings(Section):
    allow_hosts: list[str] = Field(
        default_factory=list,
        description="host:port entries remote A2A agents may be reached at (env REASONRAY_EGRESS__ALLOW_HOSTS, a JSON list). "
        "Empty: remote agents are off. A private, loopback or link-local address is reached only when an entry names it "
        "(an IP address, or localhost).",
    )
    connect_timeout_s: float = Field(3.0, gt=0, le=60, description="Seconds to open a connection to a remote agent.")
    card_timeout_s: float = Field(10.0, gt=0, le=120, description="Seconds to fetch and validate an agent card, in all.")
    call_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="Seconds one forwarded message may take, in all (a request's budget.deadline_s cuts it shorter)."
    )
    max_per_destination: int = Field(16, ge=1, le=10_000, description="Calls in flight to one host:port from one replica; beyond: 503.")
    max_per_principal: int = Field(
        4, ge=1, le=10_000, description="Remote-agent calls one principal has in flight on one replica; beyond: 429."
    )
    credentials: dict[str, EgressCredential] = Field(
        default_factory=dict, description="Credentials sent to remote agents, by host:port (each must be in allow_hosts)."
    )

    @field_validator("allow_hosts")
    @classmethod
    def _host_ports(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            split_host_port(entry)
        return entries

    @model_validator(mode="after")
    def _credentials_listed(self) -> EgressSettings:
        listed = {split_host_port(e) for e in self.allow_hosts}
        for entry in self.credentials:
            if split_host_port(entry) not in listed:
                raise ValueError(f"credentials for {entry!r}: that host:port is not in allow_hosts")
        return self
