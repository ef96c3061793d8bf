import pytest

from reasonray.kernel.tags import (
    extract_answer,
    extract_tag,
    normalize_answer,
    strip_thinking,
)


@pytest.mark.parametrize(
    ("text", "visible"),
    [
        pytest.param("<thinking>secret plan</thinking>\n\n<list/>", "<list/>", id="removes_closed_thinking_and_keeps_the_rest"),
        pytest.param("a <thinking>outer <thinking>inner</thinking> still outer</thinking> b", "a  b", id="handles_nested_blocks"),
        pytest.param("visible <thinking>never closed, runs on", "visible", id="drops_an_unclosed_block_to_the_end"),
        pytest.param(
            "reasoning without an opening tag</thinking>The answer is 4.",
            "The answer is 4.",
            id="treats_a_lone_closing_tag_as_end_of_reasoning",
        ),
        pytest.param("<THINK>x</think>done", "done", id="accepts_think_and_any_case"),
    ],
)
def test_strip_thinking(text, visible):
    assert strip_thinking(text) == visible


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        pytest.param(
            "<thinking><answer>draft</answer></thinking><answer>1</answer> then <answer> 2 </answer>",
            "2",
            id="takes_the_last_answer_outside_thinking",
        ),
        pytest.param("<thinking>t</thinking><answer>42", "42", id="reads_an_unclosed_answer_to_the_end"),
        pytest.param("<thinking>t</thinking>just text", None, id="is_none_without_a_tag"),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    ("a", "b"),
    [("  $1,200.00. ", "1200"), ("The Answer", "the  answer"), ("12.50", "12.5"), ("\\boxed{42}", "42"), ("50%", "50"), ("-3", "-3.0")],
)
def test_normalised_answers_compare_equal(a, b):
    assert normalize_answer(a) == normalize_answer(b)


def test_normalisation_keeps_different_answers_apart():
    assert normalize_answer("1,2") != normalize_answer("12")
    assert normalize_answer("12") != normalize_answer("12.5")


def test_extract_tag_ignores_tags_inside_thinking():
    assert extract_tag("<thinking><score>0.1</score></thinking><score>0.83</score>", "score") == "0.83"
    assert extract_tag("no tag", "vote") is None
