import pytest

from reasonray.kernel.tags import (
    extract_answer,
    extract_tag,
    normalize_answer,
    strip_thinking,
)


def test_strip_removes_closed_thinking_and_keeps_the_rest():
    assert strip_thinking("<thinking>secret plan</thinking>\n\n<list/>") == "<list/>"


def test_strip_handles_nested_blocks():
    text = "a <thinking>outer <thinking>inner</thinking> still outer</thinking> b"
    assert strip_thinking(text) == "a  b"


def test_strip_drops_an_unclosed_block_to_the_end():
    assert strip_thinking("visible <thinking>never closed, runs on") == "visible"


def test_strip_treats_a_lone_closing_tag_as_end_of_reasoning():
    assert strip_thinking("reasoning without an opening tag</thinking>The answer is 4.") == "The answer is 4."


def test_strip_accepts_think_and_any_case():
    assert strip_thinking("<THINK>x</think>done") == "done"


def test_extract_answer_takes_the_last_answer_outside_thinking():
    text = "<thinking><answer>draft</answer></thinking><answer>1</answer> then <answer> 2 </answer>"
    assert extract_answer(text) == "2"


def test_extract_answer_reads_an_unclosed_answer_to_the_end():
    assert extract_answer("<thinking>t</thinking><answer>42") == "42"


def test_extract_answer_is_none_without_a_tag():
    assert extract_answer("<thinking>t</thinking>just text") is None


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
