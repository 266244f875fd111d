"""Extraction that needs no luck: ``extract_answer(text, kind)`` and
``same_answer(a, b, kind)`` without the question, on the shapes that used to extract by
chance (a restatement after the answer, options repeated before the choice, a short
answer inside a sentence, a sentence cut off at the token limit, yes/no questions)."""

from __future__ import annotations

import pytest

from ponder.enhance.answers import ANSWER_TYPES, extract_answer, group_answers, same_answer
from ponder.types import TaskType

# --- extraction without the question ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        # a restatement after the answer: the quantity referred back to is not the result
        ("…so 42 remain, out of the 60 we started with", "math", "42"),
        ("She gave 18 away, so 42 are left of the 60 she had.", "math", "42"),
        ("That is 3 more than 5.", "math", "3"),
        ("There are a total of 60 apples.", "math", "60"),  # a result verb still counts
        # a restated question with numbers and no answer
        ("What is 17 * 24? Let's compute 17 * 24.", "math", None),
        # a choice stated after the options were repeated
        ("Options: A) 3 B) 5 C) 7. The right one is C) 7", "choice", "C"),
        ("A) 3 B) 5 C) 7. So B) 5.", "choice", "B"),
        ("The answer is B. A) 3 B) 5 C) 7. So the answer is C.", "choice", "C"),
        ("The answer is B.\nA) 3\nB) 5\nC) 7", "choice", "B"),  # stated before the copy
        ("A) 3 B) 5 C) 7. Let me think.", "choice", None),  # a copy chooses nothing
        # a short answer inside a sentence: "X is Y's Z" gives Z
        ("From the tree, Maria is Paul's aunt.", "text", "aunt"),
        ("Maria is Paul's aunt.", "text", "aunt"),
        ("Based on the story, the tallest mountain is K2.", "text", "K2"),
        # a sentence cut at the token limit is not an answer
        ("To determine if 91", "text", None),
        ("So, Samuel is the son of", "text", None),
        ("Samuel is Luna's son. To find out whether", "text", "son"),
        # a bare answer without a full stop still is one
        ("Paris", "text", "Paris"),
        ("George Washington", "text", "George Washington"),
    ],
)
def test_extraction_without_the_question(text: str, kind: str, expected: str | None) -> None:
    assert extract_answer(text, kind) == expected


def test_the_choice_after_the_copy_may_be_an_options_text() -> None:
    kind = ANSWER_TYPES[TaskType.choice]
    question = kind.question("Which is prime and even?\nA) 3\nB) 2\nC) 9")
    text = "Options: A) 3 B) 2 C) 9. The right one is 2."
    assert extract_answer(text, "choice", question) == "B"


POLAR = "Is 91 a prime number? Answer yes or no."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("No, 91 = 7 * 13.", "No"),
        ("91 = 7 * 13, so no, 91 is not prime.", "No"),
        ("Let me check. 91 = 7 * 13.\nNo.", "No"),
        ("The answer is yes.", "Yes"),
        ("To determine if 91", None),  # cut off before it said
        ("91 is not prime because 7 * 13 = 91.", None),  # a sentence is never the answer
        ("There are no divisors other than 1 and 91.", None),  # "no" inside a phrase
    ],
)
def test_a_yes_no_question_is_answered_yes_or_no(text: str, expected: str | None) -> None:
    kind = ANSWER_TYPES[TaskType.text]
    assert extract_answer(text, "text", kind.question(POLAR)) == expected


def test_a_question_with_alternatives_is_not_yes_no() -> None:
    kind = ANSWER_TYPES[TaskType.text]
    assert extract_answer("It is red.", "text", kind.question("Is it red or blue?")) == "red"
    assert extract_answer("Yes, it is.", "text", kind.question("Is it prime or not?")) == "Yes"


# --- same_answer ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "kind", "expected"),
    [
        # text: equal by containment, in the head or in what "X is Y" states
        ("The tallest mountain is K2", "K2", "text", True),
        ("K2 is the tallest mountain", "K2", "text", True),
        ("Paris, France", "Paris", "text", True),
        # ... but not absurd containment
        ("The tallest mountain is K2", "a", "text", False),  # one letter
        ("The tallest mountain is K2", "the", "text", False),  # a stop word
        ("x is 5", "x", "text", False),
        ("is it", "is", "text", False),
        ("The tallest mountain is K2", "mountain", "text", False),  # not what it states
        ("The tallest mountain is not K2", "K2", "text", False),  # negated
        ("Paris, France", "France", "text", False),
        ("The tallest mountain is K2", "Everest", "text", False),
        # choice: a letter with its option's text
        ("b) 12", "B", "choice", True),
        ("(c) 7", "C", "choice", True),
        ("D. 4", "d", "choice", True),
        ("b) 12", "C", "choice", False),
        # math: LaTeX
        ("\\sqrt{9}", "3", "math", True),
        ("\\frac{1}{2}", "0.5", "math", True),
        ("\\sqrt{9}", "4", "math", False),
    ],
)
def test_same_answer_without_the_question(a: str, b: str, kind: str, expected: bool) -> None:
    assert same_answer(a, b, kind) is expected
    assert same_answer(b, a, kind) is expected


@pytest.mark.parametrize("kind", ["math", "choice", "text", "code"])
def test_no_answer_is_never_the_same(kind: str) -> None:
    assert not same_answer(None, None, kind)
    assert not same_answer("3", None, kind)
    assert not same_answer(None, "3", kind)


def test_same_answer_is_one_group_of_group_answers() -> None:
    pairs = [("The tallest mountain is K2", "K2"), ("a", "a cat"), ("Paris", "London")]
    for a, b in pairs:
        assert same_answer(a, b, "text") is (group_answers([a, b], "text") == [[0, 1]])
