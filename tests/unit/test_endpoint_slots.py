"""An endpoint's capacity held across processes (the endpoint actor's slot board, reached through `SharedSlots`),
and a stream the server cut for another call making the endpoint serial, then plain."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from actors.endpoint import SlotBoard
from reasonray.gateway.concurrency import SHARED_LIMIT_MAX, EndpointLimiter, Lease
from reasonray.gateway.errors import TransientProviderError
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.protocol import LLMRequest, Message
from tests.unit.fixed_endpoint import fixed_endpoint


class BoardSlots:
    """`SharedSlots` of one process over a board in memory (the Ray client does the same over the actor)."""

    def __init__(self, board: SlotBoard, owner: str) -> None:
        self.board, self.owner = board, owner
        self.serialised: list[str] = []
        self.acquired = 0

    async def acquire(self, endpoint: str, limit: int) -> Lease:
        self.acquired += 1
        lease = Lease(endpoint, uuid.uuid4().hex)
        try:
            lease.serial = await self.board.acquire(endpoint, limit, lease.id, self.owner)
        except asyncio.CancelledError:
            self.release(lease)
            raise
        return lease

    def release(self, lease: Lease) -> None:
        self.board.release(lease.endpoint, lease.id)

    def serialise(self, endpoint: str) -> None:
        self.serialised.append(endpoint)
        self.board.serialise(endpoint)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_waiting_calls_get_the_slot_in_the_order_they_asked():
    board = SlotBoard()
    order: list[int] = []
    assert await board.acquire("e", 1, "first", "p1") is False
    waiters = [asyncio.create_task(board.acquire("e", 1, f"w{i}", f"p{i}")) for i in range(3)]
    await _settle()
    for i, waiter in enumerate(waiters):
        waiter.add_done_callback(lambda _, i=i: order.append(i))
    assert board.stats("e")["waiting"] == 3
    board.release("e", "first")
    for i in range(3):
        await _settle()
        assert order == list(range(i + 1))
        assert board.stats("e")["in_flight"] == 1
        board.release("e", f"w{i}")
    await asyncio.gather(*waiters)


async def test_a_holder_that_stops_heartbeating_loses_its_slot_and_its_place():
    now = [0.0]
    board = SlotBoard(ttl_s=10.0, clock=lambda: now[0])
    await board.acquire("e", 1, "dead-lease", "dead")  # the holder's process then dies
    dead_waiter = asyncio.create_task(board.acquire("e", 1, "dead-waiting", "dead"))
    alive = asyncio.create_task(board.acquire("e", 1, "alive-lease", "alive"))
    await _settle()
    now[0] = 8.0
    board.heartbeat("alive", 0)
    assert board.expire() == []
    now[0] = 12.0
    assert board.expire() == ["dead"]
    await _settle()
    assert alive.done() and dead_waiter.cancelled()
    assert board.stats("e") | {"peak": 0} == {"limit": 1, "serial": False, "in_flight": 1, "waiting": 0, "peak": 0}


async def test_a_cancelled_wait_keeps_no_slot_even_when_its_release_arrives_first():
    board = SlotBoard()
    board.release("e", "early")  # the release overtook its own acquire
    assert await board.acquire("e", 1, "early", "p") is False
    assert board.stats("e")["in_flight"] == 0
    await board.acquire("e", 1, "held", "p")
    waiting = asyncio.create_task(board.acquire("e", 1, "gave-up", "q"))
    await _settle()
    board.release("e", "gave-up")
    await _settle()
    assert waiting.cancelled() and board.stats("e")["waiting"] == 0


async def test_two_processes_limiters_together_never_exceed_a_limit_of_one():
    board = SlotBoard()
    limiters = []
    for owner in ("replica", "runner"):  # two processes: each its own limiter, of the same endpoint
        limiter = EndpointLimiter("http://llm/v1", limit=1)
        limiter.shared = BoardSlots(board, owner)
        limiters.append(limiter)
    running, most = 0, 0

    async def call(limiter: EndpointLimiter) -> None:
        nonlocal running, most
        ticket = await limiter.acquire()
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001)
        running -= 1
        limiter.release(ticket)

    await asyncio.gather(*(call(limiters[i % 2]) for i in range(12)))
    assert most == 1 and board.stats("http://llm/v1")["peak"] == 1
    assert board.stats("http://llm/v1")["in_flight"] == 0


async def test_a_large_limit_skips_the_cluster_round_trip():
    slots = BoardSlots(SlotBoard(), "p")
    limiter = EndpointLimiter("http://vllm/v1", limit=SHARED_LIMIT_MAX + 1)
    limiter.shared = slots
    limiter.release(await limiter.acquire())
    unknown = EndpointLimiter("http://unknown/v1")  # nothing discovered: the ceiling, a parallel server's
    unknown.shared = slots
    unknown.release(await unknown.acquire())
    assert slots.acquired == 0


async def test_a_cancelled_call_waiting_for_the_cluster_gives_back_its_local_slot():
    board = SlotBoard()
    await board.acquire("http://llm/v1", 1, "other-process", "other")
    limiter = EndpointLimiter("http://llm/v1", limit=1)
    limiter.shared = BoardSlots(board, "me")
    waiting = asyncio.create_task(limiter.acquire())
    await _settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert limiter.in_flight == 0 and board.stats("http://llm/v1")["waiting"] == 0


CUT = [{"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [{"index": 0, "delta": {"content": "par"}}]}]
PLAIN = {
    "id": "p",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole answer"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


async def test_a_stream_cut_without_a_finish_reason_makes_the_endpoint_serial_then_plain():
    with fixed_endpoint(PLAIN) as (answer, url):
        answer["events"] = CUT  # the server ends every stream with [DONE] and no finish reason
        llm = OpenAILLM("m", base_url=url, stream=True, discover=False)
        slots = BoardSlots(SlotBoard(), "me")
        llm.limiter.shared = slots
        request = LLMRequest(messages=(Message(role="user", content="hi"),), max_tokens=8)
        with pytest.raises(TransientProviderError, match="ended before the model finished"):
            await llm.complete(request)
        # the first cut: one call at a time, here and (through the shared slots) in every process
        assert llm.limiter.serial and llm.limiter.limit == 1 and slots.serialised == [llm.limiter.name]
        with pytest.raises(TransientProviderError):
            await llm.complete(request)  # cut although sent alone: someone else's calls cut it
        assert llm.limiter.plain
        completion = await llm.complete(request)
        assert completion.text == "whole answer" and not answer["request"].get("stream")
        await llm.close()


async def test_the_cluster_tells_a_process_that_the_endpoint_is_serial():
    board = SlotBoard()
    board.serialise("http://llm/v1")  # another process met the cut
    limiter = EndpointLimiter("http://llm/v1", limit=4)
    limiter.shared = BoardSlots(board, "me")
    limiter.release(await limiter.acquire())
    assert limiter.serial and limiter.limit == 1


def test_a_refusal_learnt_in_one_process_is_known_in_the_others_after_their_heartbeat():
    from reasonray.gateway.refusals import RefusalBook

    board = SlotBoard()
    first, second = RefusalBook(), RefusalBook()
    first.sink = lambda url, model, param: board.record_refusal(url, model, param)  # what RayEndpointSlots sends
    assert first.record("http://llm/v1", "o4-mini", "temperature") is True
    assert first.record("http://llm/v1", "o4-mini", "temperature") is False  # told once
    new, seen = board.heartbeat("second", 0)
    second.load(new)
    assert second.refused("http://llm/v1", "o4-mini") == {"temperature"}
    assert board.heartbeat("second", seen) == ([], 1)  # nothing new since


async def test_a_lease_whose_release_was_lost_is_freed_by_its_owners_next_heartbeat():
    now = [0.0]
    board = SlotBoard(clock=lambda: now[0])
    await board.acquire("e", 1, "lost", "me")  # held, then its release never arrived
    waiting = asyncio.create_task(board.acquire("e", 1, "next", "other"))
    await _settle()
    board.heartbeat("me", 0, ["lost"])
    now[0] = 30.0
    board.heartbeat("other", 0, [])
    board.heartbeat("me", 0, ["lost"])  # still held by the owner's own account: kept
    assert not waiting.done()
    board.heartbeat("me", 0, [])  # the owner no longer holds it
    await _settle()
    assert waiting.done() and board.stats("e")["in_flight"] == 1
