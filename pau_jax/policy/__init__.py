"""Policy backends: anything that turns a batch of chat conversations into replies.

The seam is `Policy`: `policy.complete(conversations, answers=, stop=) -> replies`,
one reply per conversation, in order (what the episode runner calls), and
`policy(conversations) -> texts`. Backends: `local.LocalPolicy` (the JAX sampler over
a local checkpoint, optionally with LoRA), `http.HTTPPolicy` (any OpenAI-compatible
endpoint) and `scripted` (an oracle that reads the source, a random prober and a
scripted coder, for tests and baselines). `server.PolicyServer` serves any policy
over OpenAI-compatible HTTP. `backends` builds the policy of a seat (agent, judge,
coder, teacher) from its gin-chosen `*BackendConfig`.
"""

from collections.abc import Sequence
from typing import Any, Protocol


class Policy(Protocol):
    def complete(
        self,
        conversations: Sequence[Sequence[dict]],
        *,
        answers: Sequence | None = None,
        stop: Sequence[Sequence[str]] | None = None,
    ) -> list[Any]:
        """One reply per conversation (a list of {"role", "content"} messages), in order.

        A reply is a text, or an object with a `.text` (e.g. `local.Completion`, with
        its finish reason, token ids and log-probs).

        Args:
          conversations: the chat conversations.
          answers: one `env.answer_shape.AnswerShape` (or None) per conversation: what its
            reply must hold (structured decoding). A policy that cannot constrain its
            replies (an endpoint, a scripted policy) ignores them.
          stop: per conversation, strings that end its reply: the reply is cut before
            the first of them.
        """
        ...

    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """The reply texts of `complete(conversations)`."""
        ...


def check_per_row(conversations: Sequence, **per_row: Sequence | None) -> None:
    """Raises a one-line ValueError unless each given per-row argument has one entry per conversation."""
    for name, values in per_row.items():
        if values is not None and len(values) != len(conversations):
            raise ValueError(
                f"{name} has {len(values)} entries for {len(conversations)} conversations; "
                "pass one per conversation"
            )
