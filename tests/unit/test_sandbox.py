"""The python sandbox: output comes back; time, memory and output are limited; the environment is bare.
The escapes (secrets, network, forks, pipes) are tried in tests/security/test_sandbox_escapes.py."""

import pytest

from reasonray.kernel import sandbox
from reasonray.kernel.errors import SandboxUnavailableError
from reasonray.kernel.sandbox import SandboxLimits, run_python


async def test_output_comes_back():
    result = await run_python("print(sum(range(10)))")
    assert result.ok and result.stdout == "45\n"


async def test_time_memory_and_output_are_limited():
    slow = await run_python("while True: pass", SandboxLimits(timeout_s=1))
    assert slow.timed_out and slow.exit_code is None
    big = await run_python("x = bytearray(2 * 1024**3)", SandboxLimits(memory_mb=128))
    assert big.exit_code != 0 and "MemoryError" in big.stderr
    loud = await run_python("print('x' * 10000)", SandboxLimits(max_output_chars=100))
    assert loud.stdout.startswith("x" * 100) and "more characters" in loud.stdout


async def test_the_time_budget_is_cpu_time_with_a_wall_clock_backstop():
    # waiting costs no CPU: a program that waits a little past its budget finishes (a loaded machine, whose
    # wall clock runs slow for everyone, does not fail code that would finish)
    waits = await run_python("import time; time.sleep(1.5); print('done')", SandboxLimits(timeout_s=1))
    assert waits.ok and waits.stdout == "done\n"
    # spinning spends the budget: stopped by the CPU limit, reported as a timeout, not as a crash
    spins = await run_python("while True: pass", SandboxLimits(timeout_s=1))
    assert spins.timed_out and spins.exit_code is None
    # a program that only waits is stopped after three times its budget, in wall time
    sleeps = await run_python("import time; time.sleep(60)", SandboxLimits(timeout_s=1))
    assert sleeps.timed_out and SandboxLimits(timeout_s=1).wall_s == 3


async def test_the_environment_is_bare_and_the_directory_empty():
    result = await run_python("import os; print(sorted(os.environ)); print(os.getcwd(), os.listdir('.'))")
    assert result.stdout.splitlines() == ["['HOME', 'LANG', 'PATH', 'PWD']", "/tmp []"]


async def test_without_bubblewrap_nothing_runs(monkeypatch):
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    with pytest.raises(SandboxUnavailableError, match="never run unisolated"):
        await run_python("print('unisolated')")
