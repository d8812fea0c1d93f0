"""The description judge: a 1–5 Likert rating of a predicted description against the gold one.

The judge is any policy (`policy.complete`): a local model, or an OpenAI-compatible
endpoint. Ratings are parsed from `Rating: X`; an answer without a parseable rating
gives `score=None`, which is counted and reported by the metrics, never replaced by a
default. Each request carries the answer shape `RATING` (`env.answer_shape.AnswerShape`): a
local judge whose sampling has `structured` other than 'off' writes its reasoning and
then always ends with a `Rating: 1..5` line within its token budget (the mask of
`sampling.input_grammar.rating_grammar`), so every rating parses; with 'off' (the
paper's judge) and for an endpoint nothing is masked.
"""

import dataclasses
import re
from collections.abc import Sequence

from pau_jax.env.answer_shape import AnswerShape
from pau_jax.env.text_blocks import strip_think

JUDGE_PROMPT_VERSION = "judge-v1"

_INSTRUCTIONS = """\
You compare a hypothesised description of a Python function with its true description.
Rate how accurately the hypothesis describes what the function does, from 1 to 5:
1 = wrong or unrelated; 2 = mostly wrong, a small part right; 3 = the main behaviour right,
important details wrong or missing; 4 = right apart from minor details or edge cases;
5 = fully right, including edge cases.
Give a one-sentence explanation, then the rating as "Rating: X".

Example 1
True description: Returns True if two distinct elements of the list sum to zero, else False.
Hypothesis: Checks whether some pair of numbers in the list adds up to zero.
Explanation: The hypothesis states the same behaviour.
Rating: 5

Example 2
True description: Returns the n-th Fibonacci number.
Hypothesis: Computes the factorial of n.
Explanation: Factorial and Fibonacci are different functions.
Rating: 1

Example 3
True description: Returns the words of the sentence whose length is a prime number, in order.
Hypothesis: Returns the words with an odd number of letters.
Explanation: It filters words by length, but by the wrong property.
Rating: 2
"""

_RATING = re.compile(r"rating\s*[:=]\s*\**\s*([1-5])\b", re.I)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JudgeResult:
    """A judge's answer: the parsed score (None when unparseable) and the raw text."""

    score: int | None
    raw: str


def judge_messages(gold: str, predicted: str) -> list[dict]:
    user = (
        f"{_INSTRUCTIONS}\nNow rate this one.\nTrue description: {gold}\n"
        f"Hypothesis: {predicted or '(no description given)'}\nExplanation:"
    )
    return [{"role": "user", "content": user}]


def parse_rating(text: str) -> int | None:
    """The last `Rating: X` (X in 1..5) in the answer, or None."""
    matches = _RATING.findall(strip_think(text))
    return int(matches[-1]) if matches else None


# What a judge's reply must end with (masked only by a local judge with structured decoding).
RATING = AnswerShape("rating")


def judge(policy, pairs: Sequence[tuple[str, str]]) -> list[JudgeResult]:
    """Rates each (gold, predicted) pair in one batched policy call."""
    conversations = [judge_messages(gold, predicted) for gold, predicted in pairs]
    replies = policy.complete(conversations, answers=[RATING] * len(conversations))
    texts = [r if isinstance(r, str) else r.text for r in replies]
    return [JudgeResult(score=parse_rating(t), raw=t) for t in texts]
