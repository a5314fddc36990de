"""The benchmark prompt sets shipped inside the package (copied from the paper's sources; see
data/README.md for sources and licences), turned into chat prompts."""

from __future__ import annotations

import json
import random
from importlib import resources

DATASETS = ("mt_bench", "gsm8k", "humaneval", "mbpp")
_FILES = {
    "mt_bench": "mt_bench_questions.jsonl",
    "gsm8k": "gsm8k_test.jsonl",
    "humaneval": "humaneval.jsonl",
    "mbpp": "mbpp.jsonl",
}


def load_rows(name: str) -> list[dict]:
    if name not in _FILES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    text = resources.files("vllm_ptd").joinpath("data", _FILES[name]).read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def first_user_turn(name: str, row: dict) -> str:
    """The first user message the paper sends for one row of a dataset."""
    if name == "mt_bench":
        return row["turns"][0]
    if name == "gsm8k":
        return row["question"]
    if name == "humaneval":
        return "Complete the following Python function.\n\n" + row["prompt"]
    if name == "mbpp":
        tests = "\n".join(row.get("test_list", []))
        return f"{row['text']}\nYour code should pass these tests:\n{tests}"
    raise ValueError(name)


# Settings are chosen on one half of each subset and speed is reported on the other, which no
# choice was made on. The halves are fixed: "tune" is the first half of the subset's order
# (every question an earlier tuning run used lies there: none went past the 40th of a set),
# "heldout" the second (MT-Bench 40-79, GSM-100 50-99, HumanEval 82-163, MBPP-100 50-99).
SPLITS = ("all", "tune", "heldout")


def paper_subset(name: str, seed: int = 0, split: str = "all") -> list[dict]:
    """The paper's subsets: MT-Bench all 80, GSM-100, HumanEval all 164, MBPP-100 (ids 11-510),
    whole or one half of them (`split`, see SPLITS)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    rows = load_rows(name)
    if name == "gsm8k":
        rows = random.Random(seed).sample(rows, 100)
    elif name == "mbpp":
        test_range = [r for r in rows if 11 <= int(r["task_id"]) <= 510]
        rows = random.Random(seed).sample(test_range, 100)
    half = len(rows) // 2
    return {"all": rows, "tune": rows[:half], "heldout": rows[half:]}[split]


def sample_prompts(name: str, count: int, seed: int = 0, split: str = "all") -> list[str]:
    """`count` first-turn user messages from the paper's subset (or one half of it), in a
    fixed order."""
    return [first_user_turn(name, r) for r in paper_subset(name, seed, split)[:count]]
