"""One place turns every reply form into the same Choice and Usage (reasonray/gateway/replies.py), and the
scripted doubles hand out thinking replies in that same shape."""

from __future__ import annotations

import asyncio

from reasonray.gateway.protocol import LLMRequest, user
from reasonray.gateway.testing import ScriptedLLM, Thinking

REQUEST = LLMRequest(messages=(user("What is 2 + 2?"),))


def test_scripted_thinking_replies_carry_reasoning_counts_and_unfinished_thinking() -> None:
    llm = ScriptedLLM(
        [
            Thinking("Two and two make four.", "4"),
            Thinking("Okay, the answer is 340 so far", "340 so far", unfinished=True),
            Thinking("", "4", reasoning_tokens=2000),
        ]
    )

    async def run() -> list:
        return [await llm.complete(REQUEST) for _ in range(3)]

    done, cut, hidden = asyncio.run(run())
    llm.assert_complete()
    assert (done.text, done.reasoning, done.thinking_unfinished) == ("4", "Two and two make four.", False)
    assert 0 < done.usage.reasoning_tokens < done.usage.completion_tokens
    assert (cut.text, cut.finish_reason, cut.thinking_unfinished) == ("", "length", True)
    assert cut.reasoning.endswith("so far") and cut.usage.completion_tokens == cut.usage.reasoning_tokens
    assert (hidden.text, hidden.reasoning, hidden.usage.reasoning_tokens) == ("4", "", 2000)
    assert hidden.usage.completion_tokens > 2000


# -- every server form read into one Choice and Usage, plain and streamed ---------------------------------------------

import pytest  # noqa: E402

import reasonray.gateway.openai_client as oc  # noqa: E402
from reasonray.gateway.errors import ProviderRejectedError, TransientProviderError  # noqa: E402
from reasonray.gateway.model_tokens import ModelTokenCounter  # noqa: E402
from reasonray.gateway.replies import StreamParts, split_thinking  # noqa: E402
from reasonray.kernel.tags import extract_answer  # noqa: E402
from tests.unit.fixed_endpoint import fixed_endpoint  # noqa: E402

THOUGHT = "Two and two make four; let me check it once more by counting on my fingers."


@pytest.fixture
def endpoint():
    """An endpoint answering what the test sets; a streamed model's first calls (learning its chat template's framing)
    get a plain one-token reply."""
    with fixed_endpoint(default=plain({"content": "ok"}, usage=usage(1))) as served:
        yield served


def plain(message: dict, finish="stop", usage=None, logprobs=None) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}


def streamed(deltas: list[dict], finish="stop", usage=None) -> list[dict]:
    def chunk(delta, finish_reason=None):
        return {
            "id": "x",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    events = [chunk({"role": "assistant", "content": ""}), *(chunk(d) for d in deltas), chunk({}, finish)]
    if usage is not None:
        events.append({"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage})
    return events


def usage(completion, reasoning=None, prompt=10):
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


def pieces(text: str, size: int = 9) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


FORMS = {
    # vLLM / SGLang with a reasoning parser, DeepSeek: the thinking in its own field, counted by the server
    "reasoning_content": (
        plain({"content": "4", "reasoning_content": THOUGHT}, usage=usage(20, 19)),
        streamed([{"reasoning_content": p} for p in pieces(THOUGHT)] + [{"content": "4"}], usage=usage(20, 19)),
    ),
    # newer vLLM and OpenRouter name the field `reasoning`
    "reasoning": (
        plain({"content": "4", "reasoning": THOUGHT}, usage=usage(20, 19)),
        streamed([{"reasoning": p} for p in pieces(THOUGHT)] + [{"content": "4"}], usage=usage(20, 19)),
    ),
    # no parser, an R1 template: the thinking as text, closed by `</think>` only
    "r1_text": (
        plain({"content": THOUGHT + "\n</think>\n\n4"}, usage=usage(24, 19)),
        streamed([{"content": p} for p in pieces(THOUGHT + "\n</think>\n\n4")], usage=usage(24, 19)),
    ),
    # OpenAI's reasoning models: the thinking out of sight, only counted
    "hidden": (
        plain({"content": "4"}, usage=usage(2001, 2000)),
        streamed([{"content": "4"}], usage=usage(2001, 2000)),
    ),
}


def llm(url: str, *, stream: bool, model: str = "m") -> oc.OpenAILLM:
    return oc.OpenAILLM(model, base_url=url, api_key="x", discover=False, stream=stream)


ASK = LLMRequest(messages=(user("What is 2 + 2?"),))


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_each_form_reads_into_the_same_answer_thinking_and_counts_plain_and_streamed(endpoint, form):
    answer, url = endpoint
    answer["json"], answer["events"] = FORMS[form]
    got = [await llm(url, stream=stream).complete(ASK) for stream in (False, True)]
    for completion in got:
        assert completion.text == "4" and not completion.thinking_unfinished
        assert completion.reasoning == ("" if form == "hidden" else THOUGHT)
        assert completion.usage.reasoning_tokens == (2000 if form == "hidden" else 19)
    assert got[0].choices == got[1].choices and got[0].usage == got[1].usage


async def test_thinking_the_server_did_not_count_is_counted_with_the_models_tokens(endpoint):
    answer, url = endpoint
    answer["json"] = plain({"content": "4", "reasoning_content": THOUGHT}, usage=usage(25))
    model = llm(url, stream=False)
    thought, answer_tokens = model.tokens.count(THOUGHT), model.tokens.count("4")
    completion = await model.complete(ASK)
    # the thinking's share of the server's total, by the model's count
    assert completion.usage.reasoning_tokens == round(25 * thought / (thought + answer_tokens)) < 25


CUT = "Okay, so I add the two numbers: 2 and 2... the answer is 340 so far"


@pytest.mark.parametrize(
    "body,events,model",
    [
        # the budget ran out while thinking: the parser gives `content: null`
        (
            plain({"content": None, "reasoning_content": CUT}, "length"),
            streamed([{"reasoning_content": p} for p in pieces(CUT)], "length"),
            "m",
        ),
        # raw text with an opening tag and no closing one
        (plain({"content": "<think>" + CUT}, "length"), streamed([{"content": p} for p in pieces("<think>" + CUT)], "length"), "m"),
        # an R1 template opened the thinking in the prompt: no tag at all, cut by length, from a model known to think
        (plain({"content": CUT}, "length"), streamed([{"content": p} for p in pieces(CUT)], "length"), "DeepSeek-R1-Distill-Qwen-7B"),
    ],
    ids=["field", "open_tag", "r1_no_tag"],
)
async def test_a_reply_cut_inside_its_thinking_has_no_answer(endpoint, body, events, model):
    answer, url = endpoint
    answer["json"], answer["events"] = body, events
    for stream in (False, True):
        completion = await llm(url, stream=stream, model=model).complete(ASK)
        assert completion.text == "" and completion.thinking_unfinished and completion.finish_reason == "length"
        assert completion.reasoning.endswith("340 so far")


async def test_a_model_seen_thinking_in_its_text_has_a_later_untagged_cut_reply_read_as_unfinished_thinking(endpoint):
    answer, url = endpoint
    model = llm(url, stream=False)  # a name that says nothing
    answer["json"] = plain({"content": CUT}, "length")
    assert (await model.complete(ASK)).text == CUT  # a model not known to think: its text is its text
    answer["json"] = plain({"content": THOUGHT + "</think>4"})
    assert (await model.complete(ASK)).reasoning == THOUGHT
    answer["json"] = plain({"content": CUT}, "length")
    cut = await model.complete(ASK)
    assert cut.text == "" and cut.thinking_unfinished and cut.reasoning == CUT
    # a model that opens its thinking itself (hybrid Qwen3) teaches nothing of the kind: its untagged text is its answer
    hybrid = llm(url, stream=False)
    answer["json"] = plain({"content": "<think>" + THOUGHT + "</think>4"})
    assert (await hybrid.complete(ASK)).reasoning == THOUGHT
    answer["json"] = plain({"content": CUT}, "length")
    assert (await hybrid.complete(ASK)).text == CUT


def test_the_thinking_tag_reasonray_prompts_for_stays_in_the_text_of_a_model_not_known_to_think():
    prompted = "<thinking>2 + 2 = 4.</thinking>\n<answer>4</answer>"
    assert split_thinking(prompted, "stop", thinks=False) == (prompted, "", False, 0)
    assert extract_answer(prompted) == "4"
    # a model that thinks natively in `<thinking>`: its thinking is taken out, the answer format stays
    text, thought, unfinished, _ = split_thinking(prompted, "stop", thinks=True)
    assert (text, thought, unfinished) == ("<answer>4</answer>", "2 + 2 = 4.", False)
    # `<think>` is always a model's own, with its answer after it; R1's closing tag alone ends the thinking
    assert split_thinking("<think>hm</think>\n<answer>4</answer>", "stop", thinks=False)[:3] == ("<answer>4</answer>", "hm", False)
    assert split_thinking("hm</think><answer>4</answer>", "stop", thinks=False)[:3] == ("<answer>4</answer>", "hm", False)
    assert split_thinking("I think it is 4", "length", thinks=False) == ("I think it is 4", "", False, 0)


async def test_log_probabilities_are_the_answers_tokens(endpoint):
    answer, url = endpoint
    tokens = [{"token": t, "logprob": -0.5, "top_logprobs": [{"token": t, "logprob": -0.5}]} for t in ("hm", "</think>")]
    tokens += [{"token": "4", "logprob": -0.1, "top_logprobs": [{"token": "4", "logprob": -0.1}, {"token": "5", "logprob": -2.5}]}]
    answer["json"] = plain({"content": "hm</think>4"}, logprobs=tokens)
    completion = await llm(url, stream=False).complete(ASK)
    choice = completion.choices[0]
    assert (choice.text, choice.reasoning, choice.token_logprobs, choice.top_logprobs) == ("4", "hm", (-0.1,), ((-0.1, -2.5),))


async def test_streamed_log_probabilities_leave_the_thinking_deltas_out(endpoint):
    answer, url = endpoint

    def chunk(delta, logprob):
        token = {"token": "t", "logprob": logprob, "top_logprobs": [{"token": "t", "logprob": logprob}]}
        choice = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": {"content": [token]}}
        return {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}

    events = streamed([])
    answer["events"] = [events[0], chunk({"reasoning_content": "hm"}, -0.5), chunk({"content": "4"}, -0.1), events[-1]]
    completion = await llm(url, stream=True).complete(ASK)
    choice = completion.choices[0]
    assert (choice.text, choice.reasoning, choice.token_logprobs, choice.top_logprobs) == ("4", "hm", (-0.1,), ((-0.1,),))


async def test_hidden_thinking_never_teaches_the_token_estimate_its_ratio(endpoint):
    """One reply of 50 answer tokens after 2,000 hidden ones: the estimate of every later prompt stays as it was."""
    answer, url = endpoint
    model = llm(url, stream=False)
    assert isinstance(model.tokens, ModelTokenCounter) and not model.tokens.exact
    text = " ".join(f"word{i}" for i in range(40))
    before = model.tokens.count(text)
    shown = model.tokens.base.count(text)
    answer["json"] = plain({"content": text}, usage=usage(shown + 2000, 2000))
    await model.complete(ASK)
    assert model.tokens.count(text) <= before * 1.2
    # a proxy that drops `reasoning_tokens` but still counts the hidden thinking: implausible, so not learnt either
    answer["json"] = plain({"content": text}, usage=usage(shown + 2000))
    await model.complete(ASK)
    assert model.tokens.count(text) <= before * 1.2


# -- a provider's error inside a 200 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error,kind",
    [
        ({"message": "Overloaded", "type": "overloaded_error"}, TransientProviderError),
        ({"message": "Rate limit reached for requests", "code": 429}, TransientProviderError),
        ({"message": "Upstream answered badly", "code": "503"}, TransientProviderError),
        ({"message": "Upstream failed", "type": "server_error", "status": 502}, TransientProviderError),
        ({"message": "This model does not exist", "type": "invalid_request_error"}, ProviderRejectedError),
    ],
)
async def test_a_200_with_an_error_body_is_classified_in_the_providers_words(endpoint, error, kind):
    answer, url = endpoint
    answer["json"] = {"error": error}
    with pytest.raises(kind) as raised:
        await llm(url, stream=False).complete(ASK)
    assert error["message"] in str(raised.value) and url in str(raised.value)
    assert "not a chat completion" not in str(raised.value)


async def test_a_stream_that_sends_an_error_midway_is_classified_for_the_retry_policy(endpoint):
    answer, url = endpoint
    answer["events"] = [*streamed([{"content": "partial "}])[:2], {"error": {"message": "Overloaded", "type": "overloaded_error"}}]
    with pytest.raises(TransientProviderError, match="Overloaded"):
        await llm(url, stream=True).complete(ASK)
    answer["events"] = [*streamed([{"content": "partial "}])[:2], {"error": {"message": "content policy", "type": "invalid_request_error"}}]
    with pytest.raises(ProviderRejectedError, match="content policy"):
        await llm(url, stream=True).complete(ASK)


async def test_a_200_with_no_choice_is_a_classified_rejection_naming_the_endpoint(endpoint):
    answer, url = endpoint
    answer["json"] = {"id": "x", "object": "chat.completion", "model": "m", "choices": [], "usage": usage(0)}
    with pytest.raises(ProviderRejectedError, match="no choice") as raised:
        await llm(url, stream=False).complete(ASK)
    assert url in str(raised.value)
    answer["json"] = {"detail": "Not Found"}  # another JSON answer altogether: the base URL is the likely cause
    with pytest.raises(ProviderRejectedError, match=r"not a chat completion.*base_url"):
        await llm(url, stream=False).complete(ASK)


# -- counts include the thinking ---------------------------------------------------------------------------------------


async def test_a_runs_tally_and_completion_budget_count_hidden_thinking():
    from reasonray.gateway.observed import ObservedLLM
    from reasonray.kernel.errors import BudgetExceededError
    from reasonray.kernel.events import Budget, EventRecorder

    scripted = ScriptedLLM([Thinking("", "4", reasoning_tokens=2000)])
    observed = ObservedLLM(scripted, EventRecorder(), trace_id="t", strategy="s", budget=Budget(max_completion_tokens=2000))
    await observed.complete(REQUEST)
    assert observed.tally.reasoning_tokens == 2000 and observed.tally.completion_tokens > 2000
    with pytest.raises(BudgetExceededError, match="reasoning included"):  # the thinking spent the budget
        await observed.complete(REQUEST)


def test_a_failed_streams_cost_includes_the_thinking_it_streamed():
    from openai.types.chat import ChatCompletionChunk

    model = llm("http://127.0.0.1:9/v1", stream=True)
    parts = StreamParts()
    for delta in ({"role": "assistant", "content": ""}, {"reasoning_content": THOUGHT}, {"reasoning_content": THOUGHT}):
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [{"index": 0, "delta": delta}]}
        parts.add(ChatCompletionChunk.model_validate(chunk))
    error = parts.spent_on(TransientProviderError("timed out"), model.tokens, REQUEST)
    assert error.spent[1] == model.tokens.count(THOUGHT) * 2


def test_llm_thinks_in_text_reads_an_unnamed_models_cut_reply_as_unfinished_thinking():
    """`[llm] thinks_in_text`: a model whose template opens the thinking block, under a name nothing recognises, has a
    reply cut by max_tokens read as unfinished thinking (never an answer), from its first call on."""
    from reasonray.gateway.factory import client_for
    from reasonray.kernel.config import Settings

    def client(**llm):
        base = {"provider": "openai", "model": "smollm2-think", "base_url": "http://127.0.0.1:9/v1", "api_key_required": False}
        return client_for(Settings.model_validate({"llm": {**base, **llm}}))

    assert not client().replies.thinks_in_text  # a name that says nothing: plain text until a reply shows otherwise
    reader = client(thinks_in_text=True).replies
    assert reader.thinks_in_text
    assert split_thinking("7 plus 5 is, counting up", "length", thinks=reader.thinks_in_text) == ("", "7 plus 5 is, counting up", True, 24)
