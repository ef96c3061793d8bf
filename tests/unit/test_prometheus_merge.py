"""The /metrics merge: Ray's per-process pages from several nodes become cluster totals under our names."""

import shutil
import subprocess

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from reasonray.api.surfaces.prometheus import merge, page

NODE_A = """# HELP ray_reasonray_requests_total JSON-RPC calls answered.
# TYPE ray_reasonray_requests_total counter
ray_reasonray_requests_total{Component="core_worker",NodeAddress="10.0.0.1",WorkerId="a1",method="m",status="ok",strategy="s"} 2.0
ray_reasonray_requests_total{Component="core_worker",NodeAddress="10.0.0.1",WorkerId="a2",method="m",status="ok",strategy="s"} 3.0
# HELP ray_reasonray_active_sessions Sessions.
# TYPE ray_reasonray_active_sessions gauge
ray_reasonray_active_sessions{NodeAddress="10.0.0.1",WorkerId="a1"} 4.0
# HELP ray_serve_num_http_requests_total Serve's own.
# TYPE ray_serve_num_http_requests_total counter
ray_serve_num_http_requests_total{route="/"} 9.0
"""
NODE_B = """# HELP ray_reasoning_bounded_context_iterations Iterations.
# TYPE ray_reasoning_bounded_context_iterations histogram
ray_reasoning_bounded_context_iterations_bucket{NodeAddress="10.0.0.2",WorkerId="b1",le="5.0"} 1.0
ray_reasoning_bounded_context_iterations_bucket{NodeAddress="10.0.0.2",WorkerId="b1",le="+Inf"} 1.0
ray_reasoning_bounded_context_iterations_count{NodeAddress="10.0.0.2",WorkerId="b1"} 1.0
ray_reasoning_bounded_context_iterations_sum{NodeAddress="10.0.0.2",WorkerId="b1"} 3.0
# HELP ray_reasonray_requests_total JSON-RPC calls answered.
# TYPE ray_reasonray_requests_total counter
ray_reasonray_requests_total{NodeAddress="10.0.0.2",WorkerId="b1",method="m",status="ok",strategy="s"} 5.0
# HELP ray_reasonray_active_sessions Sessions.
# TYPE ray_reasonray_active_sessions gauge
ray_reasonray_active_sessions{NodeAddress="10.0.0.2",WorkerId="b1"} 1.0
"""


def test_counters_sum_over_processes_and_nodes_gauges_take_the_max_and_only_our_names_remain():
    text = merge([NODE_A, NODE_B]).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("reasonray_requests_total", (("method", "m"), ("status", "ok"), ("strategy", "s")))] == 10.0
    assert samples[("reasonray_active_sessions", ())] == 4.0
    assert samples[("reasoning_bounded_context_iterations_bucket", (("le", "5.0"),))] == 1.0
    assert samples[("reasoning_bounded_context_iterations_sum", ())] == 3.0
    assert not any(name.startswith(("ray_", "serve")) for name, _ in samples)


def test_no_pages_is_an_empty_exposition():
    assert merge([]) == b""


OTEL = """# HELP ray_reasonray_llm_latency_seconds Time of an LLM call.
# TYPE ray_reasonray_llm_latency_seconds histogram
ray_reasonray_llm_latency_seconds_bucket{otel_scope_name="ray",otel_scope_version="2.60",WorkerId="w",model="m",le="0.5"} 1.0
ray_reasonray_llm_latency_seconds_bucket{otel_scope_name="ray",otel_scope_version="2.60",WorkerId="w",model="m",le="10.0"} 2.0
ray_reasonray_llm_latency_seconds_bucket{otel_scope_name="ray",otel_scope_version="2.60",WorkerId="w",model="m",le="2.5"} 2.0
ray_reasonray_llm_latency_seconds_bucket{otel_scope_name="ray",otel_scope_version="2.60",WorkerId="w",model="m",le="+Inf"} 2.0
ray_reasonray_llm_latency_seconds_count{otel_scope_name="ray",otel_scope_version="2.60",WorkerId="w",model="m"} 2.0
ray_reasonray_llm_latency_seconds_sum{otel_scope_name="ray",otel_scope_version="2.60",WorkerId="w",model="m"} 3.0
# HELP ray_reasonray_llm_cache_hits_total LLM calls answered from the response cache.
# TYPE ray_reasonray_llm_cache_hits_total counter
ray_reasonray_llm_cache_hits_total{otel_scope_name="ray",model="m"} 2.0
"""


def test_buckets_come_in_numeric_order_without_otel_scope_labels_and_promtool_has_nothing_to_say():
    text = merge([NODE_A, NODE_B, OTEL]).decode()
    buckets = [line for line in text.splitlines() if line.startswith("reasonray_llm_latency_seconds_bucket")]
    assert [b.split('le="')[1].split('"')[0] for b in buckets] == ["0.5", "2.5", "10.0", "+Inf"]
    assert "otel_scope" not in text and "WorkerId" not in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (scripts/setup.sh does)"
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout == lint.stderr == "", lint.stdout + lint.stderr


def test_openmetrics_when_asked_and_its_parser_accepts_the_page():
    assert page([], "application/openmetrics-text; version=1.0.0,text/plain;q=0.5").media_type.startswith("application/openmetrics-text")
    assert page([], "*/*").media_type.startswith("text/plain") and page([], None).media_type.startswith("text/plain")
    text = bytes(page([NODE_A, NODE_B, OTEL], "application/openmetrics-text").body).decode()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(text)}
    assert families["reasonray_llm_cache_hits"].type == "counter" and families["reasonray_requests"].samples[0].value == 10.0
    assert [s.labels.get("le") for s in families["reasonray_llm_latency_seconds"].samples][:4] == ["0.5", "2.5", "10.0", "+Inf"]
