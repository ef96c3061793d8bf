"""GET /metrics: the service's metrics from every node of the cluster, as one Prometheus exposition.

Ray exports each process's `ray.util.metrics` on its node's metrics endpoint, with a `ray_` prefix
and per-process tags (`WorkerId`, `NodeAddress`, `SessionName`, `Component`...). This module merges
the pages scraped from every node into cluster totals under our own names: the `ray_` prefix goes
(`ray_reasoning_bounded_context_requests_total` is served as `reasoning_bounded_context_requests_total`,
the name docs/operations.md gives), Ray's CamelCase tags go, counters and histograms are summed across
processes and nodes, gauges take the largest value (each process reports the same gauge), and
the `otel_scope_*` labels Ray's OpenTelemetry export adds go (one scope, ours, on every series).
Histogram buckets come in numeric order. The page is Prometheus text, or OpenMetrics when the
scraper asks for it (`Accept: application/openmetrics-text`). The ingress fetches the pages (actors/metrics.py), this turns them into the response.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Iterable
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import Response

from reasonray.kernel.telemetry import SPECS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OURS = tuple(f"ray_{name}" for name in SPECS)


_SUFFIX_ORDER = {"_bucket": 0, "_count": 1, "_sum": 2, "_created": 3}


def _sample_order(key: tuple[str, tuple[tuple[str, str], ...]]) -> tuple[object, ...]:
    """Samples of one label set together; a histogram's buckets by their bound, then count and sum."""
    sample_name, labels = key
    rest = tuple(item for item in labels if item[0] != "le")
    le = next((float(v) for k, v in labels if k == "le"), 0.0)
    suffix = next((rank for end, rank in _SUFFIX_ORDER.items() if sample_name.endswith(end)), -1)
    return (rest, suffix, le, sample_name)


def merge(pages: Iterable[str], openmetrics: bool = False) -> bytes:
    """Our metric families from Ray's export pages, summed over processes and nodes, as Prometheus text
    (or OpenMetrics)."""
    kinds: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = defaultdict(dict)
    for page in pages:
        for family in text_string_to_metric_families(page):
            if not any(family.name == base or family.name.startswith(base + "_") for base in OURS):
                continue
            name = family.name.removeprefix("ray_")
            kinds.setdefault(name, (family.type, family.documentation))
            combine = max if family.type == "gauge" else operator.add
            merged = values[name]
            for sample in family.samples:
                # Ray's per-process tags (CamelCase) and OpenTelemetry's scope labels are dropped: cluster totals
                kept = ((k, v) for k, v in sample.labels.items() if not k[:1].isupper() and not k.startswith("otel_scope"))
                labels = tuple(sorted(kept))
                key = (sample.name.removeprefix("ray_"), labels)
                merged[key] = combine(merged[key], sample.value) if key in merged else sample.value
    families = []
    for name in sorted(values):
        kind, documentation = kinds[name]
        metric = Metric(name, documentation, kind)
        for (sample_name, labels), value in sorted(values[name].items(), key=lambda item: _sample_order(item[0])):
            metric.add_sample(sample_name, dict(labels), value)
        families.append(metric)
    merged_families = SimpleNamespace(collect=lambda: families)  # a collector is all the exposition functions read
    return generate_openmetrics(merged_families) if openmetrics else generate_latest(merged_families)  # type: ignore[no-untyped-call]


def page(pages: Iterable[str], accept: str | None) -> Response:
    """The merged page as the scraper's Accept header asks: OpenMetrics when it names it (Prometheus sends it first
    when it can), else Prometheus text."""
    openmetrics = "application/openmetrics-text" in (accept or "")
    return Response(merge(pages, openmetrics), media_type=str(OPENMETRICS_TYPE) if openmetrics else CONTENT_TYPE)
