"""Start-up cost of the python sandbox (bubblewrap + prlimit + setpriv) against a bare interpreter.

    python bench/sandbox_start.py [runs]

Prints the median wall time of `print(1)` run both ways, sequentially, and the ratio (same run)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from reasonray.kernel.sandbox import interpreter, run_python


async def bare(exe: str) -> None:
    proc = await asyncio.create_subprocess_exec(exe, "-I", "-c", "print(1)", stdout=asyncio.subprocess.PIPE)
    await proc.communicate()


async def main(runs: int) -> None:
    exe, _ = interpreter()
    sandboxed, plain = [], []
    for _ in range(runs):
        started = time.perf_counter()
        result = await run_python("print(1)")
        sandboxed.append(time.perf_counter() - started)
        assert result.ok, result.stderr
        started = time.perf_counter()
        await bare(exe)
        plain.append(time.perf_counter() - started)
    s, p = statistics.median(sandboxed) * 1000, statistics.median(plain) * 1000
    print(f"runs={runs} sandboxed_median_ms={s:.1f} bare_median_ms={p:.1f} ratio={s / p:.2f}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
