"""The `[auth]` section of config.toml: how tokens are verified, what each role may do, and the limits.

Kept out of config.py so the identity settings read as one unit; `Settings.auth` is this model.
Authentication is on as soon as a secret (HS256) or a JWKS source (RS256/ES256) is configured.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Algorithm = Literal["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]


class Section(BaseModel):
    """A section of config.toml: frozen, and an unknown key in it is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitSettings(Section):
    """Limits of one principal (per role, per principal or per strategy); omitted: unlimited."""

    requests_per_minute: int | None = Field(None, ge=1, description="Calls of any method per rolling minute.")
    concurrent_runs: int | None = Field(None, ge=1, description="Runs (reasoning, session turns) in flight at once.")
    tokens_per_minute: int | None = Field(None, ge=1, description="LLM tokens (prompt + completion) per rolling minute.")
    tokens_per_day: int | None = Field(None, ge=1, description="LLM tokens (prompt + completion) per rolling 24 hours.")


class RoleSettings(Section):
    """What one role grants: method and strategy name patterns (fnmatch, e.g. `memory.*`), and its limits."""

    methods: list[str] = Field(default_factory=list, description="Methods the role may call (patterns).")
    strategies: list[str] = Field(default_factory=list, description="Strategies the role may run (patterns).")
    all_owners: bool = Field(False, description="Reads and changes every principal's sessions, cards and workspaces (admin).")
    limits: LimitSettings = Field(default_factory=LimitSettings, description="Limits of a principal holding this role.")


_READ = [
    "reasoning.strategies",
    "agent.get",
    "agent.list",
    "agent.discover",
    "session.get",
    "session.tools",
    "memory.retrieve",
    "memory.get",
    "memory.genealogy",
    "memory.descendants",
    "memory.errors",
    "memory.traces",
    "memory.list_workspaces",
    "retrieve_memories",
    "get_memory_genealogy",
    "stats.get",
    "get_statistics",
]
_REASON = [
    *_READ,
    "reasoning.*",
    "session.*",
    "agent.register",
    "agent.unregister",
    "memory.store",
    "memory.delete_workspace",
    "memory.share_workspace",  # an owner sharing its own workspace read-only; the guard checks ownership
    "solve_coding_task",
]

# Sized for one small team on one replica (docs/security.md#default-limits): a person working through a
# client or a notebook stays far below them; a token holder scripting a flood, or a leaked token, is
# stopped within a minute at a cost an operator can see coming. Roles in config.toml replace these.
TEAM_READER_LIMITS = LimitSettings(requests_per_minute=120)
TEAM_REASONER_LIMITS = LimitSettings(requests_per_minute=120, concurrent_runs=4, tokens_per_minute=200_000, tokens_per_day=5_000_000)
TEAM_OPERATOR_LIMITS = LimitSettings(requests_per_minute=600, concurrent_runs=16, tokens_per_minute=1_000_000, tokens_per_day=20_000_000)

DEFAULT_ROLES: dict[str, RoleSettings] = {
    "reader": RoleSettings(methods=_READ, strategies=[], limits=TEAM_READER_LIMITS),
    "reasoner": RoleSettings(methods=_REASON, strategies=["*"], limits=TEAM_REASONER_LIMITS),
    "operator": RoleSettings(methods=["*"], strategies=["*"], limits=TEAM_OPERATOR_LIMITS),
    "admin": RoleSettings(methods=["*"], strategies=["*"], all_owners=True, limits=TEAM_OPERATOR_LIMITS),
}


class AuthSettings(Section):
    jwt_secret: str | None = Field(
        None, description="HS256 shared secret; setting it turns authentication on (env REASONRAY_AUTH__JWT_SECRET)."
    )
    jwks_url: str | None = Field(None, description="JWKS endpoint of the identity provider (RS256/ES256); turns authentication on.")
    jwks_file: str | None = Field(None, description="A local JWKS file instead of a URL; re-read when a token names an unknown key.")
    algorithms: list[Algorithm] = Field(
        default_factory=lambda: list[Algorithm](["HS256", "RS256", "ES256"]),
        min_length=1,
        description="Accepted signature algorithms (never `none`).",
    )
    issuer: str | None = Field(None, description="When set, tokens must carry this `iss`.")
    audience: str | None = Field(None, description="When set, tokens must carry this `aud`.")
    leeway_s: float = Field(30.0, ge=0, le=600, description="Clock skew tolerated on exp / nbf / iat.")
    default_ttl_s: int = Field(3600, ge=1, description="Lifetime of tokens `reasonray token create` mints without --ttl.")
    roles: dict[str, RoleSettings] = Field(default_factory=lambda: dict(DEFAULT_ROLES), description="Roles by name.")
    principals: dict[str, LimitSettings] = Field(
        default_factory=dict, description="Limits of named principals (by `sub`), replacing those of their roles."
    )
    strategy_limits: dict[str, LimitSettings] = Field(
        default_factory=dict, description="Extra limits per strategy, counted per principal and strategy."
    )
    audit: bool = Field(True, description="Write the audit log (data_dir/audit/audit.jsonl) when authentication is on.")

    @property
    def enabled(self) -> bool:
        return bool(self.jwt_secret or self.jwks_url or self.jwks_file)

    @model_validator(mode="after")
    def _sound(self) -> AuthSettings:
        if self.jwt_secret is not None and len(self.jwt_secret) < 32:
            raise ValueError("jwt_secret must be at least 32 characters (e.g. `openssl rand -hex 32`)")
        if self.jwks_url and self.jwks_file:
            raise ValueError("set jwks_url or jwks_file, not both")
        return self
