import json

import structlog
import tiktoken

from reasonray.gateway import tokens
from reasonray.gateway.protocol import Message, ToolCall
from reasonray.gateway.tokens import EstimateCounter, count_messages, counter_for_model


def test_counts_with_tiktoken_offline():
    counter = counter_for_model("gpt-4.1")
    assert counter.encoding_name == "o200k_base"
    assert counter.count("hello world") == len(tiktoken.get_encoding("o200k_base").encode("hello world"))


def test_unknown_model_names_use_cl100k():
    assert counter_for_model("simulated").encoding_name == "cl100k_base"


def test_head_and_tail_cut_by_tokens():
    counter = counter_for_model("simulated")
    text = " ".join(f"word{i}" for i in range(200))
    assert counter.count(counter.head(text, 10)) == 10
    tail = counter.tail(text, 10)
    assert counter.count(tail) == 10 and text.endswith(tail)
    assert counter.tail("short", 100) == "short"


def test_falls_back_to_the_estimate_with_one_warning(monkeypatch):
    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    tokens._load.cache_clear()
    try:
        with structlog.testing.capture_logs() as logs:
            first = counter_for_model("simulated")
            second = counter_for_model("simulated")
        assert isinstance(first, EstimateCounter) and second is first
        warnings = [e for e in logs if e["event"] == "tokenizer.fallback_estimate"]
        assert len(warnings) == 1 and "TIKTOKEN_CACHE_DIR" in warnings[0]["hint"]
        assert first.count("a" * 10) == 3  # ceil(10 / 4)
        assert first.tail("abcdefgh", 1) == "efgh"
    finally:
        tokens._load.cache_clear()


def test_message_count_follows_the_chat_format():
    counter = counter_for_model("simulated")
    messages = [
        Message(role="system", content="be brief"),
        Message(role="assistant", tool_calls=(ToolCall(id="c1", name="calc", arguments='{"x": 1}'),)),
    ]
    expected = 3 + (3 + counter.count("system") + counter.count("be brief"))
    expected += 3 + counter.count("assistant") + counter.count("calc") + counter.count('{"x": 1}')
    assert count_messages(counter, messages) == expected


def test_cuts_to_nothing_at_zero_or_fewer_tokens_and_keep_short_texts_whole():
    text = " ".join(f"word{i}" for i in range(50))
    for counter in (counter_for_model("simulated"), EstimateCounter()):
        for n in (0, -3):
            assert counter.head(text, n) == "" and counter.tail(text, n) == "", (counter, n)
        assert counter.head("short", 100) == "short" and counter.tail("short", 100) == "short"
        assert counter.head(text, 1) and text.startswith(counter.head(text, 1)) and counter.count(counter.head(text, 1)) == 1


def test_the_estimate_is_four_characters_a_token_rounded_up():
    estimate = EstimateCounter()
    assert estimate.encoding_name == "estimate"
    assert [estimate.count("a" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert estimate.head("abcdefghij", 2) == "abcdefgh"
    assert estimate.tail("abcdefghij", 2) == "cdefghij"
    assert estimate.tail("abcdefgh", 2) == "abcdefgh"


def test_a_name_costs_one_token_more_and_an_empty_request_only_the_priming():
    counter = counter_for_model("simulated")
    assert count_messages(counter, []) == 3
    named = [Message(role="user", content="hi", name="alice")]
    assert count_messages(counter, named) == 3 + 3 + counter.count("user") + counter.count("hi") + 1 + counter.count("alice")
    assert count_messages(counter, [Message(role="user", content="")]) == 3 + 3 + counter.count("user")


class TemplateSource:
    """A tokenizer that can also count a whole chat as a server renders it (as `GGUFVocab` does with the
    model's template): one token per character, and a template of `<role>content` per message, "<go>" after."""

    name = "template"

    def __init__(self, renders: bool = True) -> None:
        self.renders = self.renders_chat = renders
        self.rendered: list[tuple[list[dict], list[dict]]] = []

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))

    def count_chat(self, messages: list[dict], tools: list[dict] | None = None) -> int | None:
        if not self.renders:
            return None
        self.rendered.append((messages, tools or []))
        return sum(len(f"<{m['role']}>{m['content']}") for m in messages) + len("<go>")


def test_a_source_that_renders_the_chat_template_counts_the_prompt_exactly():
    from reasonray.gateway.model_tokens import ModelTokenCounter

    source = TemplateSource()
    counter = ModelTokenCounter(counter_for_model("gpt-4o"), source=source)
    call = ToolCall(id="c1", name="calc", arguments="{}")
    chat = (Message(role="user", content="Hi"), Message(role="assistant", content=None, tool_calls=(call,)))
    tool = {"type": "function", "function": {"name": "calc"}}
    assert count_messages(counter, chat, [tool]) == len("<user>Hi") + len("<assistant>") + len("<go>")
    # the template sees the request as it is sent: tool-call turns with "" for text, and the tools
    messages, tools = source.rendered[-1]
    assert messages[1]["content"] == "" and messages[1]["tool_calls"][0]["function"]["name"] == "calc" and tools == [tool]
    # reported usage has nothing to teach an exact count: the next count is the same
    counter.observe_usage(chat, 999)
    assert count_messages(counter, chat, [tool]) == len("<user>Hi") + len("<assistant>") + len("<go>")


def test_a_prompt_counted_twice_is_rendered_once_and_another_prompt_is_rendered_anew():
    from reasonray.gateway.model_tokens import ModelTokenCounter

    source = TemplateSource()
    counter = ModelTokenCounter(counter_for_model("gpt-4o"), source=source)
    chat = (Message(role="user", content="Hi"),)
    tool = {"type": "function", "function": {"name": "calc"}}
    # a streamed call counts its prompt for its `max_tokens` and again for its usage
    first, again = count_messages(counter, chat, [tool]), count_messages(counter, chat, [tool])
    assert first == again == len("<user>Hi<go>") and len(source.rendered) == 1
    assert count_messages(counter, chat) == first and len(source.rendered) == 2  # other tools: another prompt
    assert count_messages(counter, (Message(role="user", content="Hey"),)) == first + 1 and len(source.rendered) == 3
    other = TemplateSource()
    counter.use(other)  # another model: nothing counted with the old one is reused
    assert count_messages(counter, chat, [tool]) == first and len(other.rendered) == 1


def test_without_a_template_the_count_is_the_chat_format_plus_the_learned_framing_and_the_tools():
    from reasonray.gateway.model_tokens import ModelTokenCounter

    counter = ModelTokenCounter(counter_for_model("gpt-4o"), source=TemplateSource(renders=False))
    chat = (Message(role="user", content="Hi"),)
    plain = count_messages(counter, chat)
    counter.observe_usage(chat, plain + 7)  # the server's template added 7 tokens beyond the chat format's framing
    assert count_messages(counter, chat) == plain + 7
    tool = {"type": "function", "function": {"name": "calc"}}
    assert count_messages(counter, chat, [tool]) == plain + 7 + counter.count(json.dumps([tool]))
