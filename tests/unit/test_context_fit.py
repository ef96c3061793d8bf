"""Prompts that quote earlier replies fit the model's context: the cut, the client learning a context length no
server advertised, and a degenerate attempt never chosen over a stated answer."""

from reasonray.gateway.capabilities import Capabilities, capabilities_of
from reasonray.gateway.factory import build_llm, client_for
from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.gateway.testing import ScriptedLLM
from reasonray.gateway.tokens import count_messages
from reasonray.kernel.config import Settings
from reasonray.strategies.context_fit import ELISION, fitted, shares, shorten
from reasonray.strategies.matts import pick
from tests.unit.strategy_harness import context_for

RAMBLE = " ".join(f"step {i}: carry the {i % 10} and check it again." for i in range(600))


class Windowed(ScriptedLLM):
    def __init__(self, context_length: int | None) -> None:
        super().__init__([])
        self.capabilities = Capabilities(context_length=context_length)


def build(parts: tuple[str, ...]) -> LLMRequest:
    solution, answer = parts
    return LLMRequest(messages=(system("Review it."), user(f"Problem: 17 * 23\n\nAttempt:\n{solution}\nAnswer: {answer}")), max_tokens=300)


def test_a_quoted_attempt_is_cut_to_its_head_and_tail_leaving_the_reply_its_room() -> None:
    context, _ = context_for(Windowed(1024))
    request = fitted(context, build, (RAMBLE, "391"))
    prompt = count_messages(context.tokens, request.messages)
    assert prompt + 300 <= 1024 < count_messages(context.tokens, build((RAMBLE, "391")).messages)
    text = request.messages[1].content
    assert ELISION in text and RAMBLE[:40] in text and RAMBLE[-40:] in text and text.endswith("Answer: 391")


def test_a_prompt_that_fits_or_an_unknown_context_leaves_the_request_as_built() -> None:
    small, _ = context_for(Windowed(1024))
    assert fitted(small, build, ("17 * 23 = 391", "391")) == build(("17 * 23 = 391", "391"))
    unknown, _ = context_for(Windowed(None))
    assert fitted(unknown, build, (RAMBLE, "391")) == build((RAMBLE, "391"))


def test_short_texts_keep_all_they_have_and_long_ones_share_the_rest() -> None:
    assert shares([10, 500, 900], 610) == [10, 300, 300]
    assert shares([10, 20], 100) == [10, 20]
    context, _ = context_for(Windowed(1024))
    assert context.tokens.count(shorten(context.tokens, RAMBLE, 100)) <= 100


async def test_the_client_learns_the_context_a_length_stop_below_max_tokens_reveals() -> None:
    server = SimulatorServer(SimulatorSettings(port=0, disobey_rate=1.0, disobey_kinds=("ramble",))).start()
    try:
        settings = Settings.model_validate({"llm": {"provider": "simulated", "base_url": server.url, "cache": {"enabled": False}}})
        client = client_for(settings, environ={})
        llm, _ = build_llm(settings, client, None)
        assert capabilities_of(llm).context_length is None  # llama-cpp-python's bare model card names none
        completion = await llm.complete(LLMRequest(messages=(user("What is 17 * 23?"),), max_tokens=8000))
        assert completion.finish_reason == "length" and completion.usage.completion_tokens < 8000
        assert capabilities_of(llm).context_length == server.settings.resolved_context_length == 4096
        await client.close()
    finally:
        server.stop()


def test_an_attempt_that_stated_no_answer_is_not_chosen_over_one_that_did() -> None:
    ramble = {"answer": "17", "text": RAMBLE, "found_by": "final_number", "degenerate": True}
    stated = {"answer": "391", "text": "17 * 23 = 391", "found_by": "phrase", "degenerate": False}
    assert pick([ramble, stated, ramble], [0.3, None, None]) == 1
    assert pick([ramble, dict(ramble, answer="23")], [0.3, None]) == 0  # all degenerate: the scored one
