"""The python sandbox against escapes that once worked (audit-hook tampering, reading the parent's
environment, sockets, fork bombs, output floods...): each attempt runs in the real sandbox
(bubblewrap, uid 64999, prlimit) and must FAIL, with the failure visible in what the code printed.

Every case runs whatever uid the suite runs as (root: setpriv drops to 64999 on the host; otherwise a
user namespace maps the service's uid to 64999); tests/security/test_sandbox_unprivileged.py runs them all again as an
unprivileged user when the suite runs as root."""

import os
import shutil
import socket
import subprocess
import time
from unittest import mock

import pytest

from reasonray.kernel import sandbox
from reasonray.kernel.sandbox import SandboxLimits, run_python


async def run(code: str, **limits):
    return await run_python(code, SandboxLimits(**{"timeout_s": 5.0, **limits}))


def fork_bomb(child_sleep_s: int) -> str:
    """Code that forks up to 200 sleeping children, then prints `STOPPED <children> <error>` when a fork fails."""
    return (
        "import os\n"
        "children = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        if os.fork() == 0:\n"
        f"            import time; time.sleep({child_sleep_s}); os._exit(0)\n"
        "        children += 1\n"
        "except OSError as e:\n"
        "    print('STOPPED', children, type(e).__name__)\n"
    )


async def test_tampering_with_an_audit_hook_gains_nothing():
    # the one-line escape of the old sandbox; now there is no hook to defeat, the isolation is the kernel's
    code = (
        "import __main__; __main__._BLOCKED = ()\n"
        "import os, subprocess\n"
        "print(subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip())\n"
        "print(os.path.exists('/root/.ray'), os.path.exists('/work'), os.path.exists('/etc'))\n"
    )
    result = await run(code)
    assert result.ok, result.stderr
    assert result.stdout.split() == ["64999", "False", "False", "False"]


async def test_the_parents_environment_is_unreadable(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()] + [str(os.getppid())]:\n"
        "    try:\n"
        "        print(pid, open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as e:\n"
        "        print(pid, type(e).__name__)\n"
    )
    result = await run(code)
    assert result.ok, result.stderr
    assert "sk-must-not-leak" not in result.stdout
    assert result.stdout.splitlines()[0] == "['HOME', 'LANG', 'PATH', 'PWD']"
    # the host's processes are not even visible: a fresh pid namespace
    assert str(os.getpid()) not in result.stdout.split()


@pytest.mark.parametrize(
    "path",
    [os.path.expanduser("~/.ray/auth_token"), "/etc/shadow", "/work/main/data", os.getcwd(), "/proc/1/root/etc/passwd"],
)
async def test_secrets_and_the_data_dir_are_out_of_reach(path):
    code = f"import os\ntry:\n    print(os.listdir({path!r}) if os.path.isdir({path!r}) else open({path!r}).read())\nexcept OSError as e:\n    print('DENIED', type(e).__name__)\n"
    result = await run(code)
    assert result.ok, result.stderr
    assert result.stdout.startswith("DENIED"), result.stdout


async def test_writes_outside_the_scratch_dir_fail(tmp_path):
    target = tmp_path / "owned"
    code = (
        "import os\n"
        f"for path in ['/owned', '/usr/owned', {str(target)!r}, '/root/owned', '/dev/shm/owned']:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('WROTE', path)\n"
        "    except OSError as e:\n"
        "        print('DENIED', path, type(e).__name__)\n"
        "open('/tmp/scratch', 'w').write('fine'); print('SCRATCH', open('/tmp/scratch').read())\n"
    )
    result = await run(code)
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout and "SCRATCH fine" in result.stdout
    assert not target.exists()


async def test_files_are_capped_in_size():
    result = await run("open('/tmp/big', 'wb').write(b'x' * (8 * 1024 * 1024))", max_file_mb=1)
    assert not result.ok  # SIGXFSZ or EFBIG, either way the file did not grow


async def test_a_fork_bomb_stops_at_the_process_limit():
    code = fork_bomb(child_sleep_s=30)
    started = time.monotonic()
    result = await run(code, max_processes=8, timeout_s=3.0)
    assert "STOPPED" in result.stdout, (result.stdout, result.stderr)
    assert int(result.stdout.split()[1]) < 8
    assert time.monotonic() - started < 10  # the sleeping children died with the sandbox


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged uid needs root; as non-root the test above runs that path")
def test_an_unprivileged_service_caps_processes_too():
    # the process cap once applied only to a service running as root; an unprivileged one had none.
    # The system interpreter stands in for the service's, which lives where uid 1000 cannot read.
    system_python = shutil.which("python3", path="/usr/bin")
    if system_python is None:
        pytest.skip("no /usr/bin/python3 to run as an unprivileged uid")
    with mock.patch.object(sandbox.os, "geteuid", return_value=1000):
        command = sandbox._command(SandboxLimits(max_processes=8), "/usr", system_python)
    code = fork_bomb(child_sleep_s=5)
    unprivileged = ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "--"]
    ran = subprocess.run(
        [*unprivileged, *command], input=code, capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"}
    )
    assert ran.stdout.startswith("STOPPED"), (ran.stdout, ran.stderr)
    assert int(ran.stdout.split()[1]) < 8


async def test_a_grandchild_holding_the_pipe_dies_with_the_timeout():
    code = (
        "import subprocess, time\n"
        "subprocess.Popen(['sleep', '300'])  # inherits stdout and stderr\n"
        "print('spawned', flush=True)\n"
        "time.sleep(300)\n"
    )
    started = time.monotonic()
    result = await run(code, timeout_s=3.0)  # time for the interpreter to start and spawn on a busy machine
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code is None and "spawned" in result.stdout
    assert elapsed < 10, f"the run waited {elapsed:.1f} s on a pipe a grandchild held"


async def test_a_flood_of_output_is_cut_while_read():
    # 2 GB of output would not fit the test's memory if it were buffered before being cut
    code = "import sys\nchunk = 'z' * 1_000_000\nfor _ in range(2000): sys.stdout.write(chunk)\n"
    result = await run(code, max_output_chars=1000, timeout_s=3.0)
    assert result.stdout.startswith("z" * 1000) and "more characters" in result.stdout and len(result.stdout) < 1100


@pytest.mark.parametrize(
    "code",
    [
        "import socket; socket.create_connection(('127.0.0.1', 8000), timeout=2)",
        "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)",
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/ray/session_latest/sockets/raylet')",
        "import urllib.request; urllib.request.urlopen('http://example.com', timeout=2)",
    ],
)
async def test_sockets_reach_nothing(code):
    result = await run(code)
    assert not result.ok and ("OSError" in result.stderr or "Error" in result.stderr), result.stderr
    assert "Traceback" in result.stderr


async def test_memory_is_capped():
    result = await run("x = bytearray(1024**3)", memory_mb=128)
    assert not result.ok and "MemoryError" in result.stderr


async def test_a_service_listening_on_the_hosts_loopback_is_out_of_reach():
    # a refused connection to a port where nothing listens proves nothing: here something does listen, so
    # only a network namespace of the sandbox's own keeps the code from it
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('REACHED')\n"
            "except OSError as e:\n    print('BLOCKED', type(e).__name__)\n"
            "print('INTERFACES', sorted(name for _, name in socket.if_nameindex()))\n"
        )
        result = await run(code)
    assert "BLOCKED" in result.stdout and "REACHED" not in result.stdout, (result.stdout, result.stderr)
    assert "INTERFACES ['lo']" in result.stdout, result.stdout  # the host's interfaces are not there
