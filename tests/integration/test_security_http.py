"""Hostile requests through the running service (Ray Serve over HTTP, the simulated model): each case
fails safely, with a JSON body naming what was wrong and no 5xx. (It lives
here for the session-wide cluster fixtures; the sandbox escapes and the fuzzing are in tests/security/.)"""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
import schemathesis.specs.openapi.schemas  # see below
from hypothesis import HealthCheck, given, settings

from tests.integration.conftest import result_of, rpc

# schemathesis imports its OpenAPI loader at the first `from_url`, and pytest rewrites the module's asserts as it
# compiles it: done mid-suite, beside the simulated model's server threads, that compile once failed in CPython
# 3.11.7 with "AST constructor recursion depth mismatch". Imported above, it compiles at collection, before any
# thread of the suite starts.


def post(client: httpx.Client, body: bytes | str, path: str = "/rpc", **headers: str) -> httpx.Response:
    return client.post(path, content=body, headers={"Content-Type": "application/json", **headers})


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    return body["error"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_only_json_is_read_so_a_web_page_cannot_post_without_a_preflight(api, content_type):
    call = json.dumps({"jsonrpc": "2.0", "method": "reasoning.strategies", "id": 1})
    for path in ("/rpc", "/v1/reasoning/execute"):
        response = api.post(path, content=call, headers={"Content-Type": content_type})
        assert response.status_code == 415, (path, response.status_code, response.headers, response.text[:300])
        assert "application/json" in error_of(response)["message"]


def test_a_rebound_host_name_is_refused(api):
    response = api.post("/rpc", json={"jsonrpc": "2.0", "method": "reasoning.strategies", "id": 1}, headers={"Host": "evil.example:8000"})
    assert response.status_code == 400 and "allowed_hosts" in error_of(response)["message"]
    assert api.get("/healthz", headers={"Host": "evil.example"}).status_code == 400
    assert api.get("/healthz", headers={"Host": "localhost:8000"}).status_code == 200


def test_cors_is_off_by_default(api):
    preflight = api.options(
        "/rpc",
        headers={
            "Origin": "https://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert "access-control-allow-origin" not in preflight.headers
    answer = rpc(api, "reasoning.strategies", {}, id=1)
    assert "access-control-allow-origin" not in answer.headers


def test_deep_nesting_huge_ids_and_lone_surrogates_are_client_errors(api):
    cases = {
        "nesting": "[" * 100_000,
        "nested params": json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "reasoning.execute",
                "params": {"query": "q", "strategy_config": {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}},
                "id": 1,
            }
        ),
        "5000-digit id": '{"jsonrpc": "2.0", "method": "reasoning.strategies", "id": ' + "9" * 5000 + "}",
        "big id": '{"jsonrpc": "2.0", "method": "reasoning.strategies", "id": ' + "9" * 30 + "}",
        "surrogate id": '{"jsonrpc": "2.0", "method": "reasoning.strategies", "id": "\\ud800"}',
        "surrogate in a batch": '[{"jsonrpc": "2.0", "method": "reasoning.strategies", "id": 1}, {"jsonrpc": "2.0", "method": "reasoning.strategies", "id": "\\udfff"}]',
        "surrogate query": '{"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "\\ud800 2+2"}, "id": 1}',
    }
    for name, body in cases.items():
        response = post(api, body)
        assert response.status_code < 500, (name, response.status_code, response.text[:300])
        error = error_of(response)
        assert error["code"] in (-32700, -32600, -32602), (name, error)
    rest = post(api, '{"query": "\\ud800"}', path="/v1/reasoning/execute")
    assert 400 <= rest.status_code < 500 and "surrogate" in error_of(rest)["message"]
    assert post(api, "{oops").json()["error"]["code"] == -32700


def test_body_and_batch_caps_name_their_keys(api):
    big = json.dumps({"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "x" * 1_100_000}, "id": 1})
    response = post(api, big)
    assert response.status_code == 413 and "max_body_bytes" in error_of(response)["message"]
    batch = [{"jsonrpc": "2.0", "method": "reasoning.strategies", "id": i} for i in range(21)]
    error = error_of(post(api, json.dumps(batch)))
    assert error["code"] == -32602 and "max_batch_size" in error["message"]
    assert len(post(api, json.dumps(batch[:20])).json()) == 20


@pytest.mark.parametrize(
    ("strategy", "config", "key"),
    [
        ("self_consistency", {"samples": 20, "max_tokens": 262_144}, "max_samples"),
        ("chain_of_thought", {"max_tokens": 262_144}, "max_tokens"),
        ("tree_of_thought", {"max_nodes": 500}, "max_tree_nodes"),
        ("tree_of_thought", {"votes": 8, "evaluation": "vote"}, "max_tree_votes"),
        ("matts", {"k": 5, "base_strategy": "refine", "base_config": {"max_iterations": 10}}, "max_matts_work"),
    ],
)
def test_strategy_caps_are_invalid_params_naming_the_key(api, strategy, config, key):
    response = rpc(api, "reasoning.execute", {"query": "What is 2 + 2?", "strategy": strategy, "strategy_config": config})
    error = error_of(response)
    assert error["code"] == -32602 and f"[limits] {key}" in error["message"], error
    rest = api.post("/v1/reasoning/execute", json={"query": "What is 2 + 2?", "strategy": strategy, "strategy_config": config})
    assert rest.status_code == 400 and rest.json()["error"]["code"] == -32602


def test_healthz_says_only_ok_or_degraded(api):
    body = api.get("/healthz").json()
    assert body == {"status": "ok"}
    assert "base_url" in api.get("/admin/health").json()["llm"]


def test_schemathesis_finds_no_5xx_from_the_openapi_schema(api):
    # no input is a server error: every 5xx would be ours, except the model's own failure to do what was validly asked
    base = str(api.base_url).rstrip("/")
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(operation.as_strategy())
        def no_5xx(case):
            response = case.call(base_url=base)
            if response.status_code == 502:  # valid input the model could not satisfy (a response_format, say): its failure
                error = response.json()["error"]
                assert error["code"] == -32010 and error["data"]["error_type"] == "model_behavior", error
                return
            assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
            if response.status_code >= 400:
                body = response.json()
                assert "error" in body or "detail" in body, body

        no_5xx()


def test_the_python_tool_of_a_session_runs_isolated_over_http(api):
    # the escape once run over HTTP: defeat the audit hook, run `id`, read the parent's environ, open a socket
    code = (
        "import __main__; __main__._BLOCKED = ()\n"
        "import os, socket, subprocess\n"
        "uid = subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip()\n"
        "try:\n"
        "    open(f'/proc/{os.getppid()}/environ').read(); environ = 'READ'\n"
        "except OSError:\n"
        "    environ = 'DENIED'\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 8000), timeout=2); net = 'CONNECTED'\n"
        "except OSError:\n"
        "    net = 'NO-NETWORK'\n"
        "print(uid, environ, net, os.path.exists(os.path.expanduser('~root/.ray')), sorted(os.environ))\n"
    )
    sid = result_of(rpc(api, "session.create", {"server_tools": ["python"]}))["session_id"]
    message = "Run this. [[sim call=python " + json.dumps({"code": code}) + "]]"
    turn = result_of(rpc(api, "session.turn", {"session_id": sid, "message": message}))
    assert turn["status"] == "completed", turn
    assert "64999 DENIED NO-NETWORK False ['HOME', 'LANG', 'PATH', 'PWD']" in turn["answer"], turn["answer"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_ten_thousand_fuzzed_requests_through_the_service_get_no_5xx(api):
    """The in-process fuzzer's bodies (envelopes, every method's params, hostile bodies), sent to the running
    service over HTTP, 16 at a time: every answer is a 4xx with a JSON error or a well-formed JSON-RPC answer."""
    import asyncio

    from hypothesis import strategies as st

    from tests.security.test_fuzz_jsonrpc import bodies

    drawn: list[bytes] = []

    @settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.data())
    def collect(data):
        body = data.draw(bodies)
        drawn.append(body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body)

    while len(drawn) < 10_000:  # hypothesis may stop a run early when it has seen everything it can make
        collect()
    drawn[:] = drawn[:10_000]
    failures: list[str] = []

    async def send(client: httpx.AsyncClient, slots: asyncio.Semaphore, body: bytes) -> None:
        async with slots:
            response = await client.post("/rpc", content=body, headers={"Content-Type": "application/json"})
        if response.status_code >= 500:
            failures.append(f"{response.status_code}: {body[:200]!r} -> {response.text[:300]}")
        elif response.status_code >= 400:
            if "error" not in response.json():
                failures.append(f"{response.status_code} without an error body: {body[:200]!r}")
        elif response.content:  # 204/empty for notifications only
            answers = response.json()
            for answer in answers if isinstance(answers, list) else [answers]:
                if answer.get("jsonrpc") != "2.0" or ("result" in answer) == ("error" in answer):
                    failures.append(f"malformed answer {str(answer)[:200]} to {body[:200]!r}")
                elif "error" in answer and answer["error"]["code"] == -32603:
                    failures.append(f"internal error {answer['error']} for {body[:200]!r}")

    async def main() -> None:
        slots = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=str(api.base_url), timeout=300) as client:
            await asyncio.gather(*(send(client, slots, body) for body in drawn))

    asyncio.run(main())
    assert len(drawn) == 10_000
    assert not failures, f"{len(failures)} of 10,000 failed; first: {failures[:5]}"
