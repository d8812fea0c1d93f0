"""Policy backends: anything that turns a batch of chat conversations into replies.

The seam is `Policy`: `policy(conversations) -> texts`, one reply per
conversation, in order. Backends: `local.LocalPolicy` (the JAX sampler over a
local checkpoint, optionally with LoRA), `http.HTTPPolicy` (any OpenAI-compatible
endpoint) and `scripted` (an oracle that reads the source, a random prober and a
scripted coder, for tests and baselines). `server.PolicyServer` serves any policy
over OpenAI-compatible HTTP. `backends` builds the policy of a seat (agent, judge,
coder, teacher) from its gin-chosen `*BackendConfig`.
"""

from collections.abc import Sequence
from typing import Protocol


class Policy(Protocol):
    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """Returns one reply text per conversation (a list of {"role", "content"} messages)."""
        ...
