"""Who is calling: bearer JWTs verified into principals, and what their roles let them call and run.

Transport-free. The Serve ingress verifies the `Authorization` header of every request (but the
public liveness probe) with a `TokenVerifier` and puts the `Principal` in `CURRENT_PRINCIPAL`; the
dispatcher's guard (`reasonray.api.access.tenancy`) reads it from there, so no route can forget it.
Tokens: HS256 with `[auth] jwt_secret`, or RS256/ES256 against a JWKS (URL or file, keys re-read
when a token names an unknown `kid`, so rotation needs no restart). Claims: `sub` is the principal,
`roles` a list of role names, optional `agent_id` binds the principal to that AgentCard.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import time
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jwt

from reasonray.kernel.auth_settings import AuthSettings, LimitSettings, RoleSettings
from reasonray.kernel.errors import UnauthenticatedError

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
VERIFIED_FOR_S = 60.0
"""How long a verified token is taken again without checking its signature (never past its exp): a client sends
the same token with every request, and verifying it was a twentieth of the replica's CPU under load. Bounded so
that a key removed from the JWKS stops admitting its tokens within a minute."""
VERIFIED_KEPT = 4096

Claims = dict[str, Any]
"""A token's claims as PyJWT decodes them: an open JSON object (an issuer may add claims of its own)."""


@dataclass(frozen=True)
class Principal:
    """The verified caller: `sub`, its roles, and the AgentCard it is bound to, if any."""

    sub: str
    roles: tuple[str, ...] = ()
    agent_id: str | None = None


REMOTE_AGENTS = "agent.register_remote"
"""The right, matched against a role's `methods` like a method name, to register a remote A2A agent
(`agent.register` with `a2a_card_url`): the service then calls a URL of the caller's choosing."""

CURRENT_PRINCIPAL: ContextVar[Principal | None] = ContextVar("reasonray_principal", default=None)
"""The caller of the request being served; None when authentication is off (or not yet checked)."""


def principal_trace_id(given: str | None) -> str | None:
    """A trace id the caller chose (X-Trace-Id, traceparent), made the caller's own when it is authenticated:
    suffixed with a digest of its `sub`, so that no principal can name (and append to, or overwrite) the
    event log and run record of another principal's trace. Unchanged with authentication off."""
    principal = CURRENT_PRINCIPAL.get()
    if given is None or principal is None:
        return given
    digest = hashlib.sha256(principal.sub.encode()).hexdigest()[:12]
    return f"{given[:100]}.u{digest}"


def mint_token(
    secret: str,
    sub: str,
    roles: list[str],
    ttl_s: int,
    *,
    issuer: str | None = None,
    audience: str | None = None,
    agent_id: str | None = None,
) -> str:
    """An HS256 token for local use (`reasonray token create`)."""
    now = int(time.time())
    claims: Claims = {"sub": sub, "roles": list(roles), "iat": now, "nbf": now, "exp": now + ttl_s}
    claims |= {name: value for name, value in (("iss", issuer), ("aud", audience), ("agent_id", agent_id)) if value}
    return jwt.encode(claims, secret, algorithm="HS256")


class TokenVerifier:
    """Verifies bearer JWTs against the configured secret or JWKS, with exp always and iss/aud when configured."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.algorithms = [a for a in settings.algorithms if a not in HMAC_ALGORITHMS or settings.jwt_secret]
        # PyJWKClient keeps the key set and fetches it again when a token names a kid it does not hold
        self._jwks: jwt.PyJWKClient | None = None
        if settings.jwks_url:
            self._jwks = jwt.PyJWKClient(settings.jwks_url, cache_jwk_set=True, lifespan=300, cooldown_duration=30)
        elif settings.jwks_file:
            self._jwks = FileJWKClient(Path(settings.jwks_file))
        else:
            self.algorithms = [a for a in self.algorithms if a in HMAC_ALGORITHMS]
        self._options: jwt.types.Options = {"require": ["exp", "sub"], "verify_aud": settings.audience is not None}
        self._verified: dict[str, tuple[Principal, float]] = {}  # token -> (its principal, taken until; epoch s)

    def verify(self, authorization: str | None) -> Principal:
        """The principal of an `Authorization: Bearer <token>` header, or an error saying what is wrong with it."""
        if not authorization:
            raise UnauthenticatedError("missing credentials: send `Authorization: Bearer <token>` (see docs/security.md)")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError("malformed Authorization header: expected `Bearer <token>`")
        return self.principal(token.strip())

    def principal(self, token: str) -> Principal:
        now = time.time()
        hit = self._verified.get(token)
        if hit is not None and now < hit[1]:
            return hit[0]
        principal, exp = self._verify(token)
        if len(self._verified) >= VERIFIED_KEPT:  # many callers: keep the live ones, or start over
            live = {t: v for t, v in self._verified.items() if now < v[1]}
            self._verified = live if len(live) < VERIFIED_KEPT else {}
        self._verified[token] = (principal, min(exp + self.settings.leeway_s, now + VERIFIED_FOR_S))
        return principal

    def _verify(self, token: str) -> tuple[Principal, float]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise UnauthenticatedError("malformed token: not a JWS compact serialization") from None
        algorithm = header.get("alg")
        if algorithm not in self.algorithms:
            raise UnauthenticatedError(f"token algorithm {algorithm!r} is not accepted (accepted: {', '.join(self.algorithms)})")
        s = self.settings
        try:
            key: Any = s.jwt_secret if algorithm in HMAC_ALGORITHMS else self._jwk(header.get("kid"))
            claims: Claims = jwt.decode(
                token, key, algorithms=[algorithm], audience=s.audience, issuer=s.issuer, leeway=s.leeway_s, options=self._options
            )
        except jwt.ExpiredSignatureError:
            raise UnauthenticatedError("token expired: get a new one") from None
        except jwt.ImmatureSignatureError:
            raise UnauthenticatedError("token not yet valid (nbf / iat in the future)") from None
        except jwt.MissingRequiredClaimError as exc:
            raise UnauthenticatedError(f"token lacks the required claim {exc.claim!r}") from None
        except jwt.InvalidAudienceError:
            raise UnauthenticatedError(f"token audience is wrong: this server accepts aud {s.audience!r}") from None
        except jwt.InvalidIssuerError:
            raise UnauthenticatedError(f"token issuer is wrong: this server accepts iss {s.issuer!r}") from None
        except (jwt.InvalidSignatureError, jwt.InvalidKeyError, jwt.PyJWKClientError, jwt.exceptions.PyJWKError):
            # one answer for a bad signature, an unknown key or a key of the wrong type: nothing to probe with
            raise UnauthenticatedError("invalid token: signature verification failed") from None
        except jwt.InvalidTokenError:
            raise UnauthenticatedError("malformed token") from None
        sub, roles, agent_id = claims.get("sub"), claims.get("roles", []), claims.get("agent_id")
        if not isinstance(sub, str) or not sub or len(sub) > 256:
            raise UnauthenticatedError("token `sub` must be a non-empty string (the principal)")
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise UnauthenticatedError("token `roles` must be a list of role names")
        if agent_id is not None and not isinstance(agent_id, str):
            raise UnauthenticatedError("token `agent_id` must be a string")
        return Principal(sub=sub, roles=tuple(roles), agent_id=agent_id), float(claims["exp"])

    def _jwk(self, kid: str | None) -> Any:
        assert self._jwks is not None  # asymmetric algorithms are accepted only with a JWKS source
        if kid is None:
            raise jwt.PyJWKClientError("no kid")
        return self._jwks.get_signing_key(kid).key


class FileJWKClient(jwt.PyJWKClient):
    """PyJWKClient over a local JWKS file (PyJWT fetches only http(s)); re-read at once for an unknown kid."""

    def __init__(self, path: Path) -> None:
        super().__init__("https://jwks.invalid/", cache_jwk_set=True, lifespan=300, cooldown_duration=0)
        self.path = path

    def fetch_data(self) -> Any:
        try:
            jwk_set = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise jwt.PyJWKClientConnectionError(f"cannot read the JWKS file {self.path}: {exc}") from exc
        if self.jwk_set_cache is not None:
            self.jwk_set_cache.put(jwk_set)
        return jwk_set


class Policy:
    """Roles to permissions: which methods and strategies a principal may use, whose data it sees, its limits."""

    def __init__(self, settings: AuthSettings) -> None:
        self.roles: dict[str, RoleSettings] = settings.roles
        self.principals = settings.principals
        self.strategy_limits = settings.strategy_limits
        self._grants = lru_cache(maxsize=4096)(self._grant)

    def may_call(self, principal: Principal, method: str) -> bool:
        return self._grants(principal.roles, "methods", method)

    def may_run(self, principal: Principal, strategy: str) -> bool:
        return self._grants(principal.roles, "strategies", strategy)

    def known(self, principal: Principal) -> bool:
        """Whether the principal holds at least one configured role (else it gets the public routes only)."""
        return any(r in self.roles for r in principal.roles)

    def sees_all(self, principal: Principal) -> bool:
        return any(self.roles[r].all_owners for r in principal.roles if r in self.roles)

    def limits(self, principal: Principal) -> LimitSettings:
        """The principal's own limits when configured, else the most generous of its roles' (None wins: unlimited)."""
        if principal.sub in self.principals:
            return self.principals[principal.sub]
        limits = [self.roles[r].limits for r in principal.roles if r in self.roles]
        if not limits:
            return LimitSettings(requests_per_minute=1, concurrent_runs=1, tokens_per_minute=1, tokens_per_day=1)
        values = {name: [getattr(lim, name) for lim in limits] for name in LimitSettings.model_fields}
        return LimitSettings(**{name: None if None in v else max(v) for name, v in values.items()})

    def _grant(self, roles: tuple[str, ...], kind: str, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for r in roles if r in self.roles for p in getattr(self.roles[r], kind))
