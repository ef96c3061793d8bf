"""`reasonray serve --llm local`: the local model server starts with the service, answers through it, and
stops with it. Runs before the other modules (file order), so one Ray cluster runs at a time."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from pathlib import Path

import httpx

from reasonray.client import Client
from reasonray.gateway.simulator.server import free_port
from tests.integration.conftest import kill_tree, wait_until_serving
from tests.real.conftest import REPO
from tests.serving import serve_into


def test_serve_llm_local_starts_answers_with_and_stops_the_model_server():
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="reasonray-local-")
    log = Path(data_dir) / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REASONRAY_", "OPENAI_", "RAY_ADDRESS"))}
    # unbuffered: the banner is read from the log file as soon as the API answers
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", REASONRAY_DATA_DIR=data_dir, REASONRAY_LLM__CACHE__ENABLED="false")
    process = serve_into(log, "--llm", "local", "--port", str(port), env=env)
    try:
        wait_until_serving(process, port, 300, lambda: log.read_text(errors="replace")[-5000:])
        pattern = re.compile(r"local model\s+(http://127\.0\.0\.1:(\d+)/v1)\s+\(llama\.cpp, pid (\d+)\)")
        deadline = time.monotonic() + 60  # the banner follows the API's start
        while not (found := pattern.search(banner := log.read_text(errors="replace"))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert found, banner
        model_url, model_pid = found.group(1), int(found.group(3))
        assert "answering with smollm2 at " + model_url in banner, banner
        assert httpx.get(f"{model_url}/models", timeout=10).json()["data"][0]["id"] == "smollm2"

        with Client(f"http://127.0.0.1:{port}", timeout=600) as rr:
            result = rr.execute("What is 2 + 3?", strategy="chain_of_thought", strategy_config={"max_tokens": 64})
        assert result["metrics"]["model"] == "smollm2" and result["metrics"]["simulated"] is False
        assert result["metrics"]["llm_calls"] == 1 and result["answer"].strip()

        process.send_signal(signal.SIGINT)  # Ctrl-C: the service stops, and the model server with it
        assert process.wait(120) == 0, log.read_text(errors="replace")[-3000:]
        assert not Path(f"/proc/{model_pid}").exists() or "zombie" in Path(f"/proc/{model_pid}/status").read_text().lower()
        try:
            httpx.get(f"{model_url}/models", timeout=2)
        except httpx.HTTPError:
            pass
        else:
            raise AssertionError("the local model server still answers after the service stopped")
    finally:
        kill_tree(process)
