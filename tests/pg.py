"""A throw-away PostgreSQL cluster for tests and benchmarks (Debian's postgresql, scripts/setup.sh).

`initdb` and `postgres` refuse to run as root, so when the tests run as root the server runs as
`nobody` (setpriv execs it directly, so the Popen handle is the postmaster itself). It listens on a
free loopback port with a private socket directory, trusts local connections, and is removed on exit.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from reasonray.gateway.simulator.server import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "reasonray"


def available() -> bool:
    return (BIN / "postgres").exists()


class TempPostgres:
    def __init__(self, *, durable: bool = False) -> None:
        """`durable=False` turns fsync off (tests); benchmarks keep it on, as the file store fsyncs too."""
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="reasonray-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._databases = itertools.count(1)
        os.chmod(self.root, 0o755)
        self._chown(self.root)
        self._run([str(BIN / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust", "--no-sync", "-E", "UTF8"])

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/reasonray"

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv] if os.geteuid() == 0 else argv

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, "nobody", "nogroup")

    def _run(self, argv: list[str]) -> None:
        subprocess.run(self._as_owner(argv), check=True, capture_output=True, cwd=self.root)

    def start(self, timeout_s: float = 30) -> TempPostgres:
        options = ["-c", "listen_addresses=127.0.0.1", "-k", str(self.root), "-p", str(self.port), "-c", "max_connections=200"]
        if not self.durable:
            options += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 (the server writes it for its lifetime)
        self.proc = subprocess.Popen(
            self._as_owner([str(BIN / "postgres"), "-D", str(self.data), *options]), stdout=log, stderr=log, cwd=self.root
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(f"postgresql://{USER}@127.0.0.1:{self.port}/postgres", autocommit=True, connect_timeout=2) as conn:
                    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'reasonray'").fetchone():
                        conn.execute("CREATE DATABASE reasonray")
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {(self.root / 'postgres.log').read_text()[-2000:]}") from None
                time.sleep(0.1)

    def fresh_database(self) -> str:
        """The URL of a new, empty database on this server: a test that reads what a whole service wrote
        (every card, every session) gets one of its own, so what other tests stored is not in it."""
        name = f"t{next(self._databases)}"
        with psycopg.connect(f"postgresql://{USER}@127.0.0.1:{self.port}/postgres", autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Fast shutdown: open connections are dropped (what a client sees when the server restarts)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> TempPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
