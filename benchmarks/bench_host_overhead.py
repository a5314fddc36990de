"""Per-step host overhead of the PTD core: tree update + pool update + layout + verification.

No model: the target's argmax is synthetic over vocab 49152 (a fixed token -> token map with 30%
random noise, so trees grow, the pool fills and C gets hits as with real text). One step per
request = propose (pool retrieval, layout, budget trim) + ancestor mask + greedy verification +
observe (tree growth, pool update). Reports ms per request per step, after a warm-up.

    python benchmarks/bench_host_overhead.py [--steps 200] [--batch 1 32]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.verify import verify_greedy

VOCAB = 49152


def run(batch: int, steps: int, warmup: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    cfg = PTDConfig()
    stop = frozenset({2})
    # a small "language": each token has one likely successor among 512 hot tokens
    hot = rng.integers(3, VOCAB, size=512)
    succ = {int(t): int(hot[rng.integers(512)]) for t in hot}
    states = [
        PTDRequestState(cfg, [int(t) for t in rng.choice(hot, 200)], stop) for _ in range(batch)
    ]
    xs = [int(rng.choice(hot)) for _ in range(batch)]
    host = 0.0
    nodes = c_nodes = 0
    for step in range(warmup + steps):
        # synthetic target outputs, made before the timer: the device's job
        layouts_argmax = []
        t0 = time.perf_counter()
        for i, st in enumerate(states):
            lay = st.propose(xs[i])
            mask = lay.ancestor_mask()  # what a kernel consumes
            layouts_argmax.append((lay, mask))
        t1 = time.perf_counter()
        outs = []
        for lay, _ in layouts_argmax:
            am = np.array([succ.get(int(t), int(hot[0])) for t in lay.tokens], dtype=np.int64)
            noise = rng.random(len(lay)) < 0.3
            am[noise] = rng.choice(hot, int(noise.sum()))
            outs.append(am)
        t2 = time.perf_counter()
        for i, ((lay, _), am) in enumerate(zip(layouts_argmax, outs)):
            res = verify_greedy(lay, am, stop)
            states[i].observe(lay, am, res)
            xs[i] = res.bonus if res.bonus not in stop else int(rng.choice(hot))
            if step >= warmup:
                nodes += len(lay) - 1
                c_nodes += lay.num_candidates
        t3 = time.perf_counter()
        if step >= warmup:
            host += (t1 - t0) + (t3 - t2)
    n = batch * steps
    de = sum(s.stats.DE for s in states) / batch
    return {
        "batch": batch,
        "ms_per_request_step": 1e3 * host / n,
        "ms_per_step": 1e3 * host / steps,
        "nodes_per_step": nodes / n,
        "C_per_step": c_nodes / n,
        "synthetic_DE": de,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for b in args.batch:
        r = run(b, args.steps, args.warmup, args.seed)
        print(
            f"batch={r['batch']:3d}  host {r['ms_per_request_step']:.3f} ms/request/step "
            f"({r['ms_per_step']:.2f} ms/step)  nodes/step {r['nodes_per_step']:.1f} "
            f"(C {r['C_per_step']:.1f})  synthetic DE {r['synthetic_DE']:.2f}"
        )


if __name__ == "__main__":
    main()
