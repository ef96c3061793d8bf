"""The gateway against servers like llama.cpp's, over HTTP: what it discovers, counting in the model's own tokens,
one call at a time where the server runs one at a time, deadlines that start when the server does, streams that
stop the generation when abandoned, and a cache that does not outlive the model behind a name."""

import asyncio
import math
import time

import pytest

from reasonray.gateway.cache import LRUTTLCache
from reasonray.gateway.capabilities import capabilities_of, endpoint_client
from reasonray.gateway.concurrency import EndpointLimiter
from reasonray.gateway.errors import ProviderRejectedError, ProviderUnavailableError, TransientProviderError
from reasonray.gateway.factory import build_llm, client_for
from reasonray.gateway.model_tokens import ModelTokenCounter
from reasonray.gateway.observed import ObservedLLM
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.gateway.tokens import count_messages, counter_for_model
from reasonray.kernel.config import Settings
from tests.unit.llama_double import LlamaDouble

GSM8K = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends "
    "every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in "
    "dollars does she make every day at the farmers' market? 16 - 3 - 4 = 9 eggs; 9 * 2 = 18 dollars. #### 18"
)


async def discover(llm):
    """Have the stack's endpoint client ask its server what it is; what every layer then reports."""
    await endpoint_client(llm).discover()
    return capabilities_of(llm)


@pytest.fixture
def double(request):
    options = getattr(request, "param", {})
    server = LlamaDouble(**options).start()
    yield server
    server.stop()


def stack_for(server, **llm):
    settings = Settings.model_validate(
        {"llm": {"provider": "openai", "base_url": server.url, "model": "smollm2", "api_key_required": False, **llm}}
    )
    client = client_for(settings, {})
    return build_llm(settings, client, LRUTTLCache())[0], client


def ask(text: str, **kw) -> LLMRequest:
    return LLMRequest(messages=(system("Solve it."), user(text)), **kw)


@pytest.mark.parametrize("double", [{"flavour": "llama-cpp-python"}, {"flavour": "llama.cpp", "n_ctx": 2048}], indirect=True)
async def test_discovery_fills_in_the_capabilities_every_layer_reports(double):
    llm, client = stack_for(double, context_length=4096 if double.flavour == "llama-cpp-python" else None)
    before = capabilities_of(llm)
    assert not before.tokenize and before.max_concurrency is None
    caps = await discover(llm)
    assert caps == capabilities_of(llm) == client.capabilities
    assert caps.tokenize and caps.max_concurrency == 1
    # llama-cpp-python tells nobody its n_ctx: the configured value; llama.cpp's /props gives its own
    assert caps.context_length == (4096 if double.flavour == "llama-cpp-python" else 2048)
    assert not caps.structured_output and not caps.tool_choice  # not known to be enforced there: strategies parse tolerantly
    assert client.endpoint.flavour == double.flavour and client.limiter.limit == 1


async def test_configured_capabilities_win_over_what_is_discovered(double):
    llm, _ = stack_for(double, max_concurrency=3, context_length=1000, structured_output=True, tool_choice=True)
    caps = await discover(llm)
    assert (caps.max_concurrency, caps.context_length, caps.structured_output, caps.tool_choice) == (3, 1000, True, True)


async def test_the_run_counts_in_the_models_tokens_and_cuts_by_the_same_count(double):
    llm, _client = stack_for(double, context_length=4096)
    await discover(llm)
    tokens = llm.tokens
    assert tokens.encoding_name == "server:llama-cpp-python"
    assert tokens.count(GSM8K) == len(double.tokenize(GSM8K)) != counter_for_model("smollm2").count(GSM8K)
    for n in (1, 7, 50, 99):
        head, tail = tokens.head(GSM8K, n), tokens.tail(GSM8K, n)
        assert len(double.tokenize(head)) <= n and len(double.tokenize(tail)) <= n
        assert len(double.tokenize(head)) >= n - 2 and GSM8K.startswith(head) and GSM8K.endswith(tail)
    # the framing (ChatML markers, the injected system prompt) is learned from the first usage the server reports
    request = LLMRequest(messages=(user(GSM8K),), max_tokens=5)
    observed = ObservedLLM(llm, lambda event: None, trace_id="t", strategy="s")
    await observed.complete(request)
    assert count_messages(tokens, request.messages) == double.prompt_tokens([{"role": "user", "content": GSM8K}])
    with_system = (system("Solve it."), user(GSM8K))
    assert count_messages(tokens, with_system) == double.prompt_tokens(
        [{"role": "system", "content": "Solve it."}, {"role": "user", "content": GSM8K}]
    )
    assert observed.tokens is tokens


async def test_counting_is_cached_so_it_stays_cheap(double):
    llm, _ = stack_for(double, context_length=4096)
    await discover(llm)
    tokens = llm.tokens
    tokens.count(GSM8K)
    started = time.perf_counter()
    for _ in range(2000):
        tokens.count(GSM8K)
    per_count_us = (time.perf_counter() - started) / 2000 * 1e6
    assert per_count_us < 50, f"a cached count took {per_count_us:.1f} us"


async def test_without_a_tokenizer_the_estimate_is_calibrated_by_reported_usage_and_errs_high(double):
    llm, _client = stack_for(double, context_length=4096, tokenizer="calibrated")
    await discover(llm)  # the tokenize endpoint calibrates, but is not used to count
    tokens = llm.tokens
    assert isinstance(tokens, ModelTokenCounter) and not tokens.exact and tokens.ratio > 1.2
    await llm.complete(LLMRequest(messages=(user(GSM8K),), max_tokens=5))
    assert tokens.count(GSM8K) >= len(double.tokenize(GSM8K))
    assert count_messages(tokens, (user(GSM8K),)) >= double.prompt_tokens([{"role": "user", "content": GSM8K}])
    for n in (10, 40):  # cut by the same count; by the server's, within the margin an estimate has
        head, tail = tokens.head(GSM8K, n), tokens.tail(GSM8K, n)
        assert tokens.count(head) <= n and tokens.count(tail) <= n
        assert len(double.tokenize(head)) <= n * 1.1 and len(double.tokenize(tail)) <= n * 1.1


async def test_max_tokens_never_exceeds_what_the_context_leaves_and_defaults_by_purpose(double):
    llm, _ = stack_for(double, context_length=4096, default_max_tokens={"default": 300, "score": 40})
    await llm.complete(ask("[[say 3]]", max_tokens=32768))
    prompt = double.prompt_tokens([{"role": "system", "content": "Solve it."}, {"role": "user", "content": "[[say 3]]"}])
    assert 4096 - prompt - 40 <= double.stats.max_tokens_seen[-1] <= 4096 - prompt
    await llm.complete(ask("[[say 3]]", purpose="score"))
    await llm.complete(ask("[[say 3]]"))
    assert double.stats.max_tokens_seen[-2:] == [40, 300]
    with pytest.raises(ProviderRejectedError, match="context is 4096"):
        await llm.complete(ask("7 " * 3000))


async def test_a_context_length_error_teaches_the_context_length_and_the_call_is_fitted_to_it(double):
    llm, client = stack_for(double, default_max_tokens={"default": 100000})
    assert client.capabilities.context_length is None  # llama-cpp-python does not say, and none is configured
    assert (await llm.complete(ask("[[say 2]]"))).finish_reason == "stop"
    assert client.capabilities.context_length == 4096
    rejected, fitted = double.stats.max_tokens_seen[-2:]
    assert rejected == 100000 and fitted < 4096
    with pytest.raises(ProviderRejectedError, match="context is 4096"):  # a prompt that cannot fit is refused here
        await llm.complete(ask("7 " * 3000))


@pytest.mark.parametrize("double", [{"seconds_per_token": 0.05}], indirect=True)
async def test_a_one_at_a_time_server_gets_one_call_at_a_time_and_the_timeout_starts_with_it(double):
    # each call generates for 0.5 s and may take 0.8 s once started: five at once all finish, one after the other,
    # although the last waits about 2 s for its turn
    llm, _ = stack_for(double, context_length=4096, request_timeout_s=0.8, retry={"max_attempts": 1})
    results = await asyncio.gather(*(llm.complete(ask(f"[[say 10]] {i}")) for i in range(5)))
    assert all(r.finish_reason == "stop" and r.usage.completion_tokens == 10 for r in results)
    assert double.stats.max_at_server == 1  # never one waiting there, where its time would run out unseen
    assert double.stats.generations_finished == 7  # (the first two are one-token probes of the chat framing)


@pytest.mark.parametrize("double", [{"flavour": "opaque", "seconds_per_token": 0.05}], indirect=True)
async def test_a_server_that_says_nothing_is_learned_to_run_one_call_at_a_time(double):
    llm, client = stack_for(double, context_length=4096)
    assert (await discover(llm)).max_concurrency is None and client.limiter.limit == 256
    first = await asyncio.gather(*(llm.complete(ask(f"[[say 12]] {i}")) for i in range(3)))
    assert double.stats.max_at_server > 1 and all(r.finish_reason == "stop" for r in first)
    assert client.limiter.learned == 1 and capabilities_of(llm).max_concurrency == 1
    double.stats.max_at_server = 0
    again = await asyncio.gather(*(llm.complete(ask(f"[[say 12]] again {i}")) for i in range(3)))
    assert not any(r.cached for r in again)
    assert double.stats.max_at_server == 1


@pytest.mark.parametrize("double", [{"seconds_per_token": 0.1}], indirect=True)
async def test_a_timed_out_stream_is_closed_and_the_server_stops_generating(double):
    # a steady stream is cut only by the overall deadline (request_timeout_s is the longest wait for the next token)
    llm, _ = stack_for(double, context_length=4096, generation_deadline_s=0.5, retry={"max_attempts": 1})
    observed = ObservedLLM(llm, lambda event: None, trace_id="t", strategy="s")
    with pytest.raises(ProviderUnavailableError, match="generation_deadline_s") as failed:
        await observed.complete(ask("[[say 40]]"))
    await asyncio.sleep(0.5)
    assert double.stats.abandoned_at and double.stats.abandoned_at[0] < 12  # of 40: it stopped when the stream closed
    assert double.stats.tokens_generated < 14  # (two more for the first call's one-token probes of the chat framing)
    # what the failed call spent is kept: one call, its prompt and the tokens generated before the deadline
    prompt, generated = failed.value.spent
    assert prompt > 0 and 2 <= generated < 12
    assert observed.tally.calls == 1 and observed.tally.completion_tokens == generated


@pytest.mark.parametrize("double", [{"seconds_per_token": 0.1}], indirect=True)
async def test_a_cancelled_call_stops_the_generation_too(double):
    llm, _ = stack_for(double, context_length=4096)
    call = asyncio.ensure_future(llm.complete(ask("[[say 40]]")))
    while double.stats.generations_started < 3:  # the first two are one-token probes of the chat framing
        await asyncio.sleep(0.02)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(0.4)
    assert double.stats.abandoned_at and double.stats.abandoned_at[0] < 10 and double.stats.tokens_generated < 12


@pytest.mark.parametrize("double", [{"seconds_per_token": 0.02}], indirect=True)
async def test_a_cached_answer_is_not_served_once_another_model_answers_behind_the_same_name(double):
    llm, client = stack_for(double, context_length=4096, discovery_ttl_s=0.05)
    first = await llm.complete(ask("[[say 2]]"))
    assert (await llm.complete(ask("[[say 2]]"))).cached
    double.vocab_offset, double._vocab, double._pieces = 1000, {}, {}  # another model: its tokenizer gives other ids
    await asyncio.sleep(0.1)
    again = await llm.complete(ask("[[say 2]]"))
    assert not again.cached and again.text == first.text
    assert client.endpoint.fingerprint and (await llm.complete(ask("[[say 2]]"))).cached


async def test_the_limiter_learns_that_a_server_runs_one_call_at_a_time():
    now = [0.0]
    limiter = EndpointLimiter("x", ceiling=8, clock=lambda: now[0])
    a, b = await limiter.acquire(), await limiter.acquire()  # both sent at t=0
    limiter.started(a)
    now[0] = 2.0
    limiter.release(a)  # a generated for 2 s while b waited
    limiter.started(b)  # b's first token only after a was done: the server ran one at a time
    assert limiter.learned == 1 and limiter.limit == 1
    third = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert not third.done()  # b holds the only slot
    limiter.release(b)
    await asyncio.wait_for(third, 1)


async def test_the_limiter_keeps_the_parallelism_a_server_shows():
    now = [0.0]
    limiter = EndpointLimiter("y", ceiling=8, clock=lambda: now[0])
    tickets = [await limiter.acquire() for _ in range(3)]
    for t in tickets:
        limiter.started(t)  # all three generating together
    now[0] = 1.0
    for t in tickets:
        limiter.release(t)
    assert limiter.learned is None and limiter.limit == 8 and limiter.peak_generating == 3


async def test_a_waiter_cancelled_while_queued_gives_no_slot_away():
    limiter = EndpointLimiter("z", limit=1)
    held = await limiter.acquire()
    waiter = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    limiter.release(held)
    assert limiter.in_flight == 0 and limiter.waiting == 0
    await asyncio.wait_for(limiter.acquire(), 1)


async def test_against_the_simulator_streams_and_plain_calls_agree():
    server = SimulatorServer(SimulatorSettings(port=0)).start()
    try:
        plain = OpenAILLM("simulated", base_url=server.url, api_key="x")
        streamed = OpenAILLM("simulated", base_url=server.url, api_key="x", stream=True)
        request = ask("What is 17 * 23?", max_tokens=200)
        a, b = await plain.complete(request), await streamed.complete(request)
        assert a.text == b.text and "<answer>391</answer>" in b.text and b.simulated
        assert a.usage == b.usage and b.finish_reason == "stop"
        caps = await plain.discover()
        assert plain.endpoint.flavour == "simulator" and not caps.tokenize
        assert isinstance(plain.tokens, ModelTokenCounter) and plain.tokens.ratio == 1.0  # the simulator counts as we do
        assert math.isclose(plain.tokens.count("What is 17 * 23?"), math.ceil(counter_for_model("x").count("What is 17 * 23?") * 1.1))
    finally:
        server.stop()


def test_stream_chunks_reassemble_tool_calls_and_refuse_a_stream_cut_short():
    from types import SimpleNamespace as NS

    from reasonray.gateway.replies import StreamParts

    def chunk(delta, finish=None, index=0):
        return NS(model="m", usage=None, choices=[NS(index=index, delta=NS(**delta), finish_reason=finish, model_extra={})])

    parts = StreamParts()
    fn = NS(name="calc", arguments='{"a": ')
    parts.add(chunk({"content": None, "tool_calls": [NS(index=0, id="c1", function=fn)]}))
    parts.add(chunk({"content": None, "tool_calls": [NS(index=0, id=None, function=NS(name=None, arguments="1}"))]}))
    llm = OpenAILLM("m", base_url="http://127.0.0.1:9/v1", discover=False)
    with pytest.raises(TransientProviderError, match="ended before the model finished"):
        llm._assembled(parts, ask("q"))
    parts.add(chunk({"content": None, "tool_calls": None}, finish="tool_calls"))
    done = llm._assembled(parts, ask("q"))
    assert done.tool_calls[0].name == "calc" and done.tool_calls[0].arguments == '{"a": 1}' and done.finish_reason == "tool_calls"
    assert done.usage.prompt_tokens > 0  # no usage chunk: counted as the model counts


@pytest.mark.parametrize("double", [{"seconds_per_token": 0.0}], indirect=True)
async def test_a_bounded_chunk_never_exceeds_chunk_size_by_the_servers_count(double):
    from reasonray.kernel.events import EventRecorder
    from reasonray.strategies.base import StrategyContext
    from reasonray.strategies.bounded_context import BoundedContext

    llm, _ = stack_for(double, context_length=4096, stream=False)  # plain answers: the server reports its own usage
    recorder = EventRecorder(None, keep=True)
    context = StrategyContext(
        llm=ObservedLLM(llm, recorder, trace_id="t", strategy="bounded_context"), tokens=llm.tokens, emit=recorder, trace_id="t"
    )
    config = {"chunk_size": 1024, "carryover_size": 512, "max_iterations": 3}
    with pytest.raises(Exception, match="within 3 iterations"):  # the model rambles to every limit and never answers
        await BoundedContext().reason(f"[[say 5000]] {GSM8K}", context=context, config=config)
    chunks = [u for u in double.stats.usage if u[1] > 1]  # (the third chunk repeats the second: the cache answers it)
    assert len(chunks) >= 2
    assert all(prompt + completion <= 1024 for prompt, completion in chunks), chunks
    assert max(prompt + completion for prompt, completion in chunks) >= 1024 - 64  # and it uses the room it has


@pytest.mark.parametrize("tokenizer,fragment", [("/no/such.gguf", "not a file"), (__file__, "neither a .gguf model nor a tokenizer.json")])
def test_a_tokenizer_setting_that_cannot_be_used_fails_at_start_up_and_says_why(tokenizer, fragment):
    from reasonray.gateway.errors import LLMConfigError

    with pytest.raises(LLMConfigError, match=fragment):
        OpenAILLM("smollm2", base_url="http://127.0.0.1:9/v1", tokenizer=tokenizer)
