"""DE / HR / AL / C and T nodes per step of the reference PTD driver on the embedded model.

HF transformers, float32, greedy, batch 1, chat template; also checks that every output equals
plain greedy decoding through the same adapter and reports wall-clock of both.

    python benchmarks/reference_driver_metrics.py [--prompts 5] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import time

import torch

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.driver import generate_autoregressive, generate_ptd
from vllm_ptd.core.hf_adapter import HFTreeModel
from vllm_ptd.core.metrics import PTDStats
from vllm_ptd.datasets import DATASETS, sample_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=5, help="prompts per dataset")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("--max-nodes", type=int, default=PTDConfig().max_nodes)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from vllm_ptd.model import default_model_path

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = HFTreeModel.from_pretrained(path, dtype=torch.float32)
    cfg = PTDConfig(max_nodes=args.max_nodes)
    stop = frozenset({tok.eos_token_id})
    for name in args.datasets:
        stats, same, t_plain, t_ptd = PTDStats(), 0, 0.0, 0.0
        texts = sample_prompts(name, args.prompts)
        for text in texts:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids if isinstance(ids, list) else ids["input_ids"])
            t0 = time.perf_counter()
            plain = generate_autoregressive(model, ids, args.new_tokens, stop)
            t1 = time.perf_counter()
            res = generate_ptd(model, ids, args.new_tokens, cfg, stop)
            t2 = time.perf_counter()
            t_plain += t1 - t0
            t_ptd += t2 - t1
            same += res.tokens == plain
            stats = stats.merge(res.stats)
        s = stats.summary()
        print(
            f"{name:9s} DE {s['DE']:.2f}  HR {s['HR']:.2f}  AL {s['AL']:.2f}  "
            f"C/step {s['C_nodes_per_step']:.1f}  T/step {s['T_nodes_per_step']:.1f}  "
            f"tokens {s['tokens']}  equal {same}/{len(texts)}  "
            f"wall-clock vs plain {t_plain / t_ptd:.2f}x"
        )


if __name__ == "__main__":
    main()
