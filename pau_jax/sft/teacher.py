"""A teacher that knows the answer (CodeARC-SFT): the wrapped policy sees the gold description.

``PrivilegedTeacher(policy, specs, references)`` is itself a policy. For each
conversation it finds the task by the header and shown examples that the PAU
prompts print (rendered with ``env.prompts`` itself, so the match follows the
prompt format), appends the task's gold description (and, optionally, its
source) to the system message of a copy of the conversation, and asks the
wrapped policy. The conversation it was given is left untouched, so the episode
runner records the agent's unprivileged prompts next to the teacher's outputs:
exactly the (prompt, completion) pairs that SFT on the teacher's trajectories needs.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pau_jax.env import prompts
from pau_jax.tasks.reference import TaskReference

PRIVILEGED_HEADER = (
    "Privileged information about the function (the learner you are demonstrating for "
    "will not see it). Use it to choose the most informative inputs and to state the "
    "behaviour precisely, but justify every step only by the calls and results shown; "
    "never mention this information."
)


@dataclasses.dataclass(frozen=True)
class _Answer:
    description: str
    code: str


def task_text(header: str, examples: Sequence[prompts.Observation]) -> str:
    """The span of a PAU prompt from the header to the last shown example, as rendered."""
    view = prompts.EpisodeView(header=header, examples=tuple(examples))
    content = prompts.conceptualize_messages(view)[-1]["content"]
    start = content.index(header)
    end = start + len(header)
    for example in examples:
        end = content.index(example.call, end) + len(example.call)
        end = content.index(example.result, end) + len(example.result)
    return content[start:end]


class PrivilegedTeacher:
    """A policy that forwards conversations with the task's gold answer added.

    A ``Policy`` itself (``complete`` and ``__call__``), over the wrapped one.

    Attributes:
      policy: the wrapped ``pau_jax.policy.Policy``.
      show_code: whether the source is added besides the description.
      sent: the conversations last sent to the wrapped policy (for inspection).
    """

    def __init__(
        self,
        policy,
        specs: Sequence,
        references: Mapping[str, TaskReference],
        *,
        show_code: bool = False,
    ):
        """Indexes the tasks' answers by their rendered header and shown examples.

        Args:
          policy: the wrapped policy.
          specs: the episodes it will be asked about (``runner.EpisodeSpec``).
          references: task id -> ``TaskReference`` (its ``description``, and ``code``
            or else the spec's code).

        Raises:
          ValueError: no specs, a task without a reference, or two tasks with the same
            header and examples but different answers.
        """
        if not specs:
            raise ValueError("PrivilegedTeacher needs at least one task")
        self.policy = policy
        self.show_code = show_code
        self.sent: list[list[dict]] = []
        self._by_text: dict[str, _Answer] = {}
        for spec in specs:
            task = spec.task
            if task.task_id not in references:
                raise ValueError(f"task {task.task_id!r} has no reference (gold description)")
            ref = references[task.task_id]
            answer = _Answer(ref.description, ref.code or spec.code)
            key = task_text(task.header, task.examples)
            other = self._by_text.get(key)
            if other is not None and other != answer:
                raise ValueError(
                    f"two tasks share header and examples but differ in their answer: "
                    f"{task.header!r}"
                )
            self._by_text[key] = answer

    def reference_for(self, conversation: Sequence[dict]) -> _Answer:
        """The answer of the task whose header and examples the conversation shows.

        Raises:
          ValueError: none matches, or several different tasks do.
        """
        text = "\n".join(str(m.get("content", "")) for m in conversation)
        found = [key for key in self._by_text if key in text]
        # A key inside another matched key (e.g. a result that is a prefix of another) loses.
        found = [k for k in found if not any(k != other and k in other for other in found)]
        if not found:
            raise ValueError(
                "no reference matches the conversation's header and shown examples; "
                "pass the spec and reference of every task the runner is given"
            )
        answers = {self._by_text[k] for k in found}
        if len(answers) > 1:
            raise ValueError(f"the conversation matches {len(found)} different references")
        return self._by_text[found[0]]

    def privileged(self, conversation: Sequence[dict]) -> list[dict]:
        """A copy of the conversation with the answer appended to its system message."""
        ref = self.reference_for(conversation)
        note = f"{PRIVILEGED_HEADER}\n\nWhat the function does: {ref.description}"
        if self.show_code and ref.code:
            note += f"\n\nIts source code:\n```python\n{ref.code.rstrip()}\n```"
        messages = [dict(m) for m in conversation]
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{note}"
        else:
            messages.insert(0, {"role": "system", "content": note})
        return messages

    def complete(
        self,
        conversations: Sequence[Sequence[dict]],
        *,
        answers: Sequence | None = None,
        stop: Sequence[Sequence[str]] | None = None,
    ) -> list[Any]:
        """The wrapped policy's replies to the privileged copies of the conversations."""
        self.sent = [self.privileged(c) for c in conversations]
        return self.policy.complete(self.sent, answers=answers, stop=stop)

    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """The wrapped policy's reply texts to the privileged copies of the conversations."""
        self.sent = [self.privileged(c) for c in conversations]
        return self.policy(self.sent)
