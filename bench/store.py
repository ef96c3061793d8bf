"""Session load and save, the local SQLite store against PostgreSQL, at 1 and 64 concurrent sessions.

    .venv/bin/python bench/store.py [--sessions 256] [--concurrency 64] [--turns 2000] [--messages 12] [--pool 4]

Each "turn" is what the session pipeline does to the store around a reasoner run: load the
session, then save it (one version later) with the turn's exchange appended. Workers run turns on
distinct sessions at once as coroutines of one event loop, through the repositories the service
uses, as a session host does (one loop, many sessions; PostgreSQL through the store's async pool
of `--pool` connections, the size a host's pool has). The local store writes its SQLite file under a temporary
directory (synchronous=FULL); PostgreSQL is a throw-away local server (tests/pg.py) with fsync on, so both
are durable. Prints p50/p95 of load and save, turns (session round trips) per second, and what
PostgreSQL adds to a turn's p50 (target: under 5 ms), for one session, for 64 back to back (the store
saturated: a file store's blocking calls serialise the loop, so compare throughput there), and for 64
whose turns wait on the model between load and save (`--think-ms`, as a service runs them).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _env  # noqa: F401  (sets up the environment first)

from reasonray.gateway.protocol import Message
from reasonray.reasoner.providers import ContextProviders, ModeSpec, ModeState
from reasonray.reasoner.session import SessionRepository, SessionSpec, SessionState
from reasonray.stores.postgres import PgStore
from reasonray.stores.sessions import PgSessionStore, open_sessions
from tests.pg import TempPostgres  # the throw-away server the tests use (the repository is on sys.path: _env)


def session(i: int, messages: int) -> SessionState:
    providers = ContextProviders("You are a helpful assistant.", ModeState("default", {"default": ModeSpec()}))
    for m in range(messages):
        providers.history.append(Message(role="user" if m % 2 == 0 else "assistant", content=f"message {m} " + "lorem ipsum " * 25))
    now = datetime.now(UTC)
    return SessionState(
        session_id=f"bench-session-{i:05d}", status="idle", created_at=now, updated_at=now, spec=SessionSpec(), providers=providers.dump()
    )


async def run(repo: SessionRepository, ids: list[str], concurrency: int, turns: int, think_s: float = 0.0) -> dict[str, float]:
    loads: list[float] = []
    saves: list[float] = []

    async def worker(w: int) -> None:
        mine = ids[w::concurrency]
        if think_s:  # sessions arrive spread over a turn's time, as a service's do, not all in the same instant
            await asyncio.sleep(think_s * w / concurrency)
        for t in range(turns // concurrency):
            sid = mine[t % len(mine)]
            started = time.perf_counter()
            state = await repo.load(sid)
            loaded = time.perf_counter()
            assert state is not None
            if think_s:  # the turn's reasoner run (its model calls) between the load and the save
                await asyncio.sleep(think_s)
            saving = time.perf_counter()
            await repo.save(state.model_copy(update={"turn": state.turn + 1, "last_answer": f"answer {t}"}))
            loads.append((loaded - started) * 1000)
            saves.append((time.perf_counter() - saving) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - started
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]
    turn = [a + b for a, b in zip(loads, saves, strict=True)]
    return {
        "load_p50": q(loads, 50),
        "load_p95": q(loads, 95),
        "save_p50": q(saves, 50),
        "save_p95": q(saves, 95),
        "turn_p50": q(turn, 50),
        "per_s": len(turn) / wall,
    }


async def measure(args: argparse.Namespace, pg_url: str, tmp: str) -> dict[tuple[str, int], dict[str, float]]:
    states = [session(i, args.messages) for i in range(args.sessions)]
    results: dict[tuple[str, int], dict[str, float]] = {}
    for name, url in (("sqlite", None), ("postgresql", pg_url)):
        store = PgStore(url, max_size=args.pool) if url is not None else None
        repo = open_sessions(SessionState, None, Path(tmp) / name) if store is None else PgSessionStore(SessionState, store)
        for state in states:
            await repo.save(state)
        ids = [s.session_id for s in states]
        await run(repo, ids, args.concurrency, args.concurrency * 4)  # warm-up: pool, prepared statements, caches
        for concurrency in (1, args.concurrency):  # 1: what the store adds to one turn; N: saturated, back to back
            results[(name, concurrency)] = await run(repo, ids, concurrency, args.turns if concurrency > 1 else args.turns // 4)
        # N sessions whose turns each wait on the model for --think-ms, as a service runs them (bench/sessions.py:
        # about 64 turns/s at 64 concurrent): what the store adds to a turn there
        paced = await run(repo, ids, args.concurrency, args.concurrency * 4, args.think_ms / 1000)
        results[(name, -args.concurrency)] = paced
        if store is not None:
            await store.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=12, help="Messages in each session's conversation.")
    parser.add_argument("--pool", type=int, default=4, help="PostgreSQL connections in the pool (a session host's default).")
    parser.add_argument("--think-ms", type=float, default=1000, help="The model's time in each turn of the paced run.")
    args = parser.parse_args()
    size_kb = len(session(0, args.messages).model_dump_json()) / 1024
    with tempfile.TemporaryDirectory(prefix="reasonray-bench-") as tmp, TempPostgres(durable=True) as pg:
        results = asyncio.run(measure(args, pg.url, tmp))
    print(
        f"session store, {args.turns} turns over {args.sessions} sessions of {size_kb:.1f} KiB (load, then save one version later); "
        f"PostgreSQL pool of {args.pool}"
    )
    print(f"{'store':<11} {'conc':>4} {'load p50':>9} {'load p95':>9} {'save p50':>9} {'save p95':>9} {'turn p50':>9} {'turns/s':>8}")
    for (name, concurrency), r in results.items():
        label = f"{-concurrency}*" if concurrency < 0 else str(concurrency)
        print(
            f"{name:<11} {label:>4} {r['load_p50']:>7.2f}ms {r['load_p95']:>7.2f}ms {r['save_p50']:>7.2f}ms {r['save_p95']:>7.2f}ms "
            f"{r['turn_p50']:>7.2f}ms {r['per_s']:>8.0f}"
        )
    print(f"(* = {args.concurrency} sessions whose turns each wait {args.think_ms:g} ms on the model between load and save)")
    for concurrency in (1, args.concurrency, -args.concurrency):
        added = results[("postgresql", concurrency)]["turn_p50"] - results[("sqlite", concurrency)]["turn_p50"]
        ratio = results[("postgresql", concurrency)]["per_s"] / results[("sqlite", concurrency)]["per_s"]
        how = f"{-concurrency:>2} concurrent, paced" if concurrency < 0 else f"{concurrency:>2} concurrent, back to back"
        if concurrency > 1:  # saturated: PostgreSQL's latency is its queue, the file store's blocking calls hide theirs
            print(f"at {how}: throughput x{ratio:.2f} of SQLite (the store saturated; its latency there is queueing)")
            continue
        verdict = "met" if added < 5 else "NOT met"
        print(f"at {how}: PostgreSQL adds {added:+.2f} ms to a turn's p50 (target < 5 ms: {verdict}); throughput x{ratio:.2f} of SQLite")


if __name__ == "__main__":
    main()
