import pytest

from reasonray.gateway.cache import CachingLLM, LRUTTLCache, cache_key
from reasonray.gateway.protocol import LLMRequest, user
from reasonray.gateway.testing import ScriptedLLM

BASE = LLMRequest(messages=(user("What is 2+2?"),), max_tokens=100)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": (user("What is 2+3?"),)},
        {"max_tokens": 101},
        {"stop": ("<answer>",)},
        {"temperature": 0.5},
        {"seed": 7},
        {"n": 2},
        {"tools": ({"type": "function", "function": {"name": "calc"}},)},
    ],
)
def test_every_output_changing_field_changes_the_key(change):
    import msgspec

    assert cache_key("m", BASE) != cache_key("m", msgspec.structs.replace(BASE, **change))


def test_the_model_is_part_of_the_key_and_equal_requests_share_one():
    assert cache_key("a", BASE) != cache_key("b", BASE)
    assert cache_key("a", BASE) == cache_key("a", LLMRequest(messages=(user("What is 2+2?"),), max_tokens=100))


async def test_lru_evicts_the_least_recently_used():
    cache = LRUTTLCache(max_entries=2)
    await cache.put("a", b"1")
    await cache.put("b", b"2")
    assert await cache.get("a") == b"1"  # a is now the most recent
    await cache.put("c", b"3")
    assert await cache.get("b") is None and await cache.get("a") == b"1" and await cache.get("c") == b"3"
    assert cache.stats().evictions == 1
    assert cache.stats().entries == 2  # the cache is full, at its bound


async def test_entries_expire_after_the_ttl():
    now = [0.0]
    cache = LRUTTLCache(max_entries=10, ttl_s=5, clock=lambda: now[0])
    await cache.put("a", b"1")
    now[0] = 5.0
    assert await cache.get("a") == b"1"
    now[0] = 5.1
    assert await cache.get("a") is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.expirations, stats.entries) == (1, 1, 1, 0)


async def test_repeatable_calls_are_served_from_the_cache():
    inner = ScriptedLLM(["<answer>4</answer>"])
    store = LRUTTLCache()
    llm = CachingLLM(inner, store)
    first = await llm.complete(BASE)
    second = await llm.complete(BASE)
    assert not first.cached and second.cached and second.text == first.text
    assert second.usage == first.usage and second.attempts == 0
    assert store.stats().hit_rate == 0.5
    inner.assert_complete()


async def test_sampled_calls_always_reach_the_model_but_seeded_ones_are_cached():
    import msgspec

    sampled = msgspec.structs.replace(BASE, temperature=0.8)
    seeded = msgspec.structs.replace(BASE, temperature=0.8, seed=3)
    inner = ScriptedLLM(["one", "two", "seeded"])
    llm = CachingLLM(inner, LRUTTLCache())
    assert (await llm.complete(sampled)).text == "one"
    assert (await llm.complete(sampled)).text == "two"
    assert (await llm.complete(seeded)).text == "seeded"
    assert (await llm.complete(seeded)).cached
    inner.assert_complete()


async def test_a_cache_of_one_holds_one_and_none_is_refused():
    with pytest.raises(ValueError, match="max_entries must be at least 1"):
        LRUTTLCache(max_entries=0)
    cache = LRUTTLCache(max_entries=1)
    await cache.put("a", b"1")
    assert await cache.get("a") == b"1"
    await cache.put("b", b"2")
    assert await cache.get("a") is None and await cache.get("b") == b"2"


async def test_the_statistics_count_every_lookup_and_eviction():
    now = [0.0]
    cache = LRUTTLCache(max_entries=2, ttl_s=5, clock=lambda: now[0])
    for key in "abcd":
        await cache.put(key, key.encode())  # a and b are evicted
    assert [await cache.get(k) for k in "abcd"] == [None, None, b"c", b"d"]
    assert await cache.get("c") == b"c"
    now[0] = 10.0
    assert await cache.get("c") is None and await cache.get("d") is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.expirations, stats.entries) == (3, 4, 2, 2, 0)


async def test_models_sharing_a_store_never_answer_for_each_other():
    store = LRUTTLCache()
    first, second = ScriptedLLM(["from a"], model="a"), ScriptedLLM(["from b"], model="b")
    assert (await CachingLLM(first, store).complete(BASE)).text == "from a"
    answer = await CachingLLM(second, store).complete(BASE)
    assert answer.text == "from b" and not answer.cached
    first.assert_complete()
    second.assert_complete()


async def test_a_hit_reports_the_lookup_time_and_an_error_reply_is_never_stored():
    from reasonray.gateway.protocol import Choice, Completion, Usage

    slow = Completion(choices=(Choice(text="4"),), usage=Usage(10, 1), model="m", latency_ms=5_000.0)
    inner = ScriptedLLM([slow])
    llm = CachingLLM(inner, LRUTTLCache())
    await llm.complete(BASE)
    hit = await llm.complete(BASE)
    assert hit.cached and 0.0 < hit.latency_ms < 1_000.0  # the lookup, not the original call's 5 s

    failed = Completion(choices=(Choice(text="", finish_reason="error"),), usage=Usage(10, 0), model="m")
    inner = ScriptedLLM([failed, "<answer>4</answer>"])
    llm = CachingLLM(inner, LRUTTLCache())
    assert (await llm.complete(BASE)).finish_reason == "error"
    again = await llm.complete(BASE)
    assert again.text == "<answer>4</answer>" and not again.cached
    inner.assert_complete()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def shared(tmp_path, **options):
    from reasonray.gateway.cache import SharedCacheStore

    return SharedCacheStore(tmp_path / "cache" / "app.sqlite3", **options)


async def test_processes_of_one_machine_share_the_file_and_it_outlives_them(tmp_path):
    one, other = shared(tmp_path), shared(tmp_path)
    assert await other.get("k") is None
    await one.put("k", b"answer")
    one.flush()
    assert await other.get("k") == b"answer"
    restarted = shared(tmp_path)
    assert await restarted.get("k") == b"answer"
    other.flush()  # its hit is counted on its own writer thread
    stats = await restarted.stats()
    assert (stats["hits"], stats["misses"], stats["entries"]) == (2, 1, 1) and stats["hit_rate"] == 2 / 3
    assert (tmp_path / "cache" / "app.sqlite3").stat().st_mode & 0o777 == 0o600


async def test_a_shared_entry_expires_after_the_ttl(tmp_path):
    clock = Clock()
    store = shared(tmp_path, ttl_s=10, clock=clock)
    await store.put("k", b"v")
    store.flush()
    clock.now += 9
    assert await store.get("k") == b"v"
    clock.now += 2
    assert await store.get("k") is None
    stats = await store.stats()
    assert (stats["expirations"], stats["entries"], stats["misses"]) == (1, 0, 1)


async def test_the_shared_store_keeps_max_entries_dropping_the_least_recently_used(tmp_path):
    clock = Clock()
    store = shared(tmp_path, max_entries=3, clock=clock, prune_every=1)
    for key in "abc":
        clock.now += 1
        await store.put(key, key.encode())
    store.flush()
    clock.now += 1
    assert await store.get("a") == b"a"  # a is now the most recently used
    store.flush()
    for key in "de":
        clock.now += 1
        await store.put(key, key.encode())
    store.flush()
    assert [await store.get(key) for key in "abcde"] == [b"a", None, None, b"d", b"e"]
    assert (await store.stats())["evictions"] == 2


async def test_a_broken_cache_file_is_a_miss_never_a_failed_call(tmp_path):
    store = shared(tmp_path)
    await store.put("k", b"v")
    store.flush()
    (tmp_path / "cache" / "app.sqlite3").write_bytes(b"not a database" * 100)
    broken = shared(tmp_path)
    llm = ScriptedLLM(["<answer>4</answer>"])
    completion = await CachingLLM(llm, broken).complete(BASE)
    assert completion.text == "<answer>4</answer>" and not completion.cached
