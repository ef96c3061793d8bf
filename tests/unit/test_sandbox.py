"""The python sandbox: output comes back; network, subprocesses, runaway time and memory do not get out."""

import pytest

from reasonray.sandbox import SandboxLimits, run_python


async def test_output_comes_back():
    result = await run_python("print(sum(range(10)))")
    assert result.ok and result.stdout == "45\n"


@pytest.mark.parametrize(
    ("code", "blocked"),
    [
        ("import socket; socket.create_connection(('127.0.0.1', 80))", "socket."),
        ("import urllib.request; urllib.request.urlopen('http://example.com')", "socket."),
        ("import subprocess; subprocess.run(['true'])", "subprocess.Popen"),
        ("import os; os.system('true')", "os.system"),
        ("import ctypes", "ctypes"),
    ],
)
async def test_network_and_children_are_refused(code, blocked):
    result = await run_python(code)
    assert not result.ok and f"the sandbox does not allow {blocked}" in result.stderr


async def test_time_memory_and_output_are_limited():
    slow = await run_python("while True: pass", SandboxLimits(timeout_s=1))
    assert slow.timed_out and slow.exit_code is None
    big = await run_python("x = bytearray(2 * 1024**3)", SandboxLimits(memory_mb=128))
    assert big.exit_code != 0 and "MemoryError" in big.stderr
    loud = await run_python("print('x' * 10000)", SandboxLimits(max_output_chars=100))
    assert loud.truncated and loud.stdout.startswith("x" * 100) and "more characters" in loud.stdout


async def test_the_environment_is_bare_and_the_directory_empty():
    result = await run_python("import os; print(sorted(os.environ)); print(os.listdir('.'))")
    assert result.stdout.splitlines() == ["['HOME', 'LANG', 'PATH']", "[]"]
