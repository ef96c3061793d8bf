"""The real-model suite (`make test-real`): SmolLM2-135M-Instruct on llama.cpp's server, started once, behind a
recording proxy; ReasonRay served by `reasonray serve` pointed at it through the environment ([llm] as a
user sets it), over HTTP. The model obeys no format and runs one request at a time; what the tests assert
holds whatever it says."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from reasonray.client import Client, ReasonRayError
from reasonray.gateway.local_model import LocalModelServer, bundled_model
from reasonray.gateway.simulator.server import free_port
from reasonray.kernel.config import LocalModelSection
from tests.integration.conftest import kill_tree, wait_until_serving
from tests.real.recorder import Call, Recorder
from tests.serving import serve_into

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# Every error a run may end with has a class, a JSON-RPC code and an error_type (docs/api.md, "Errors");
# -32603 (internal) is a bug, never an acceptable end.
CLASSIFIED = {-32602, -32002, -32001, -32010, -32004, -32006, -32008, -32011, -32012, -32013, -32014, -32015}
# The model server has one slot: what one test leaves running (an abandoned generation) finishes before the
# next test measures anything.
IDLE_TIMEOUT_S = 600.0


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(item.fspath).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.real)


def model_section(**changes: Any) -> LocalModelSection:
    return LocalModelSection(**changes)


@pytest.fixture(scope="session")
def llama() -> Iterator[LocalModelServer]:
    # started as its own documentation starts it (`--interrupt_requests` on: another request cuts a running stream),
    # as a user's server is, not with the flags `reasonray serve --llm local` gives the server it starts
    with LocalModelServer(model_section(), documented_defaults=True) as server:
        # a server that starts but cannot generate (a build its CPU refuses) would turn every run into a classified
        # provider error, which most tests accept: it must fail the suite here instead
        reply = httpx.post(
            f"{server.url}/chat/completions",
            json={"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4},
            timeout=120,
        )
        assert reply.status_code == 200 and reply.json()["choices"], f"the model server cannot generate: {server.log_tail()}"
        yield server


@pytest.fixture(scope="session")
def recorder(llama) -> Iterator[Recorder]:
    proxy = Recorder(llama.url).start()
    yield proxy
    proxy.stop()


def service_environment(base_url: str, data_dir: str, **extra: str) -> dict[str, str]:
    """`reasonray serve`'s environment: [llm] pointed at the model as a user does it, nothing else changed
    but a data directory of its own and the response cache off (each call reaches the server, so the
    server's counts are the whole truth)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REASONRAY_", "RAY_ADDRESS", "OPENAI_"))}
    env.update(
        PYTHONPATH=str(REPO),
        RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "token"),
        REASONRAY_LLM__PROVIDER="openai",
        REASONRAY_LLM__BASE_URL=base_url,
        REASONRAY_LLM__MODEL="smollm2",
        REASONRAY_LLM__API_KEY_REQUIRED="false",
        REASONRAY_LLM__CACHE__ENABLED="false",
        # the served model's file, so that prompts count as the server counts them (its chat template rendered
        # and tokenized here): llama-cpp-python names no model file and streams no usage (docs/real-model.md)
        REASONRAY_LLM__TOKENIZER=str(bundled_model()),
        REASONRAY_DATA_DIR=data_dir,
        **extra,
    )
    return env


@dataclass
class Service:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]


@pytest.fixture(scope="session")
def service(recorder) -> Iterator[Service]:
    data_dir = tempfile.mkdtemp(prefix="reasonray-real-")
    port = free_port()
    log = Path(data_dir) / "serve.log"
    process = serve_into(log, "--port", str(port), env=service_environment(recorder.url, data_dir))
    running = Service(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_until_serving(process, port, 240, running.output)
        yield running
    finally:
        kill_tree(process)


@pytest.fixture(scope="session")
def client(service) -> Iterator[Client]:
    with Client(service.url, timeout=900) as rr:
        yield rr


@pytest.fixture(autouse=True)
def _model_server_idle(request):
    """Each test starts with the model server idle: an abandoned generation of the previous test would
    otherwise be counted against this one, and hold the server's one slot."""
    if "recorder" in request.fixturenames:
        request.getfixturevalue("recorder").wait_idle(IDLE_TIMEOUT_S)
    yield
    if "llama" in request.fixturenames:  # a server that died mid-test fails that test, not only the next ones
        server = request.getfixturevalue("llama")
        assert server.process is not None and server.process.poll() is None, f"the model server died: {server.log_tail()}"


@dataclass
class Outcome:
    """What one run ended with (a result or a JSON-RPC error), and the calls the model server received for it."""

    result: dict[str, Any] | None
    error: ReasonRayError | None
    calls: list[Call]

    @property
    def server_prompt_tokens(self) -> int:
        return sum(c.usage["prompt_tokens"] for c in self.calls if c.usage)

    @property
    def server_completion_tokens(self) -> int:
        return sum(c.usage["completion_tokens"] for c in self.calls if c.usage)


def measured(recorder: Recorder, run: Callable[[], T]) -> tuple[T | None, ReasonRayError | None, list[Call]]:
    """Run `run()`, catch a JSON-RPC error, wait until the server has answered every call it started, and
    return the calls that arrived while it ran."""
    mark = recorder.mark()
    value: T | None = None
    error: ReasonRayError | None = None
    try:
        value = run()
    except ReasonRayError as exc:
        error = exc
    until = recorder.mark()
    recorder.wait_idle(IDLE_TIMEOUT_S)
    return value, error, recorder.since(mark, until)


def execute(client: Client, recorder: Recorder, query: str, **options: Any) -> Outcome:
    result, error, calls = measured(recorder, lambda: client.execute(query, include_trace=True, **options))
    return Outcome(result, error, calls)


def assert_classified(error: ReasonRayError) -> None:
    assert error.code in CLASSIFIED, f"unclassified end {error.code}: {error.message} {error.data}"
    assert error.data.get("error_type") and error.data.get("error_type") != "internal", error.data
    assert error.data.get("trace_id"), error.data


def assert_counts_match(metrics: dict[str, Any], calls: list[Call]) -> None:
    """The run's own count of calls and tokens is the server's: every call it made reached the server
    (the cache is off), and the tokens are those the server reported for them. A call the server cut short
    (its default --interrupt_requests ends a request when another arrives) and ReasonRay sent again is a retry:
    each attempt is a request the server saw, and what the cut one cost is charged on top of what the server reported."""
    assert metrics["cache_hits"] == 0
    shown = (metrics, [(c.number, c.purpose, c.status) for c in calls])
    assert metrics["llm_calls"] + metrics["retries"] == len(calls), shown
    unreported = [c.number for c in calls if c.status == 200 and not c.usage]
    assert not unreported, f"the server reported no usage for calls {unreported} (streamed without usage?)"
    prompt = sum(c.usage["prompt_tokens"] for c in calls if c.usage)
    completion = sum(c.usage["completion_tokens"] for c in calls if c.usage)
    cut = [c for c in calls if not c.usage]
    if not cut:
        assert (metrics["prompt_tokens"], metrics["completion_tokens"]) == (prompt, completion), metrics
    else:
        assert len(cut) == metrics["retries"], shown
        assert metrics["prompt_tokens"] >= prompt and metrics["completion_tokens"] >= completion, metrics


def http_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url, json=body, timeout=60)
    response.raise_for_status()
    return response.json()
