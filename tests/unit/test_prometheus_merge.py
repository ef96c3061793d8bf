"""The /metrics merge: Ray's per-process pages from several nodes become cluster totals under our names."""

from prometheus_client.parser import text_string_to_metric_families

from reasonray.api.prometheus import merge

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
