"""The paper's prompt sets as conversations: lists of user turns, answered in order.

MT-Bench has two turns and turn 2 is asked after the model's own turn-1 answer, so a
conversation's second prompt only exists once its first answer does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vllm_ptd.datasets import first_user_turn, paper_subset

# Column titles of the paper's tables.
TITLES = {"mt_bench": "MT-Bench", "gsm8k": "GSM-100", "humaneval": "HumanEval",
          "mbpp": "MBPP-100"}
REPEATED = ", repeated"   # the dataset name of a workload's second run (--repeat)


def title(dataset: str) -> str:
    """A table's name for a workload: the paper's for its sets, else the name itself."""
    if dataset.endswith(REPEATED):
        return title(dataset[: -len(REPEATED)]) + REPEATED
    return TITLES.get(dataset, dataset)


@dataclass(frozen=True)
class Workload:
    dataset: str
    conversations: list[list[str]]  # user turns per conversation

    @property
    def num_requests(self) -> int:
        return sum(map(len, self.conversations))


def load_workload(dataset: str, limit: int | None = None, seed: int = 0,
                  split: str = "all") -> Workload:
    """The paper's subset of `dataset`, or one half of it (`split`: vllm_ptd.datasets.SPLITS),
    first `limit` conversations (None: all of it)."""
    rows = paper_subset(dataset, seed, split)[:limit]
    if dataset == "mt_bench":
        convs = [list(r["turns"]) for r in rows]
    else:
        convs = [[first_user_turn(dataset, r)] for r in rows]
    return Workload(dataset, convs)


def load_prompts_file(path: str, limit: int | None = None) -> Workload:
    """A user's own prompts, one JSON value a line: a string (one user turn), or an object
    with "prompt" (one user turn) or "turns" (user turns of one conversation, each asked
    after the model's answer to the one before). Blank lines are skipped. The workload is
    named after the file."""
    convs = []
    for number, line in enumerate(Path(path).read_text("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
        if isinstance(value, dict) and "turns" in value:
            turns = value["turns"]
        elif isinstance(value, dict) and "prompt" in value:
            turns = [value["prompt"]]
        else:
            turns = [value]
        if not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"{path}:{number}: expected a non-empty string, "
                             '{"prompt": str} or {"turns": [str, ...]}')
        convs.append(list(turns))
    if not convs:
        raise ValueError(f"{path}: no prompts")
    return Workload(Path(path).stem, convs[:limit])


def messages_for(turns: list[str], answers: list[str]) -> list[dict]:
    """Chat messages for the next turn: every earlier user turn followed by its answer."""
    msgs = []
    for user, answer in zip(turns, answers):
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    msgs.append({"role": "user", "content": turns[len(answers)]})
    return msgs


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]
