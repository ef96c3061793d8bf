"""Reading answers, scores and choices from replies that ignore the requested format, and saying how."""

import pytest

from reasonray.kernel.extraction import (
    final_number,
    find_answer,
    find_choice,
    find_feedback,
    find_score,
    numeric_question,
    parse_json_object,
)


@pytest.mark.parametrize(
    ("text", "numeric", "structured", "answer", "found_by"),
    [
        ("<thinking>x</thinking><answer>391</answer>", False, False, "391", "tag"),
        ("<answer>391</answer> but The answer is: 5", True, True, "391", "tag"),  # the tag wins over prose
        ('{"reasoning": "17*23", "answer": 391}', False, True, "391", "json"),
        ('```json\n{"answer": "Paris"}\n```', False, True, "Paris", "json"),
        ('{"answer": "<answer>7</answer>"}', False, True, "7", "tag"),
        ("The answer is: 76", False, False, "76", "phrase"),
        ("Answer: 76.", False, False, "76", "phrase"),
        ("**Final Answer:** 1,200", False, False, "1,200", "phrase"),
        ("The answer is 391. It was easy.", False, False, "391", "phrase"),
        ("first 5\n#### 76", False, False, "76", "phrase"),
        ("so \\boxed{\\frac{1}{2}}", False, False, "\\frac{1}{2}", "phrase"),
        ("The answer is: 5\nWait, no. The answer is: 6", False, False, "6", "phrase"),  # the last statement wins
        ("17 * 23 = 380\nThe answer is correct.", True, False, "380", "final_number"),  # a verdict is not an answer
        ("17 * 23 = 380\nThe answer is correct.", False, False, "17 * 23 = 380\nThe answer is correct.", "whole_text"),
        ("It costs $1,200.", True, False, "$1,200", "final_number"),
        ('{"answer": 76}', False, False, '{"answer": 76}', "whole_text"),  # JSON only when it was asked for
        ("<thinking>76</thinking> Paris.", True, False, "Paris.", "whole_text"),  # numbers in thinking do not count
    ],
)
def test_answers_are_found_in_order_and_say_how(text, numeric, structured, answer, found_by):
    found = find_answer(text, numeric=numeric, structured=structured)
    assert (found.answer, found.found_by) == (answer, found_by)
    assert found.structured is (found_by in ("tag", "json"))


def test_nothing_visible_is_no_answer_and_fallback_can_be_refused():
    assert find_answer("<thinking>only this</thinking>") is None
    assert find_answer("   ") is None
    assert find_answer("just prose", fallback=False) is None
    assert find_answer("The answer is: 4", fallback=False).found_by == "phrase"


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<score>0.8</score>", 0.8),
        ("<score>8/10</score>", 0.8),
        ("<score>9</score>", 0.9),  # a bare number above 1 where a score was asked for reads as out of 10
        ("<score>85</score>", 0.85),
        ("Score: 8/10", 0.8),
        ("score of 0.7, since step 2 is off", 0.7),
        ("I would rate it 7 out of 10.", 0.7),
        ("Rating: 80%", 0.8),
        ("0.8", 0.8),
        ("80%", 0.8),
        ("3/4.", 0.75),
        ('{"score": 0.4, "feedback": "x"}', 0.4),
        ("<score>1.5/1</score>", None),  # out of range: unscored, not clamped into a verdict
        ("<score>high</score>", None),
        ("The solution is correct. 17*23=391", None),  # numbers that are not a score
        ("The step is fine.", None),
        ("", None),
    ],
)
def test_scores_are_read_in_the_forms_models_give_them_and_otherwise_unscored(text, score):
    assert find_score(text, structured=True) == score


def test_a_score_named_in_json_is_read_whether_or_not_json_was_asked_for():
    assert find_score('{"score": 0.4}') == find_score('{"score": 0.4}', structured=True) == 0.4


@pytest.mark.parametrize(
    ("text", "feedback"),
    [
        ("<score>0.4</score><feedback>fix step 2</feedback>", "fix step 2"),
        ("<score>0.4</score>", ""),
        ("Score: 4/10. Step 2 multiplies wrong.", "Score: 4/10. Step 2 multiplies wrong."),
    ],
)
def test_feedback_is_the_tag_or_the_reviews_text(text, feedback):
    assert find_feedback(text) == feedback


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("<vote>2</vote>", 1),
        ("<vote>Candidate 3</vote>", 2),
        ("I think Candidate 2 is the most promising.", 1),
        ("Candidate 1 is wrong; vote: 3", 2),
        ("3", 2),
        ('{"reasoning": "x", "vote": 1}', 0),
        ("<vote>7</vote>", None),  # out of range
        ("Candidate 9 is best", None),
        ("they are all fine", None),
    ],
)
def test_choices_are_read_in_range_or_not_at_all(text, choice):
    assert find_choice(text, 3, structured=True) == choice


@pytest.mark.parametrize(
    ("query", "numeric"),
    [
        ("What is 17 * 23?", True),
        ("How many apples does Tom have left?", True),
        ("Calculate the total cost.", True),
        ("What is the capital of France?", False),
        ("Summarize this text in 3 points.", False),
    ],
)
def test_a_question_asks_for_a_number_or_not(query, numeric):
    assert numeric_question(query) is numeric


def test_small_readers():
    assert final_number("a 1, then 2,000 and -3.5.") == "-3.5"
    assert final_number("no digits") is None
    assert parse_json_object('Here: {"a": 1} done') == {"a": 1}
    assert parse_json_object("[1, 2]") is None and parse_json_object("not json") is None
