"""Bearer tokens (HS256, RS256/ES256 via a JWKS file with key rotation) and roles to permissions."""

import json
import time

import jwt
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from reasonray.api.access.auth import Policy, Principal, TokenVerifier, mint_token
from reasonray.kernel.auth_settings import AuthSettings
from reasonray.kernel.errors import UnauthenticatedError

SECRET = "s" * 64  # long enough for HS512 too (RFC 7518 3.2), which one test signs with to see it refused


def verifier(**kw) -> TokenVerifier:
    return TokenVerifier(AuthSettings(jwt_secret=SECRET, **kw))


def hs256(claims: dict, secret: str = SECRET, **kw) -> str:
    now = int(time.time())
    return jwt.encode({"sub": "alice", "roles": ["reasoner"], "iat": now, "exp": now + 60, **claims}, secret, algorithm="HS256", **kw)


def refused(v: TokenVerifier, token: str | None) -> str:
    with pytest.raises(UnauthenticatedError) as caught:
        v.verify(None if token is None else f"Bearer {token}")
    return caught.value.message


def test_a_minted_token_verifies_into_its_principal():
    token = mint_token(SECRET, "alice", ["reader", "reasoner"], 60, agent_id="planner")
    principal = verifier().verify(f"Bearer {token}")
    assert (principal.sub, principal.roles, principal.agent_id) == ("alice", ("reader", "reasoner"), "planner")


@pytest.mark.parametrize(
    ("token", "says"),
    # tokens are made when the test runs, not at collection: a collected token's `exp` can pass before a
    # long suite reaches it
    [
        (lambda: None, "missing credentials"),
        (lambda: hs256({"exp": int(time.time()) - 120}), "token expired"),
        (lambda: hs256({"nbf": int(time.time()) + 600}), "not yet valid"),
        (lambda: hs256({}, secret="t" * 40), "signature verification failed"),
        (lambda: hs256({"exp": None}), "required claim 'exp'"),
        (lambda: hs256({"roles": "admin"}), "`roles` must be a list"),
        (lambda: "not-a-jwt", "malformed token"),
    ],
    ids=["missing", "expired", "not-yet-valid", "bad-signature", "no-exp", "roles-not-a-list", "garbage"],
)
def test_refusals_say_what_is_wrong(token, says):
    assert says in refused(verifier(), token())


def test_none_and_unlisted_algorithms_are_refused():
    unsigned = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, None, algorithm="none")
    assert "algorithm 'none' is not accepted" in refused(verifier(), unsigned)
    hs512 = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, SECRET, algorithm="HS512")
    assert "algorithm 'HS512' is not accepted" in refused(verifier(), hs512)
    # RS256 with no JWKS configured: not a way in either
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rs = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, key, algorithm="RS256")
    assert "algorithm 'RS256' is not accepted" in refused(verifier(), rs)


def test_audience_and_issuer_are_checked_only_when_configured():
    token = hs256({"aud": "other", "iss": "someone"})
    assert verifier().verify(f"Bearer {token}").sub == "alice"
    assert "audience is wrong" in refused(verifier(audience="reasonray"), token)
    assert "issuer is wrong" in refused(verifier(issuer="https://idp"), hs256({"iss": "someone"}))
    good = mint_token(SECRET, "bob", [], 60, issuer="https://idp", audience="reasonray")
    assert verifier(issuer="https://idp", audience="reasonray").verify(f"Bearer {good}").sub == "bob"


def test_leeway_tolerates_small_clock_skew():
    token = hs256({"exp": int(time.time()) - 5})
    assert verifier(leeway_s=30).verify(f"Bearer {token}").sub == "alice"
    assert "expired" in refused(verifier(leeway_s=0), token)


def _jwk(public_key, kid: str, alg: str) -> dict:
    algo = jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm
    return {**json.loads(algo.to_jwk(public_key)), "kid": kid, "alg": alg, "use": "sig"}


def test_jwks_file_keys_rotate_without_a_restart(tmp_path):
    jwks = tmp_path / "jwks.json"
    old = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks.write_text(json.dumps({"keys": [_jwk(old.public_key(), "k1", "RS256")]}))
    v = TokenVerifier(AuthSettings(jwks_file=str(jwks)))
    claims = {"sub": "svc", "roles": ["reader"], "exp": int(time.time()) + 60}
    assert v.verify("Bearer " + jwt.encode(claims, old, algorithm="RS256", headers={"kid": "k1"})).sub == "svc"

    new = ec.generate_private_key(ec.SECP256R1())
    jwks.write_text(json.dumps({"keys": [_jwk(new.public_key(), "k2", "ES256")]}))  # k1 retired, k2 published
    assert v.verify("Bearer " + jwt.encode(claims, new, algorithm="ES256", headers={"kid": "k2"})).sub == "svc"
    # a token signed by a key that is not published, and HS256 (no secret configured): refused alike
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert "signature verification failed" in refused(v, jwt.encode(claims, stranger, algorithm="RS256", headers={"kid": "k9"}))
    assert "not accepted" in refused(v, hs256({}))


def test_a_hmac_token_signed_with_the_public_key_is_refused(tmp_path):
    """The classic confusion attack: RS256 public key material used as an HS256 secret."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [_jwk(key.public_key(), "k1", "RS256")]}))
    v = TokenVerifier(AuthSettings(jwks_file=str(jwks), algorithms=["RS256"]))
    forged = jwt.encode({"sub": "x", "exp": int(time.time()) + 60}, "k" * 40, algorithm="HS256", headers={"kid": "k1"})
    assert "'HS256' is not accepted" in refused(v, forged)


def test_roles_grant_methods_and_strategies():
    policy = Policy(AuthSettings(jwt_secret=SECRET))
    reader, reasoner, admin = Principal("r", ("reader",)), Principal("a", ("reasoner",)), Principal("z", ("admin",))
    assert policy.may_call(reader, "memory.retrieve") and not policy.may_call(reader, "reasoning.execute")
    assert not policy.may_run(reader, "chain_of_thought")
    assert policy.may_call(reasoner, "reasoning.execute") and policy.may_run(reasoner, "tree_of_thought")
    assert not policy.may_call(reasoner, "stats.reset")
    assert policy.sees_all(admin) and not policy.sees_all(reasoner)
    assert not policy.may_call(Principal("nobody", ("unknown-role",)), "reasoning.strategies")


def test_configured_roles_restrict_strategies_and_merge_limits():
    settings = AuthSettings.model_validate(
        {
            "jwt_secret": SECRET,
            "roles": {
                "cheap": {"methods": ["reasoning.*"], "strategies": ["chain_*"], "limits": {"requests_per_minute": 10}},
                "bulk": {"methods": [], "limits": {"requests_per_minute": 100, "tokens_per_day": 5}},
            },
            "principals": {"vip": {"requests_per_minute": 1000}},
        }
    )
    policy = Policy(settings)
    p = Principal("u", ("cheap", "bulk"))
    assert policy.may_run(p, "chain_of_thought") and not policy.may_run(p, "tree_of_thought")
    assert policy.limits(p).requests_per_minute == 100 and policy.limits(p).tokens_per_day is None  # cheap has no day cap
    assert policy.limits(Principal("vip", ("cheap",))).requests_per_minute == 1000


def test_short_secrets_are_a_configuration_error():
    with pytest.raises(ValueError, match="at least 32 characters"):
        AuthSettings(jwt_secret="short")


def test_token_create_prints_the_token_alone(monkeypatch):
    from reasonray.cli import main

    monkeypatch.setenv("REASONRAY_AUTH__JWT_SECRET", SECRET)
    out = CliRunner().invoke(main, ["token", "create", "--sub", "alice", "--role", "reader", "--role", "reasoner", "--ttl", "90"])
    assert out.exit_code == 0, out.output
    token = out.output.strip()
    assert out.output == token + "\n"
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice" and claims["roles"] == ["reader", "reasoner"] and claims["exp"] - claims["iat"] == 90
    assert CliRunner().invoke(main, ["token", "create", "--sub", "a", "--role", "nope"]).exit_code == 2


def test_a_verified_token_is_taken_again_without_its_signature_until_its_exp(monkeypatch):
    import reasonray.api.access.auth as auth

    decoded = []
    decode = auth.jwt.decode
    monkeypatch.setattr(auth.jwt, "decode", lambda *a, **kw: decoded.append(1) or decode(*a, **kw))
    v = verifier(leeway_s=0)
    token = f"Bearer {hs256({'exp': int(time.time()) + 2})}"
    assert v.verify(token).sub == v.verify(token).sub == "alice"
    assert len(decoded) == 1  # the second request's token was known
    time.sleep(2.2)
    assert "token expired" in refused(v, token[len("Bearer ") :])  # past its exp it is checked again, and refused


def test_a_verified_token_is_checked_again_after_a_minute_at_most(monkeypatch):
    """A key withdrawn from the JWKS stops admitting its tokens within VERIFIED_FOR_S, whatever their exp."""
    import reasonray.api.access.auth as auth

    now = [time.time()]
    monkeypatch.setattr(auth.time, "time", lambda: now[0])
    decoded = []
    decode = auth.jwt.decode
    monkeypatch.setattr(auth.jwt, "decode", lambda *a, **kw: decoded.append(1) or decode(*a, **kw))
    v = verifier()
    token = f"Bearer {hs256({'exp': int(now[0]) + 3600})}"
    v.verify(token)
    now[0] += auth.VERIFIED_FOR_S - 1
    v.verify(token)
    assert len(decoded) == 1
    now[0] += 2
    v.verify(token)
    assert len(decoded) == 2
