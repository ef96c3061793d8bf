"""`reasonray.telemetry` metrics as `ray.util.metrics` objects, one set per process.

Each Ray worker (Serve replica, fan-out or evaluation task, session or memory actor) records into
its own objects; Ray exports them on the node's metrics endpoint (`ray_` prefix, `_total` on
counters), where Prometheus scrapes them beside Serve's own. Every series also carries Ray's
`WorkerId`, `NodeAddress` and `SessionName` tags: sum counters across them, take the max of gauges.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import ray
import structlog
from ray.util import metrics as ray_metrics_api

from reasonray.kernel.telemetry import CATALOGUE, Metrics, NoMetrics, check

log = structlog.get_logger(__name__)


UPDATE = {"counter": "inc", "histogram": "observe", "gauge": "set"}  # the method each kind of metric object takes a value by


class RayMetrics:
    def __init__(self) -> None:
        kinds = {"counter": ray_metrics_api.Counter, "histogram": ray_metrics_api.Histogram, "gauge": ray_metrics_api.Gauge}
        self._objects: dict[str, Any] = {}
        for spec in CATALOGUE:
            options = {"boundaries": list(spec.boundaries)} if spec.kind == "histogram" else {}
            self._objects[spec.name] = kinds[spec.kind](spec.name, description=spec.description, tag_keys=spec.tags, **options)

    def record(self, name: str, value: float = 1.0, **tags: str) -> None:
        spec = check(name, tags, value)
        if spec.kind == "counter" and value == 0:
            return  # Ray refuses to add 0 (a failed run spent no tokens)
        try:
            getattr(self._objects[name], UPDATE[spec.kind])(value, tags=tags or None)
        except Exception as exc:  # metrics are best effort: a request never fails because of them
            log.warning("metrics.not_recorded", metric=name, error=f"{type(exc).__name__}: {exc}"[:200])


_lock = threading.Lock()
_process: RayMetrics | None = None


def ray_metrics(enabled: bool = True) -> Metrics:
    """This process's metrics ([reasoning.performance] enable_metrics = false: nothing is recorded)."""
    global _process
    if not enabled:
        return NoMetrics()
    with _lock:
        if _process is None:
            _process = RayMetrics()
        return _process


async def node_metric_pages(timeout_s: float = 5.0) -> list[str]:
    """Every live node's metrics export page (Ray's own endpoint, where each process's metrics land).

    A node that does not answer in time is left out (logged): the others' metrics still serve.
    """
    nodes = await asyncio.to_thread(ray.nodes)
    urls = [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics" for n in nodes if n.get("Alive")]
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        answers = await asyncio.gather(*(client.get(url) for url in urls), return_exceptions=True)
    pages = []
    for url, answer in zip(urls, answers, strict=True):
        if isinstance(answer, Exception) or answer.status_code != 200:
            log.warning("metrics.node_unreachable", url=url, error=str(answer)[:200])
            continue
        pages.append(answer.text)
    return pages
