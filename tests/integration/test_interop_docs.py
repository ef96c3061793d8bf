"""docs/interop.md's Python examples, run as written against the live service (its URL substituted);
each printed line the page shows in a `# ...` comment must be printed."""

from __future__ import annotations

import time

import httpx

from tests.docs_examples import blocks

DOC_URL = "http://127.0.0.1:8000"


def shown(block: str) -> list[str]:
    lines = [line.strip() for line in block.strip().splitlines()]
    tail = []
    for line in reversed(lines):
        if not line.startswith("# "):
            break
        tail.insert(0, line[2:])
    return [line for line in tail if line != "..."]


def test_interop_examples_print_what_the_page_shows(api, capsys):
    base = str(api.base_url).rstrip("/")
    code = blocks("docs/interop.md", "python")
    assert len(code) == 6
    for block in code:
        if "/metrics" in block:  # Ray exports what the examples above recorded every second here (conftest)
            deadline = time.monotonic() + 90
            while "reasonray_requests_total" not in httpx.get(f"{base}/metrics", timeout=60).text:
                assert time.monotonic() < deadline, "no reasonray_requests_total in /metrics after 90 s"
                time.sleep(0.5)
        exec(compile(block.replace(DOC_URL, base), "docs/interop.md", "exec"), {"__name__": "docs_example"})
        printed = capsys.readouterr().out.splitlines()
        for line in shown(block):
            assert line in printed, (line, printed)
