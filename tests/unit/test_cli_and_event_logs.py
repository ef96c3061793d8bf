"""Honest exit codes (`reasonray ask`, `reasonray eval`), the provider's reason, and private event logs
with retention."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import threading
import time
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from reasonray.api.app import local_dispatcher
from reasonray.api.service import ReasoningService
from reasonray.cli import main
from reasonray.gateway.errors import ProviderUnavailableError
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import EventsSettings, ReasoningSettings, Settings
from reasonray.kernel.events import read_event_log
from reasonray.kernel.retention import purge, sweep
from reasonray.strategies.registry import StrategyRegistry, build_catalogue

REASONING = ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought")


class RpcServer:
    """The in-process API over HTTP on a free loopback port, for the CLI to call."""

    def __init__(self, llm) -> None:
        rpc = local_dispatcher(REASONING, llm)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                payload, _ = asyncio.run_coroutine_threadsafe(rpc.handle(body), loop).result()
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.loop = loop
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_ask_exits_zero_with_an_answer_and_non_zero_with_the_error_type_and_trace_id():
    ok = RpcServer(FunctionLLM(lambda r: "<answer>391</answer>"))
    failing = RpcServer(ScriptedLLM([ProviderUnavailableError("HTTP 500 from http://10.1.2.3/v1", attempts=3, status_code=500)]))
    try:
        runner = CliRunner()
        good = runner.invoke(main, ["ask", "What is 17 * 23?", "--url", ok.url])
        assert good.exit_code == 0 and "\n391\n" in f"\n{good.output}" and "trace_id:" in good.output
        bad = runner.invoke(main, ["ask", "What is 17 * 23?", "--url", failing.url])
        assert bad.exit_code == 1
        assert "error -32013: the model provider failed after 3 attempt(s) (HTTP 500)" in bad.output
        said = [line for line in bad.output.splitlines() if not line.startswith("20")]  # the log (with the URL) aside
        assert any(line.startswith("error_type: provider_unavailable  trace_id: ") for line in said) and not any(
            "10.1.2.3" in line for line in said
        )
    finally:
        ok.close()
        failing.close()


def failure_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("error:", "error_type:"))]


def test_every_cli_failure_prints_its_error_type(tmp_path, monkeypatch):
    """ask with no service, serve and mcp refused at start-up, eval that cannot start: exit non-zero, name the type."""
    monkeypatch.delenv("REASONRAY_AUTH__JWT_SECRET", raising=False)
    runner = CliRunner()
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    ask = runner.invoke(main, ["ask", "What is 17 * 23?", "--url", closed, "--timeout", "5"])
    assert ask.exit_code == 1
    assert failure_lines(ask.output)[-1] == "error_type: service_unreachable"
    assert f"cannot reach ReasonRay at {closed} (ConnectError" in ask.output

    plain = tmp_path / "plain.toml"
    plain.write_text('[llm]\nprovider = "simulated"\n')
    serve = runner.invoke(main, ["serve", "--config", str(plain), "--host", "0.0.0.0"])
    assert serve.exit_code == 2 and "refusing to serve on 0.0.0.0 without authentication" in serve.output
    assert failure_lines(serve.output)[-1] == "error_type: config_error"

    broken = tmp_path / "broken.toml"
    broken.write_text('[reasoning]\ndefault_strategy = "no_such_strategy"\n')
    mcp = runner.invoke(main, ["mcp", "--config", str(broken)])
    assert mcp.exit_code == 2 and failure_lines(mcp.output)[-1] == "error_type: config_error", mcp.output

    missing = tmp_path / "missing.jsonl"
    args = ["eval", "--dataset", str(missing), "--strategies", "chain_of_thought", "--out", str(tmp_path / "out"), "--no-ray"]
    evaluation = runner.invoke(main, [*args, "--no-progress", "--config-file", str(plain)])
    assert evaluation.exit_code == 2 and str(missing) in evaluation.output
    assert failure_lines(evaluation.output)[-1].startswith("error_type: "), evaluation.output
    assert failure_lines(evaluation.output)[-1] != "error_type: internal"


def test_eval_exits_non_zero_and_names_each_failed_example_when_the_model_fails(tmp_path):
    sim = SimulatorServer(SimulatorSettings(port=0, fault_rate=1.0, fault_kinds=("500",))).start()
    try:
        dataset = tmp_path / "gsm8k.jsonl"
        dataset.write_text(
            "".join(
                json.dumps({"question": f"Tom has {i} apples and buys one more. How many now?", "answer": f"#### {i + 1}"}) + "\n"
                for i in range(2)
            )
        )
        config = tmp_path / "config.toml"
        config.write_text(
            f'[llm]\nprovider = "simulated"\nbase_url = "{sim.url}"\n[llm.retry]\nmax_attempts = 1\n'
            '[reasoning]\nenabled_strategies = ["chain_of_thought"]\ndefault_strategy = "chain_of_thought"\n'
        )
        args = ["eval", "--dataset", str(dataset), "--strategies", "chain_of_thought", "--out", str(tmp_path / "out")]
        result = CliRunner().invoke(main, [*args, "--no-ray", "--no-progress", "--config-file", str(config), "--no-cache"])
    finally:
        sim.stop()
    assert result.exit_code == 1, result.output
    failed = [line for line in result.output.splitlines() if line.startswith("failed: ") and "error_type=" in line]
    assert len(failed) == 2 and all("error_type=provider_unavailable trace_id=eval-" in line for line in failed)


def test_the_provider_reason_says_why_auto_chose_the_simulator():
    settings = Settings()
    assert settings.provider_reason({}) == (
        "simulated: [llm] provider = 'auto' and neither [llm] base_url nor $OPENAI_API_KEY is set (set one for a real model)"
    )
    assert settings.provider_reason({"OPENAI_API_KEY": "k"}) == "openai: [llm] provider = 'auto' and $OPENAI_API_KEY is set"
    pinned = Settings.model_validate({"llm": {"provider": "simulated"}})
    assert pinned.provider_reason({}) == "simulated: [llm] provider = 'simulated'"


def service(tmp_path: Path, record: str, **events) -> ReasoningService:
    catalogue = build_catalogue(StrategyRegistry().discover(), REASONING)
    llm = FunctionLLM(lambda r: "<thinking>secret reasoning</thinking><answer>4</answer>")
    return ReasoningService(catalogue, llm, counter_for_model(llm.model), data_dir=tmp_path, events=EventsSettings(record=record, **events))


async def run(svc: ReasoningService, trace_id: str) -> None:
    from reasonray.api.service import ExecuteParams

    await svc.execute(ExecuteParams(query="my private question: what is 2+2?"), trace_id)


@pytest.mark.parametrize("record", ["full", "metadata", "off"])
async def test_event_logs_record_full_text_or_sizes_and_hashes_or_nothing_owner_only(tmp_path, record):
    os.umask(0o022)
    await run(service(tmp_path, record), "t-1")
    logs = list((tmp_path / "events").glob("*/t-1.jsonl")) if (tmp_path / "events").exists() else []
    if record == "off":
        assert logs == []
        return
    (path,) = logs
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
    text = path.read_text()
    invocation = next(e for e in read_event_log(path) if e["type"] == "LLM_INVOCATION")
    if record == "full":
        assert "my private question" in text and "secret reasoning" in text
    else:
        assert "my private question" not in text and "secret reasoning" not in text
        assert set(invocation["messages"]) == {"bytes", "sha256"} and invocation["messages"]["bytes"] > 0
        assert invocation["prompt_tokens"] > 0  # the sizes stay


def write_log(events: Path, day: str, name: str, size: int, mtime: float) -> Path:
    path = events / day / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))
    return path


def test_the_sweep_deletes_logs_past_the_age_then_the_oldest_past_the_total_size(tmp_path):
    now = time.time()
    events = tmp_path / "events"
    ancient = write_log(events, "2020-01-01", "a", 10, now - 40 * 86400)
    old = write_log(events, "2026-11-20", "b", 600_000, now - 3 * 86400)
    new = write_log(events, "2026-11-22", "c", 600_000, now - 60)
    swept = sweep(events, max_age_days=30, max_total_mb=1.0, now=now)
    assert not ancient.exists() and not old.exists() and new.exists()
    assert (swept.deleted_files, swept.kept_files) == (2, 1)
    assert not (events / "2020-01-01").exists()  # an old day's empty directory goes too


async def test_the_service_sweeps_on_its_own_every_interval(tmp_path):
    svc = service(tmp_path, "full", max_age_days=1, sweep_interval_s=3600)
    stale = write_log(tmp_path / "events", "2020-01-01", "stale", 10, time.time() - 5 * 86400)
    await run(svc, "t-2")
    await asyncio.gather(*svc._background)
    assert not stale.exists() and list((tmp_path / "events").glob("*/t-2.jsonl"))


def test_events_purge_before_a_date_from_the_cli(tmp_path):
    events = tmp_path / "data" / "events"
    gone = write_log(events, "2026-01-01", "a", 5, time.time())
    kept = write_log(events, "2026-03-01", "b", 5, time.time())
    config = tmp_path / "config.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    result = CliRunner().invoke(main, ["events", "purge", "--before", "2026-02-01", "--config", str(config)])
    assert result.exit_code == 0 and "deleted 1 event log(s)" in result.output, result.output
    assert not gone.exists() and kept.exists() and not gone.parent.exists()
    assert purge(events, date(2027, 1, 1)).deleted_files == 1 and not kept.exists()
    bad = CliRunner().invoke(main, ["events", "purge", "--before", "yesterday", "--config", str(config)])
    assert bad.exit_code == 2


async def test_session_turns_follow_the_record_mode_too(tmp_path):
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.reasoner.builtin_tools import builtin_toolbox
    from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
    from reasonray.stores.sessions import SqliteSessionStore

    llm = SimulatedLLM()
    pipeline = SessionPipeline(
        SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path, record="metadata"
    )
    rpc = local_dispatcher(REASONING, llm, sessions=LocalSessions(pipeline))
    created, _ = await rpc.handle_payload({"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": {}})
    sid = created["result"]["session_id"]
    turn, _ = await rpc.handle_payload(
        {"jsonrpc": "2.0", "id": 2, "method": "session.turn", "params": {"session_id": sid, "message": "my secret: what is 2 + 2?"}}
    )
    (path,) = (tmp_path / "events").glob(f"*/{turn['result']['trace_id']}.jsonl")
    assert "my secret" not in path.read_text() and stat.S_IMODE(path.stat().st_mode) == 0o600
