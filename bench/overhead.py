"""What ReasonRay adds to one LLM call: `reasoning.execute` (chain_of_thought) through Ray Serve versus
the same chat completion sent straight to the same simulated model with the openai client, in one run;
and the cost of strategy resolution; and what authentication and rate limiting add to each request as
a user meets it: two copies of the service on one cluster, one with `[auth]` on (token verification,
roles, the tenancy guard, the limiter actor's round trips, the audit log) and one with it off, called
over HTTP in interleaved blocks with the same requests.

    .venv/bin/python bench/overhead.py [--requests 300] [--tracing-only] [--auth-only [--auth-requests 600]]
    .venv/bin/python bench/overhead.py --auth-in-process   # the guard alone, in this process, no Ray
    .venv/bin/python bench/overhead.py --path default      # CoT over Serve's proxy (auth off), paired with direct calls
    .venv/bin/python bench/overhead.py --path auth         # CoT with auth on (HAProxy ingress), paired with direct calls
    .venv/bin/python bench/overhead.py --path both         # both paths in one run, one after the other

Targets: resolution under 1 ms p50; added latency through Serve under 15 ms p50.
Target: authentication + rate limiting under 1 ms p50 per request.
Target: a CoT request adds under 8 ms p50 over a direct call, on both paths.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

import httpx
import openai
from _env import REPO, pct, serve_bench_app, simulated_settings, simulator_process, start_ray, timed

from reasonray.gateway.simulator.server import free_port
from reasonray.kernel.config import Settings, load_settings
from reasonray.strategies.chain_of_thought import SYSTEM_PROMPT
from reasonray.strategies.registry import StrategyRegistry, build_catalogue


def resolution_overhead(settings: Settings, n: int = 20_000) -> tuple[list[float], list[float]]:
    catalogue = build_catalogue(StrategyRegistry().discover(), settings.reasoning)

    def by_default(_):
        catalogue.resolve(None)

    def by_request(_):
        catalogue.resolve("chain_of_thought", {"max_tokens": 256, "temperature": 0.0})

    return timed(by_default, n), timed(by_request, n)


def tracing_overhead(n: int = 2000) -> None:
    """What OpenTelemetry tracing adds to one `reasoning.execute` (chain_of_thought, in-process simulated
    model, no network): the request, strategy and model-call spans exported to a local OTLP/HTTP
    receiver, against tracing off, alternating blocks in one process. Target: < 1 ms p50 added on,
    no measurable change off (the no-op span's own cost is printed too)."""
    import asyncio

    from reasonray.api.app import local_dispatcher
    from reasonray.api.surfaces.tracing import request_span
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.kernel import tracing
    from reasonray.kernel.config import ReasoningSettings
    from tests.otlp_receiver import OTLPReceiver

    receiver = OTLPReceiver().start()
    rpc = local_dispatcher(ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), SimulatedLLM())
    loop = asyncio.new_event_loop()
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

    def call(i: int) -> None:
        body = {"jsonrpc": "2.0", "id": i, "method": "reasoning.execute", "params": {"query": f"What is {i} * 7?"}}

        async def once() -> None:
            with request_span("/rpc", headers) as trace_id:
                payload, _ = await rpc.handle_payload(body, trace_id)
            assert "result" in payload, payload

        loop.run_until_complete(once())

    def mode(on: bool) -> None:
        if on:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        else:
            os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        tracing.reset_for_tests()

    off_ms: list[float] = []
    on_ms: list[float] = []
    try:
        for on in (False, True):  # warm-up
            mode(on)
            timed(call, 100)
        for block in range(0, n, 100):
            mode(False)
            off_ms += timed(lambda i, block=block: call(block + i), 100)
            mode(True)
            on_ms += timed(lambda i, block=block: call(block + i), 100)
        tracing.flush()
        exported = len(receiver.spans)
        mode(False)
        started = time.perf_counter()
        for _ in range(100_000):
            with tracing.span("noop", {"a": 1}):
                pass
        noop_ns = (time.perf_counter() - started) / 100_000 * 1e9
    finally:
        mode(False)
        receiver.stop()
        loop.close()
    o50, t50 = pct(off_ms, 0.5), pct(on_ms, 0.5)
    print(f"tracing: {n} reasoning.execute per mode, in-process simulated model, chain_of_thought (3 spans per request)")
    print(f"tracing off (OTEL_* unset)            p50 {o50:7.3f} ms   p95 {pct(off_ms, 0.95):7.3f} ms")
    print(f"tracing on, OTLP/HTTP to a local rcvr p50 {t50:7.3f} ms   p95 {pct(on_ms, 0.95):7.3f} ms   ({exported} spans exported)")
    print(f"added by tracing on                   p50 {t50 - o50:7.3f} ms   ratio p50 {t50 / o50:.2f}x")
    print(
        f"one no-op span with tracing off       {noop_ns:7.0f} ns   (x3 per request: {3 * noop_ns / 1e6 / o50 * 100:.3f}% of the off p50)"
    )
    print(f"target tracing on < 1 ms p50 added: {'PASS' if t50 - o50 < 1 else 'FAIL'}")


def auth_overhead(settings: Settings, n: int = 5_000) -> dict[str, tuple[list[float], list[float]]]:
    """Per method: the plain dispatcher, and bearer verification + the tenancy guard + the limiter around it."""
    import asyncio

    from reasonray.api.access.auth import CURRENT_PRINCIPAL, TokenVerifier, mint_token
    from reasonray.api.access.limits import LocalLimits
    from reasonray.api.access.tenancy import LocalOwners, build_guard, install_guard
    from reasonray.api.app import Backends, build_application
    from reasonray.gateway.testing import FunctionLLM
    from reasonray.kernel.auth_settings import AuthSettings

    secret = "bench-secret-" + "x" * 32
    auth = AuthSettings.model_validate(
        {"jwt_secret": secret, "audit": False, "principals": {"alice": {"requests_per_minute": 10**9, "tokens_per_day": 10**12}}}
    )
    loop = asyncio.new_event_loop()

    def dispatcher(guarded: bool):
        app_settings = settings.model_copy(update={"auth": auth})
        llm = FunctionLLM(lambda req: "<answer>1</answer>")
        application = build_application(app_settings, llm=llm, backends=Backends(cache=None, memory=None), data_dir=None)
        if guarded:  # the guard every entry point builds, its records in this process
            install_guard(
                application.dispatcher, build_guard(app_settings, application.registry, application.service, LocalOwners(), LocalLimits())
            )
        return application.dispatcher

    plain, guarded = dispatcher(False), dispatcher(True)
    verifier = TokenVerifier(auth)
    header = "Bearer " + mint_token(secret, "alice", ["reasoner"], 3600)
    card = {"id": "bench-agent", "name": "B", "capabilities": ["reasoning.strategy.chain_of_thought"]}
    CURRENT_PRINCIPAL.set(verifier.verify(header))
    for rpc in (plain, guarded):
        registered, _ = loop.run_until_complete(rpc.handle_payload({"jsonrpc": "2.0", "method": "agent.register", "params": card, "id": 0}))
        assert "result" in registered, registered

    def run(rpc, method: str, params: dict, verify: bool):
        def once(_):
            if verify:
                CURRENT_PRINCIPAL.set(verifier.verify(header))
            response, _ = loop.run_until_complete(rpc.handle_payload({"jsonrpc": "2.0", "method": method, "params": params, "id": 1}))
            assert "result" in response, response

        return once

    out = {}
    for method, params in (("reasoning.strategies", {}), ("agent.get", {"agent_id": "bench-agent"})):
        timed(run(plain, method, params, False), 500)
        timed(run(guarded, method, params, True), 500)
        base, auth_ms = [], []
        for _ in range(0, n, 500):  # interleaved blocks: both see the same machine load
            base += timed(run(plain, method, params, False), 500)
            auth_ms += timed(run(guarded, method, params, True), 500)
        out[method] = (base, auth_ms)
    loop.close()
    return out


def print_auth(figures: dict[str, tuple[list[float], list[float]]]) -> bool:
    ok = True
    for method, (base, auth_ms) in figures.items():
        b50, a50, a95 = pct(base, 0.5), pct(auth_ms, 0.5), pct(auth_ms, 0.95)
        added = a50 - b50
        ok = ok and added < 1.0
        print(
            f"auth + rate limit on {method:<21} p50 {b50 * 1000:7.1f} us -> {a50 * 1000:7.1f} us "
            f"(p95 {a95 * 1000:7.1f} us)   added p50 {added * 1000:6.1f} us   ratio {a50 / b50:.2f}x"
        )
    print(f"target auth + rate limiting < 1 ms p50: {'PASS' if ok else 'FAIL'}  (in process only: no HTTP, no limiter actor)")
    return ok


AUTH_SECRET = "bench-secret-" + "x" * 32
AUTH_SUB = "bench-user"


def auth_http_overhead(settings: Settings, n: int = 600, block: int = 50) -> dict[str, tuple[list[float], list[float]]]:
    """Per request as a user meets it: the same calls to the service with auth off and with auth on (the
    caller has a requests-per-minute limit, a concurrent-run limit and a token budget, so every check
    runs), over HTTP, one cluster, both apps behind the same ingress, interleaved blocks. Needs Ray
    initialised and Serve started; deploys `bench-open` at /open and `bench-auth` at /auth."""
    from ray import serve

    from reasonray.api.access.auth import mint_token
    from reasonray.serve_app import build_app

    base = settings.model_dump(mode="json")
    open_settings = {**base, "auth": {**base["auth"], "jwt_secret": None}}
    limits = {"requests_per_minute": 1_000_000, "concurrent_runs": 64, "tokens_per_minute": 10**9, "tokens_per_day": 10**12}
    auth_settings = {**base, "auth": {**base["auth"], "jwt_secret": AUTH_SECRET, "principals": {AUTH_SUB: limits}}}
    for name, prefix, app_settings in (("bench-open", "/open", open_settings), ("bench-auth", "/auth", auth_settings)):
        serve.run(build_app({"settings": app_settings, "app_name": name}), name=name, route_prefix=prefix)
    token = mint_token(AUTH_SECRET, AUTH_SUB, ["reasoner"], 3600)
    url = f"http://127.0.0.1:{serve_port()}"
    plain = httpx.Client(base_url=f"{url}/open", timeout=30)
    guarded = httpx.Client(base_url=f"{url}/auth", timeout=30, headers={"Authorization": f"Bearer {token}"})
    calls = {
        # no run: roles, the leased request permits (most calls make no limiter round trip)
        "reasoning.strategies": {},
        # a run (cache hit after the first call, so the model's time does not drown the difference):
        # admission and the token charge on the limiter actor, the budget check
        "reasoning.execute": {"query": "What is 17 * 23?", "strategy": "chain_of_thought"},
    }

    def post(client: httpx.Client, method: str, params: dict) -> None:
        response = client.post("/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        assert response.status_code == 200 and "result" in response.json(), response.text[:300]

    out: dict[str, tuple[list[float], list[float]]] = {}
    try:
        for method, params in calls.items():
            send_off = functools.partial(post, plain, method, params)
            send_on = functools.partial(post, guarded, method, params)
            for send in (send_off, send_on):  # warm-up: connections, the cache entry, the first lease
                timed(lambda _i, send=send: send(), 30)
            off_ms: list[float] = []
            on_ms: list[float] = []
            for _ in range(0, n, block):
                off_ms += timed(lambda _i, send=send_off: send(), block)
                on_ms += timed(lambda _i, send=send_on: send(), block)
            out[method] = (off_ms, on_ms)
    finally:
        plain.close()
        guarded.close()
        for name in ("bench-open", "bench-auth"):
            serve.delete(name)
    return out


def serve_port() -> int:
    from reasonray.actors.ray_compat import serve_http

    running = serve_http()
    if running is None:
        raise RuntimeError("no Serve instance runs on this process's Ray cluster")
    return running.port


def print_auth_http(figures: dict[str, tuple[list[float], list[float]]]) -> bool:
    ok = True
    for method, (off_ms, on_ms) in figures.items():
        o50, a50 = pct(off_ms, 0.5), pct(on_ms, 0.5)
        added = a50 - o50
        ok = ok and added < 1.0
        print(
            f"HTTP {method:<21} auth off p50 {o50:6.2f} ms (p95 {pct(off_ms, 0.95):6.2f})   auth on p50 {a50:6.2f} ms "
            f"(p95 {pct(on_ms, 0.95):6.2f})   added p50 {added:6.2f} ms   ratio {a50 / o50:.2f}x   n={len(on_ms)}"
        )
    print(f"target auth + rate limiting < 1 ms p50 added per request (over HTTP, limiter actor included): {'PASS' if ok else 'FAIL'}")
    return ok


PATHS = {"default": ("default",), "auth": ("auth",), "both": ("default", "auth")}


def direct_call(settings: Settings, sim_url: str) -> Callable[[int], None]:
    """Question i as chain_of_thought would ask it, sent straight to the simulated model with the openai client."""
    direct = openai.OpenAI(base_url=sim_url, api_key="x", max_retries=0)
    max_tokens = settings.reasoning.strategies["chain_of_thought"]["default_max_tokens"]

    def call(i: int) -> None:
        direct.chat.completions.create(
            model="simulated",
            messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"What is {i} * 7?"}],
            max_tokens=max_tokens,
            temperature=0.0,
        )

    return call


def serve_call(api: httpx.Client) -> Callable[[int], None]:
    """Question i as `reasoning.execute` over HTTP: distinct questions miss the cache and reach the model, as the
    direct call does."""

    def call(i: int) -> None:
        body = {"jsonrpc": "2.0", "id": i, "method": "reasoning.execute", "params": {"query": f"What is {i} * 7?"}}
        response = api.post("/rpc", json=body).json()
        assert "result" in response, response

    return call


def paired(direct: Callable[[int], None], served: Callable[[int], None], requests: int, warmup: int) -> tuple[list[float], list[float]]:
    """Milliseconds of the same questions each way, after `warmup` of each, in interleaved blocks of 50 so both
    see the same machine load."""
    timed(lambda i: direct(i + 10_000), warmup)
    timed(lambda i: served(i + 10_000), warmup)
    direct_ms: list[float] = []
    serve_ms: list[float] = []
    for block in range(0, requests, 50):
        direct_ms += timed(lambda i, block=block: direct(block + i), min(50, requests - block))
        serve_ms += timed(lambda i, block=block: served(block + i), min(50, requests - block))
    return direct_ms, serve_ms


def cot_path(settings: Settings, path: str, requests: int, warmup: int, sim_url: str, api_port: int) -> float:
    """What one chain-of-thought request adds over the same chat completion sent straight to the model, on the
    path `reasonray serve` takes with authentication off (`default`) or on (`auth`: a token, per-principal
    limits, the tenancy guard and the audit log), in interleaved blocks of one run."""
    import ray
    from ray import serve

    from reasonray.api.access.auth import mint_token
    from reasonray.kernel.auth_settings import LimitSettings

    headers: dict[str, str] = {}
    if path == "auth":
        limits = {"requests_per_minute": 1_000_000, "concurrent_runs": 64, "tokens_per_minute": 10**9, "tokens_per_day": 10**12}
        auth = settings.auth.model_copy(update={"jwt_secret": AUTH_SECRET, "principals": {AUTH_SUB: LimitSettings(**limits)}})
        settings = settings.model_copy(update={"auth": auth})
        headers = {"Authorization": "Bearer " + mint_token(AUTH_SECRET, AUTH_SUB, ["reasoner"], 3600)}
    start_ray(settings)  # with the ingress `reasonray serve` uses with these settings
    ingress = "HAProxy" if settings.haproxy_ingress() else "Serve's proxy"
    try:
        serve_bench_app(settings, api_port)
        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=30, headers=headers)
        direct_ms, serve_ms = paired(direct_call(settings, sim_url), serve_call(api), requests, warmup)
        health_ms = timed(lambda _i: api.get("/healthz"), 100)
    finally:
        serve.shutdown()
        ray.shutdown()
    d50, s50 = pct(direct_ms, 0.5), pct(serve_ms, 0.5)
    print(f"path {path}: auth {'on' if path == 'auth' else 'off'}, ingress {ingress}; {requests} sequential CoT requests per side")
    print(f"direct openai client -> simulator   p50 {d50:7.2f} ms   p95 {pct(direct_ms, 0.95):7.2f} ms")
    print(f"reasoning.execute over HTTP          p50 {s50:7.2f} ms   p95 {pct(serve_ms, 0.95):7.2f} ms")
    print(f"added p50 {s50 - d50:7.2f} ms   ratio p50 {s50 / d50:.2f}x   /healthz p50 {pct(health_ms, 0.5):.2f} ms")
    print(f"target added < 8 ms p50: {'PASS' if s50 - d50 < 8 else 'FAIL'}")
    return s50 - d50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--tracing-only", action="store_true", help="only the OpenTelemetry tracing figures (no Ray)")
    parser.add_argument("--auth-only", action="store_true", help="Only the authentication and rate-limiting figures (over HTTP).")
    parser.add_argument("--auth-requests", type=int, default=600, help="Requests per method and mode for the auth figures.")
    parser.add_argument("--auth-in-process", action="store_true", help="The guard alone, in this process (no Ray, no HTTP).")
    parser.add_argument(
        "--path",
        choices=("default", "auth", "both"),
        help="Only what a CoT request adds over a direct call on one path, paired in this run: `default` (auth off: "
        "Serve's proxy), `auth` (auth on, with limits: the HAProxy ingress `reasonray serve` uses then), or `both`.",
    )
    args = parser.parse_args()
    if args.tracing_only:
        tracing_overhead()
        return
    if args.auth_in_process:
        print_auth(auth_overhead(load_settings(REPO / "config.toml", environ={})))
        return

    import ray
    from ray import serve

    from reasonray.actors.environment import ray_environment
    from reasonray.serve_app import build_app

    api_port = free_port()
    with simulator_process() as (sim_url, _):
        settings = simulated_settings(sim_url, logging={"level": "warning"})

        if args.auth_only:
            # the ingress `reasonray serve` uses with auth on (HAProxy), for both apps, unless BENCH_INGRESS=default
            if os.environ.get("BENCH_INGRESS") != "default":
                on = settings.model_copy(update={"auth": settings.auth.model_copy(update={"jwt_secret": AUTH_SECRET})})
                os.environ.update(ray_environment(on))
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            serve.start(http_options={"host": "127.0.0.1", "port": api_port})
            figures = auth_http_overhead(settings, args.auth_requests)
            print(f"auth: {args.auth_requests} sequential requests per method and mode, blocks of 50 interleaved, simulated model")
            print_auth_http(figures)
            return

        if args.path is not None:
            # default first: the auth path's ingress settings stay in this process's environment once set
            added = [cot_path(settings, path, args.requests, args.warmup, sim_url, free_port()) for path in PATHS[args.path]]
            if len(added) > 1:
                print(
                    f"both paths: added p50 default {added[0]:.2f} ms, auth {added[1]:.2f} ms; auth - default {added[1] - added[0]:+.2f} ms"
                )
            return

        by_default, by_request = resolution_overhead(settings)

        if os.environ.get("BENCH_INGRESS") != "default":  # BENCH_INGRESS=default measures Serve's plain proxy
            os.environ.update(ray_environment(settings))  # the ingress `reasonray serve` uses
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": api_port})
        auth_figures = auth_http_overhead(settings, args.auth_requests)
        serve.run(build_app({"settings": settings.model_dump(mode="json"), "app_name": "bench"}), name="bench", route_prefix="/")

        call_serve = serve_call(httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=30))
        direct_ms, serve_ms = paired(direct_call(settings, sim_url), call_serve, args.requests, args.warmup)
        cached_ms = timed(lambda i: call_serve(0), 100)

    d50, d95, s50, s95 = pct(direct_ms, 0.5), pct(direct_ms, 0.95), pct(serve_ms, 0.5), pct(serve_ms, 0.95)
    print(f"requests: {args.requests} sequential per path (after {args.warmup} warm-up), simulated model, chain_of_thought")
    print(f"direct openai client -> simulator   p50 {d50:7.2f} ms   p95 {d95:7.2f} ms")
    print(f"reasoning.execute via Ray Serve      p50 {s50:7.2f} ms   p95 {s95:7.2f} ms")
    print(f"added by ReasonRay + Serve           p50 {s50 - d50:7.2f} ms   p95 {s95 - d95:7.2f} ms   ratio p50 {s50 / d50:.2f}x")
    print(f"  same query again (cache hit)       p50 {pct(cached_ms, 0.5):7.2f} ms   (ratio to direct {pct(cached_ms, 0.5) / d50:.2f}x)")
    r50, r95 = pct(by_default, 0.5) * 1000, pct(by_default, 0.95) * 1000
    q50, q95 = pct(by_request, 0.5) * 1000, pct(by_request, 0.95) * 1000
    print(f"strategy resolution (system default) p50 {r50:7.1f} us   p95 {r95:7.1f} us")
    print(
        f"strategy resolution (request+config) p50 {q50:7.1f} us   p95 {q95:7.1f} us   "
        f"(ratio to one direct LLM call p50: {q50 / 1000 / d50:.4f})"
    )
    ok_resolution = q50 < 1000
    ok_added = s50 - d50 < 15
    print(
        f"target resolution < 1 ms p50: {'PASS' if ok_resolution else 'FAIL'};  target added < 15 ms p50: {'PASS' if ok_added else 'FAIL'}"
    )
    print(f"mean direct {statistics.mean(direct_ms):.2f} ms, mean serve {statistics.mean(serve_ms):.2f} ms")
    print_auth_http(auth_figures)
    tracing_overhead()


if __name__ == "__main__":
    main()
