"""ReasoningGymReward: the reward of ``dataset.reasoning_gym`` rows, the task's own scorer (no checker of ours).

The answer is what the model's last reply holds between its last ``<answer>`` and ``</answer>``
(``reasoning_gym.utils.extract_answer``, reasoning-gym's own convention); a reply without the tags has no answer,
which every task scores 0. The score is ``dataset.score_answer(answer, entry)``: 1.0 for a right answer, less for
a wrong one (some tasks give partial credit, e.g. the default scorer gives len(truth) / len(answer) to an answer
that contains the truth). The metric ``answer_tagged`` says whether the reply had the tags at all.

The entry is rebuilt from the row's ground truth (reasoning_gym_tasks.py); each dataset is built once per reward
instance, i.e. once per worker, which builds the reward once (``WorkerSpec.reward``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from agentloop_grpc.agent.reward import Outcome, Score

from .reasoning_gym_tasks import TaskRef, entry_of

#: The import path that names this reward in a config (``reward: {path: ...}``) or a WorkerSpec.
PATH = "agentloop_grpc.rollout.reasoning_gym_reward:ReasoningGymReward"


class ReasoningGymReward:
    """A reward function (agent/reward.py) for rows whose ground truth names a reasoning-gym entry."""

    def __init__(self) -> None:
        self._datasets: dict[str, Any] = {}
        # sync reward functions run in threads (agent/reward.py): two first calls must not build one dataset twice
        self._lock = threading.Lock()

    def __call__(self, outcome: Outcome) -> Score:
        from reasoning_gym.utils import extract_answer

        ref, index, answer = entry_of(outcome.sample.ground_truth)
        dataset = self._dataset(ref)
        entry = dataset[index]
        if entry["answer"] != answer:
            raise ValueError(f"entry {index} of reasoning-gym's {ref.task} (seed {ref.seed}) is {entry['answer']!r} "
                             f"here but {answer!r} in the row: another reasoning-gym version built the rows")
        # after the prompt: a row's worked examples are assistant turns too
        given = extract_answer(last_reply(outcome.messages[len(outcome.sample.messages):]))
        return Score(float(dataset.score_answer(given, entry)), {"answer_tagged": float(given is not None)})

    def _dataset(self, ref: TaskRef) -> Any:
        key = json.dumps([ref.task, ref.size, ref.seed, ref.config], sort_keys=True)
        with self._lock:
            if key not in self._datasets:
                self._datasets[key] = ref.build()
            return self._datasets[key]


def last_reply(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the last assistant message ("" when there is none); image parts have no text."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, str):
                return content
            return "".join(part.get("text") or "" for part in content if part.get("type") == "text")
    return ""
