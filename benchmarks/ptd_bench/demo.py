"""`vllm-ptd demo`, the Quick start: what a user gets from PTD on this machine, measured.

The benchmark's interleaved method (`main.run_offline_interleaved`): every engine warmed up
by one untimed prompt, then taking turns prompt by prompt, in vLLM's default multiprocess
engines. Two measurements:
- exactness, float32: plain and PTD on a few prompts; greedy outputs compared token by token
  (float32 is where speculative decoding is exact: in bf16 a many-row step can round a near-tie
  differently from a one-row step, for any drafter);
- speed, in the dtype users should serve on this CPU (`--dtype auto`: bfloat16, or float32 on
  an x86 CPU without AVX-512, where vLLM's bf16 GEMMs fall back to a slow path): plain, vLLM's
  `ngram`, vLLM's `suffix` (when arctic-inference is installed) and PTD on a mix of the four
  packaged prompt sets.
When the speed table is float32 too, one set of engines serves both (two fewer engine starts).
vLLM's log lines go to a file (its path is printed) behind a progress bar; `--verbose` shows them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from vllm_ptd.cpu_features import bf16_gemm_falls_back
from vllm_ptd.datasets import DATASETS

from .methods import build_methods
from .workloads import TITLES, Workload, load_workload

SUFFIX_MISSING = ("not installed (vLLM's suffix decoding needs arctic-inference; "
                  "see benchmarks/ptd_bench/README.md)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-ptd demo",
        description="Quick start: plain vLLM, vLLM's ngram (and suffix, when installed) and PTD "
                    "on the packaged prompt sets: tokens/s and tokens per step in bfloat16, "
                    "and PTD's greedy output checked against plain decoding's in float32.")
    p.add_argument("--model", default=None, help="HF model path (default: embedded SmolLM2)")
    p.add_argument("--prompts", "--num-prompts", type=int, default=4, dest="prompts",
                   help="conversations per prompt set for the speed table (MT-Bench ones have "
                        "two turns, so the default 4 gives 20 prompts)")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt "
                   "(default 64: more prompts with fewer tokens give a steadier ratio in the "
                   "same time)")
    p.add_argument("--exact-prompts", type=int, default=1,
                   help="conversations per set for the float32 exactness check (0: skip it)")
    p.add_argument("--dtype", default="auto",
                   help="dtype of the speed table (default auto: bfloat16, or float32 on an "
                        "x86 CPU without AVX-512, where vLLM's bf16 GEMMs are slow)")
    p.add_argument("--log-file", default=None,
                   help="where vLLM's log lines go (default: a new file in the temp folder)")
    p.add_argument("--verbose", action="store_true", help="show vLLM's log lines here instead")
    return p


def speed_dtype(requested: str) -> str:
    """`--dtype`, with auto resolved for this CPU (vllm_ptd.cpu_features)."""
    if requested != "auto":
        return requested
    return "float32" if bf16_gemm_falls_back() else "bfloat16"


def mixed_workload(datasets: list[str], per_set: int, name: str = "quickstart",
                   skip: int = 0) -> Workload:
    """`per_set` conversations of every set (after its first `skip`), taken in turn
    (MT-Bench, GSM8K, HumanEval, MBPP, MT-Bench, ...), as one workload: one row per method,
    and PTD's and suffix's learned state carried across sets as in a server."""
    sets = [load_workload(d, skip + per_set).conversations[skip:] for d in datasets]
    convs = [conv for i in range(per_set) for s in sets if i < len(s) for conv in [s[i]]]
    return Workload(name, convs)


def suffix_installed() -> bool:
    return importlib.util.find_spec("arctic_inference") is not None


@contextlib.contextmanager
def logs_to(path: Path | None):
    """Sends file descriptors 1 and 2 (vLLM's logger, warnings, the engine-core processes,
    which inherit them) to `path`; yields text streams on the real stdout and stderr.
    path None: nothing is redirected."""
    if path is None:
        yield sys.stdout, sys.stderr
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    out = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    err = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield out, err
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        out.close()
        err.close()


def bench_args(args, dtype: str):
    """The benchmark's own options for one interleaved run with multiprocess engines."""
    from .options import parser as bench_parser

    argv = ["--interleave", "--multiprocess", "--dtype", dtype,
            "--max-tokens", str(args.max_tokens), "--no-progress"]
    return bench_parser().parse_args(argv + (["--model", args.model] if args.model else []))


def speed_table(rows: list[dict], suffix_ran: bool) -> list[str]:
    """method, tokens/s, x plain, tokens per step; a line for suffix when it could not run."""
    lines = [f"{'method':<12} {'tokens/s':>9} {'x plain':>8} {'tokens/step':>12}"]
    for r in rows:
        if r["kind"] == "ptd" and not suffix_ran:
            lines.append(f"{'suffix':<12} {SUFFIX_MISSING}")
        de = r.get("DE")
        lines.append(f"{r['method']:<12} {r['tokens_per_s']:>9.1f} {r['speedup']:>7.2f}x "
                     f"{'-' if de is None else f'{de:.2f}':>12}")
    return lines


def _prompt_mix(datasets: list[str], per_set: int, workload: Workload) -> str:
    parts = [f"{TITLES[d]} {per_set}x2 turns" if d == "mt_bench" else f"{TITLES[d]} {per_set}"
             for d in datasets]
    return f"{workload.num_requests} prompts ({', '.join(parts)})"


def run(args, out, err) -> int:
    from tqdm import tqdm

    from .main import machine_meta, run_offline_interleaved
    from .outputs import add_speedups

    started = time.perf_counter()
    meta = machine_meta()
    dtype = speed_dtype(args.dtype)
    speed = mixed_workload(args.datasets, args.prompts)
    # In float32 the speed engines check exactness too (plain and PTD are among them), after
    # the speed prompts and on other conversations: what PTD and suffix learn from a prompt
    # must not speed up the timed ones, nor a repeat of a timed prompt stand in for a new one.
    shared = args.exact_prompts > 0 and dtype == "float32"
    exact = (mixed_workload(args.datasets, args.exact_prompts, "exactness",
                            skip=args.prompts if shared else 0)
             if args.exact_prompts else None)
    has_suffix = suffix_installed()
    names = ["plain", "ngram"] + (["suffix"] if has_suffix else []) + ["ptd"]
    methods = build_methods(names, ["{}"])
    exact_methods = build_methods(["plain", "ptd"], ["{}"])
    steps = len(methods) * (1 + speed.num_requests)
    if shared:
        steps += len(methods) * exact.num_requests
    elif exact is not None:
        steps += len(exact_methods) * (1 + exact.num_requests)
    # One tick per engine start (the slow part: tens of seconds each) and per prompt answered.
    bar = tqdm(total=steps, file=err, dynamic_ncols=True, desc="starting",
               bar_format="{desc}{bar} {n_fmt}/{total_fmt} [{elapsed}{postfix}]")

    def tick(what: str) -> None:
        label, _, _ = what.partition(" | ")
        bar.set_postfix_str(f"{label.replace('start ', '')} started" if label.startswith("start ")
                            else f"{label} answered a prompt", refresh=False)
        bar.update(1)

    exact_rows = []
    try:
        if shared:
            bar.set_description("exactness and speed (float32)", refresh=True)
            rows = run_offline_interleaved(bench_args(args, dtype), methods, [speed, exact],
                                           tick)
            exact_rows = [r for r in rows if r["dataset"] == exact.dataset]
            rows = [r for r in rows if r["dataset"] == speed.dataset]
        else:
            if exact is not None:
                # float32 first: the ngram engine of the speed run loads numba into this
                # process, after which vLLM 0.32 cannot start another engine
                # (main.run_offline_interleaved).
                bar.set_description("exactness (float32)", refresh=True)
                exact_rows = run_offline_interleaved(bench_args(args, "float32"),
                                                     exact_methods, [exact], tick)
            bar.set_description(f"speed ({dtype})", refresh=True)
            rows = run_offline_interleaved(bench_args(args, dtype), methods, [speed], tick)
    finally:
        bar.close()
    add_speedups(rows)

    model = args.model or "embedded SmolLM2-135M-Instruct"
    print(f"\n{model} on {meta['machine']}, vLLM {meta['vllm']}, torch {meta['torch']}",
          file=out)
    print(f"\nSpeed: {dtype}, greedy, batch 1 (one request at a time), "
          f"{_prompt_mix(args.datasets, args.prompts, speed)}, up to {args.max_tokens} new "
          "tokens each.", file=out)
    print("Engines: vLLM's default multiprocess engines, all started and warmed up (one "
          "untimed prompt each), then taking turns prompt by prompt.", file=out)
    print("\n".join(speed_table(rows, has_suffix)), file=out)
    print("tokens/step: tokens committed per decoding step of the model (plain: 1).", file=out)
    for r in exact_rows:
        if r["kind"] == "ptd":
            same = r["requests"] - r["mismatches"]
            print(f"\nExactness: float32, greedy, up to {args.max_tokens} new tokens: PTD's "
                  f"output identical to plain decoding's on {same}/{r['requests']} prompts.",
                  file=out)
            for bad in r["mismatched"]:
                print(f"  differs: conversation {bad['conversation']}, turn {bad['turn']}, from "
                      f"token {bad['first_difference']}", file=out)
    print(f"\nMeasured now on {os.cpu_count()} CPU cores; timings on a shared machine are noisy "
          "(rerun, or raise --prompts, for a steadier ratio). In bfloat16 any drafter's output "
          "may differ from plain decoding's where rounding breaks a near-tie; float32 is "
          "exact. vLLM's CPU backend: CPU speedups do not predict GPU speedups.", file=out)
    seconds = time.perf_counter() - started
    print(f"Took {int(seconds // 60)} min {int(seconds % 60)} s.", file=out)
    ok = all(r["mismatches"] == 0 for r in exact_rows if r["kind"] == "ptd")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.prompts < 1 or args.exact_prompts < 0 or args.max_tokens < 1:
        raise SystemExit("vllm-ptd demo: --prompts and --max-tokens must be >= 1, "
                         "--exact-prompts >= 0")
    log = None
    if not args.verbose:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        log = Path(args.log_file or Path(tempfile.gettempdir()) / f"vllm-ptd-demo-{stamp}.log")
        print(f"vLLM's log lines go to {log} (--verbose shows them here)", flush=True)
    try:
        with logs_to(log) as (out, err):
            return run(args, out, err)
    except BaseException:
        if log is not None:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print(f"vllm-ptd demo failed; the last lines of {log}:", *tail, sep="\n",
                  file=sys.stderr)
        raise


if __name__ == "__main__":
    sys.exit(main())
