"""Prefix continuation through the raw completions endpoint (`[llm] prefix_continuation = "completions"`): the
continuation is one prompt rendered with the model's own chat template (`[llm] chat_template`), so a server whose
chat endpoint cannot continue a reply (llama.cpp, vLLM and SGLang all serve /v1/completions) still continues the
thinking; the reply is read as thinking still open, and counted as the server counts it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import reasonray.gateway.openai_client as oc
from reasonray.gateway.errors import LLMConfigError
from reasonray.gateway.factory import client_for
from reasonray.gateway.protocol import LLMRequest, Message, user
from reasonray.gateway.tokens import count_messages
from reasonray.kernel.config import Settings
from tests.unit.test_thinking_budget import scripted

TOKENIZER_CONFIG = str(Path(__file__).parents[1] / "real" / "data" / "thinking_tokenizer_config.json")
QUESTION = (Message(role="system", content="Be brief."), user("What is 17 + 23?"))
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 17 + 23?<|im_end|>\n<|im_start|>assistant\n"


def server(*replies: httpx.Response) -> tuple[list[tuple[str, dict]], httpx.MockTransport]:
    """An OpenAI-compatible endpoint answering with `replies` in turn, recording each call's path and body."""
    calls: list[tuple[str, dict]] = []
    script = iter(replies)

    async def respond(request: httpx.Request) -> httpx.Response:
        calls.append((request.url.path, json.loads(request.content)))
        return next(script)

    return calls, httpx.MockTransport(respond)


def completion(text: str, finish: str = "stop", prompt_tokens: int = 30, completion_tokens: int = 12) -> httpx.Response:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return httpx.Response(
        200, json={"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [choice], "usage": usage}
    )


def chat(content: str, finish: str) -> httpx.Response:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
    usage = {"prompt_tokens": 20, "completion_tokens": 40, "total_tokens": 60}
    return httpx.Response(
        200, json={"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": usage}
    )


def thinker(transport: httpx.MockTransport, template: str = TOKENIZER_CONFIG):
    return scripted("my-r1", transport, thinks=True, thinks_in_text=True, prefix_continuation="completions", chat_template=template)


async def test_continued_thinking_is_one_raw_prompt_in_the_models_template_and_the_reply_splits_at_the_closing_tag():
    calls, transport = server(completion(" so 40.\n</think>\n\nThe answer is 40.", completion_tokens=12))
    done = await thinker(transport).complete(LLMRequest(messages=QUESTION, continue_thinking="I add 17 and 23", temperature=0.0))
    path, body = calls[0]
    assert path == "/v1/completions" and "messages" not in body
    # the llama-cpp-python style template opens the turn and the thinking itself: the prefix's <think> is not doubled
    assert body["prompt"] == CHATML + "<think>\nI add 17 and 23"
    assert body["model"] == "my-r1" and body["temperature"] == 0.0
    assert done.thinking_control == "continued" and not done.thinking_unfinished
    assert done.reasoning == "so 40." and done.text == "The answer is 40."
    # the server's counts, the thinking's share of them as on the chat path
    assert done.usage.prompt_tokens == 30 and done.usage.completion_tokens == 12 and 0 < done.usage.reasoning_tokens < 12


async def test_a_continuation_cut_before_its_closing_tag_is_unfinished_thinking_never_an_answer():
    calls, transport = server(completion(" and then 24 more", finish="length", completion_tokens=5))
    done = await thinker(transport).complete(LLMRequest(messages=QUESTION, continue_thinking="I add", max_tokens=5))
    assert calls[0][1]["max_tokens"] == 5
    assert done.thinking_unfinished and done.text == "" and done.reasoning == "and then 24 more"
    assert done.usage.completion_tokens == done.usage.reasoning_tokens == 5


async def test_a_budget_cut_thinking_is_closed_in_the_raw_prompt_and_the_model_answers():
    calls, transport = server(chat("Let me add 17 and 23 step by", "length"), completion("The answer is 40.", completion_tokens=6))
    done = await thinker(transport).complete(LLMRequest(messages=QUESTION, thinking_budget=40, max_tokens=64))
    assert [path for path, _ in calls] == ["/v1/chat/completions", "/v1/completions"]
    assert calls[0][1]["max_tokens"] == 40
    assert calls[1][1]["prompt"] == CHATML + "<think>\nLet me add 17 and 23 step by\n</think>\n\n"
    assert done.thinking_control == "forced" and done.text == "The answer is 40." and done.reasoning == "Let me add 17 and 23 step by"
    # every call's count, the answer's counted as answer
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.reasoning_tokens) == (50, 46, 40)


async def test_a_jinja_file_that_honours_add_generation_prompt_is_rendered_as_transformers_does(tmp_path):
    template = tmp_path / "r1.jinja"
    template.write_text(
        "{{ bos_token }}{% for m in messages %}\n<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}\n"
        "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
    )
    calls, transport = server(completion("done</think>40"))
    done = await thinker(transport, str(template)).complete(LLMRequest(messages=(user("Hi"),), continue_thinking="Hmm"))
    # trim_blocks and lstrip_blocks as transformers sets them; the generation prompt's own <think> not doubled
    assert calls[0][1]["prompt"] == "<|user|>Hi<|assistant|><think>\nHmm"
    assert done.reasoning == "done" and done.text == "40"


async def test_a_continuation_teaches_the_token_count_nothing_its_prompt_also_holds_the_thinking_continued():
    _, transport = server(completion("so 40</think>40", prompt_tokens=3000))
    llm = thinker(transport)
    llm.tokens = oc.ModelTokenCounter(llm.tokens, margin=0.0)  # a count that learns from the usage servers report
    before = count_messages(llm.tokens, QUESTION)
    await llm.complete(LLMRequest(messages=QUESTION, continue_thinking="I add 17 and 23. " * 200))
    assert count_messages(llm.tokens, QUESTION) == before  # 3,000 prompt tokens, most of them the thinking: no framing


def test_completions_continuation_without_a_chat_template_is_refused_at_startup_naming_the_key(monkeypatch):
    with pytest.raises(LLMConfigError, match=r"\[llm\] chat_template"):
        scripted("my-r1", httpx.MockTransport(lambda r: httpx.Response(500)), prefix_continuation="completions")
    llm = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "my-r1", "api_key_required": False}
    with pytest.raises(LLMConfigError, match=r'prefix_continuation = "completions".*\[llm\] chat_template'):
        client_for(Settings.model_validate({"llm": {**llm, "prefix_continuation": "completions"}}))
    # the key reaches the client from the configuration
    assert client_for(Settings.model_validate({"llm": {**llm, "prefix_continuation": "completions", "chat_template": TOKENIZER_CONFIG}}))


async def test_a_template_that_refuses_the_messages_is_a_configuration_error_naming_the_key(tmp_path):
    (tmp_path / "strict.jinja").write_text("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    calls, transport = server()
    with pytest.raises(LLMConfigError, match=r"\[llm\] chat_template = .* roles must alternate"):
        await thinker(transport, str(tmp_path / "strict.jinja")).complete(LLMRequest(messages=(user("Hi"),), continue_thinking="Hmm"))
    assert calls == []  # nothing was sent


def test_a_file_that_holds_no_template_is_refused_naming_the_key(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}")
    for name in ("tokenizer_config.json", "broken.jinja", "missing.jinja"):
        with pytest.raises(LLMConfigError, match=r"\[llm\] chat_template"):
            thinker(httpx.MockTransport(lambda r: httpx.Response(500)), str(tmp_path / name))
