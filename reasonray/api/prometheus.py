"""GET /metrics: the service's metrics from every node of the cluster, as one Prometheus exposition.

Ray exports each process's `ray.util.metrics` on its node's metrics endpoint, with a `ray_` prefix
and per-process tags (`WorkerId`, `NodeAddress`, `SessionName`, `Component`...). This module merges
the pages scraped from every node into cluster totals under our own names: the `ray_` prefix goes
(`ray_reasoning_bounded_context_requests_total` is served as `reasoning_bounded_context_requests_total`,
as the blueprint spells it), Ray's CamelCase tags go, counters and histograms are summed across
processes and nodes, gauges take the largest value (each process reports the same gauge).
Transport-free: the ingress fetches the pages (actors/metrics.py), this turns them into text.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from reasonray.kernel.telemetry import SPECS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OURS = tuple(f"ray_{name}" for name in SPECS)


def _ours(name: str) -> bool:
    return any(name == base or name.startswith(base + "_") for base in OURS)


class _Merged:
    """A prometheus_client collector over already-merged families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge(pages: Iterable[str]) -> bytes:
    """Our metric families from Ray's export pages, summed over processes and nodes, in text format."""
    kinds: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = defaultdict(dict)
    for page in pages:
        for family in text_string_to_metric_families(page):
            if not _ours(family.name):
                continue
            name = family.name.removeprefix("ray_")
            kinds.setdefault(name, (family.type, family.documentation))
            gauge = family.type == "gauge"
            merged = values[name]
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if not k[:1].isupper()))
                key = (sample.name.removeprefix("ray_"), labels)
                if key in merged:
                    merged[key] = max(merged[key], sample.value) if gauge else merged[key] + sample.value
                else:
                    merged[key] = sample.value
    families = []
    for name in sorted(values):
        kind, documentation = kinds[name]
        metric = Metric(name, documentation, kind)
        for (sample_name, labels), value in sorted(values[name].items()):
            metric.add_sample(sample_name, dict(labels), value)
        families.append(metric)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families))
    return generate_latest(registry)
