"""What every benchmark sets up first (`import _env` as the script's first import of ours): the
repository on sys.path, the offline tokenizer files beside the checkout, Ray's token auth mode (as
the Makefile exports), and quiet logs, so only the figures are printed. Then what several benchmarks share:
percentiles and timing, a simulator process, and Ray and Serve started as `reasonray serve` starts them."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import structlog

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
if "TIKTOKEN_CACHE_DIR" not in os.environ and (REPO.parent / "shared" / "tiktoken").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(REPO.parent / "shared" / "tiktoken")
os.environ.setdefault("RAY_AUTH_MODE", "token")
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def pct(samples: list[float], q: float) -> float:
    """The `q` quantile of `samples` (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Milliseconds of each of `n` calls fn(0) ... fn(n - 1), one after the other."""
    out = []
    for i in range(n):
        started = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - started) * 1000)
    return out


def wait_for(url: str, timeout_s: float = 60) -> None:
    """Until `url` answers at all."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@contextmanager
def simulator_process(*options: str) -> Iterator[tuple[str, int]]:
    """`reasonray sim OPTIONS` on a free port, its output dropped, once it answers: yields its /v1 URL and its pid.
    At the end the simulator stops, and Serve and Ray too where the benchmark started them."""
    import ray
    from ray import serve

    from reasonray.gateway.simulator.server import free_port

    port = free_port()
    sim = subprocess.Popen(
        [Path(sys.executable).parent / "reasonray", "sim", "--port", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}/v1", sim.pid
    finally:
        sim.terminate()
        sim.wait()
        with contextlib.suppress(Exception):
            if ray.is_initialized():  # serve.shutdown would start a cluster to shut down
                serve.shutdown()
                ray.shutdown()


def simulated_settings(sim_url: str, cache: bool = True, **sections: Any) -> Any:
    """The repository's config.toml (no environment variables) with [llm] on the simulated model at `sim_url`, its
    response cache on or off (off: every run reaches the model), and each of `sections` merged into its section (a
    value that is not a table replaces the setting)."""
    from reasonray.kernel.config import Settings, load_settings

    base = load_settings(REPO / "config.toml", environ={}).model_dump(mode="json")
    base["llm"].update(provider="simulated", base_url=sim_url)
    base["llm"]["cache"]["enabled"] = cache
    for name, changes in sections.items():
        base[name] = {**base[name], **changes} if isinstance(changes, dict) else changes
    return Settings.model_validate(base)


def start_ray(settings: Any) -> None:
    """A local Ray cluster on 2 CPUs, in the environment `reasonray serve` gives it for `settings` (its ingress)."""
    import ray

    from reasonray.actors.environment import ray_environment

    os.environ.update(ray_environment(settings))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)


def serve_bench_app(settings: Any, api_port: int) -> None:
    """Serve on `api_port` with the application as `reasonray serve` builds it, named "bench", at /."""
    from ray import serve

    from reasonray.serve_app import build_app

    serve.start(http_options={"host": "127.0.0.1", "port": api_port})
    serve.run(build_app({"settings": settings.model_dump(mode="json"), "app_name": "bench"}), name="bench", route_prefix="/")
