"""Runs the benchmark and writes results.json, results.md and the PNG plots."""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from vllm_ptd.cpu_features import cpu_model_name

from . import offline, plots, report, server
from .methods import Method, build_methods, parse_ptd_config, sweep_methods
from .options import apply_smoke, parser
from .outputs import add_speedups, compare
from .workloads import REPEATED, load_prompts_file, load_workload


def machine_meta() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    processor = gpu or cpu_model_name() or platform.processor() or "unknown CPU"
    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"machine": f"{processor}, {os.cpu_count()} CPU cores, {platform.system()}",
            "device": "cuda" if gpu else "cpu", "torch": torch.__version__, "vllm": vllm_version,
            "python": platform.python_version(), "commit": commit or None,
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def run_offline_interleaved(args, methods: list[Method], workloads,
                            on_progress=None) -> list[dict]:
    """Every method's engine alive at once, taking turns one `generate` call (one group of
    `concurrency` requests) at a time, so a slow spell of a shared machine hits all methods
    alike instead of whichever ran then. Mismatches are checked against plain's outputs once
    the workload is done. Engine cores run in this process unless `args.multiprocess`
    (vLLM's default: one engine-core process per engine, idle ones blocked on their queue).

    on_progress(what): called after each engine's start and warm-up ("start <label>") and
    after each `generate` call ("<label> | <dataset>"), e.g. to advance a progress bar."""
    if not getattr(args, "multiprocess", False):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    progress = on_progress or (lambda what: None)
    # vLLM 0.32 re-scans every loaded module when an engine starts; once the ngram engine
    # has loaded numba, that scan fails on numba's objects, so ngram's engine starts last.
    order = sorted(methods, key=lambda m: m.kind == "ngram")
    engines = {}
    for method in order:
        print(f"[bench] {method.label}: starting the engine", file=sys.stderr, flush=True)
        engines[method.label] = offline.build_engine(
            method, args.model, args.dtype, max(args.concurrency), args.max_model_len,
            not args.compile)
        offline.warm_up(engines[method.label])
        progress(f"start {method.label}")
    rows = []
    for conc in args.concurrency:
        for workload in workloads:
            # --repeat: the same prompts again at once, caches kept (prompts users repeat)
            for cold in (True, False) if getattr(args, "repeat", False) else (True,):
                rows += _take_turns(args, methods, engines, workload, conc, cold, progress)
    engines.clear()  # shuts the engines (and their engine-core processes) down
    gc.collect()
    return rows


def _take_turns(args, methods: list[Method], engines: dict, workload, conc: int, cold: bool,
                progress) -> list[dict]:
    """One workload at one concurrency, the methods taking turns per `generate` call."""
    turns = {m.label: offline.iter_workload(engines[m.label], m, workload, conc,
                                            args.max_tokens, None, False, sampling_of(args),
                                            cold) for m in methods}
    results = {}
    while turns:
        for label in list(turns):
            result = next(turns[label])
            if result is not None:
                results[label] = result
                del turns[label]
            else:
                progress(f"{label} | {workload.dataset}")
    plain = next((results[m.label][1] for m in methods if m.kind == "plain"), None)
    rows = []
    for method in methods:
        row, outputs = results[method.label]
        if not cold:
            row["dataset"] = workload.dataset + REPEATED
        if plain is not None and method.kind != "plain":
            row.update(compare(outputs, plain, workload))
        if args.save_outputs:
            row["outputs"] = outputs
        rows.append(row)
        print(f"[bench] {_summary(row)}", file=sys.stderr, flush=True)
    return rows


def run_offline(args, methods: list[Method], workloads) -> tuple[list[dict], list[dict]]:
    if args.interleave:
        return run_offline_interleaved(args, methods, workloads), []
    rows, sweep, plain = [], [], {}
    progress = not args.no_progress
    by_name = {w.dataset: w for w in workloads}
    sweep_set = by_name[args.sweep_dataset or args.datasets[0]] if args.sweep else None
    runs = [(m, False) for m in methods]
    if sweep_set is not None:
        base = parse_ptd_config(args.ptd[0])[1]
        runs += [(m, True) for m in sweep_methods(base, args.widths, args.depths)]
    for method, is_sweep in runs:
        print(f"[bench] {method.label}: starting the engine", file=sys.stderr, flush=True)
        llm = offline.build_engine(method, args.model, args.dtype, max(args.concurrency),
                                   args.max_model_len, not args.compile)
        offline.warm_up(llm)
        plan = [(1, sweep_set)] if is_sweep else [(c, w) for c in args.concurrency
                                                   for w in workloads]
        for conc, workload in plan:
            ref = plain.get((workload.dataset, conc))
            row, outputs = offline.run_workload(llm, method, workload, conc, args.max_tokens,
                                                ref, progress, sampling_of(args))
            if method.kind == "plain":
                plain[(workload.dataset, conc)] = outputs
            if args.save_outputs:
                row["outputs"] = outputs
            if is_sweep:
                row.update(width=method.ptd["width"], depth=method.ptd["depth"])
                sweep.append(row)
            else:
                rows.append(row)
            print(f"[bench] {_summary(row)}", file=sys.stderr, flush=True)
        del llm
        gc.collect()
    return rows, sweep


def _summary(row: dict) -> str:
    de = row.get("DE")
    return (f"{row['method']} | {row['dataset']} | c={row['concurrency']}: "
            f"{row['tokens_per_s']:.1f} tok/s, DE {de if de is None else round(de, 2)}, "
            f"mismatches {row.get('mismatches')}")


def write_outputs(out: Path, meta: dict, rows: list[dict], sweep: list[dict]) -> list[Path]:
    """results.json, results.md and the plots; returns the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.md"]
    written[0].write_text(json.dumps({"meta": meta, "rows": rows, "sweep": sweep}, indent=1))
    written[1].write_text(report.render(meta, rows, sweep))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        concs = sorted({r["concurrency"] for r in rows if r["mode"] == mode})
        for conc in concs:
            path = out / f"speedup_{mode}_c{conc}.png"
            plots.speedup_bars(rows, str(path), mode, conc)
            written.append(path)
        if len(concs) > 1:
            path = out / f"speedup_vs_concurrency_{mode}.png"
            plots.speedup_vs_concurrency(rows, str(path), mode)
            written.append(path)
    if sweep:
        path = out / "sweep_width_depth.png"
        plots.sweep_plot(sweep, str(path), *_sweep_base(meta))
        written.append(path)
    return written


def _sweep_base(meta: dict) -> tuple[int, int]:
    base = meta.get("sweep_base") or {}
    return base.get("width", 4), base.get("depth", 6)


def engines_text(args) -> str:
    """How the offline engines ran, for the report (in-process numbers must say so)."""
    if not args.interleave:
        return "one after another, vLLM's default multiprocess engine cores"
    cores = ("vLLM's default multiprocess engine cores" if args.multiprocess
             else "in-process engine cores")
    return f"all alive, taking turns per generate call (interleaved), {cores}"


def sampling_of(args) -> dict:
    """SamplingParams keywords shared by every request of an offline run."""
    if args.temperature <= 0.0:
        return {"temperature": 0.0}
    return {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.smoke:
        apply_smoke(args)
    # Load and validate everything cheap before any engine starts.
    if args.prompts_file:
        if args.sweep:
            raise SystemExit("--sweep runs on the prompt sets, not --prompts-file")
        try:
            workloads = [load_prompts_file(args.prompts_file, args.prompts)]
        except (OSError, ValueError) as e:
            raise SystemExit(f"--prompts-file: {e}") from None
    else:
        workloads = [load_workload(d, args.prompts, split=args.split) for d in args.datasets]
    if args.server_url and args.temperature > 0.0:
        raise SystemExit("--temperature applies to offline runs only")
    if args.interleave and (args.sweep or args.server_url):
        raise SystemExit("--interleave applies to offline runs without --sweep")
    if args.repeat and not args.interleave:
        raise SystemExit("--repeat applies to --interleave")
    if args.multiprocess and not args.interleave:
        raise SystemExit("--multiprocess applies to --interleave (other offline runs already "
                         "use vLLM's default multiprocess engine cores)")
    meta = {**machine_meta(), "dtype": args.dtype, "max_tokens": args.max_tokens,
            "sampling": sampling_of(args),
            "prompts": args.prompts, "split": args.split, "concurrency": args.concurrency,
            "command": "vllm-ptd bench " + shlex.join(sys.argv[1:] if argv is None else argv)}
    if args.server_url:
        meta.update(model=args.server_model or "(served model)", server=args.server_url)
        rows = server.run(args.server_url, args.label, args.server_model, workloads,
                          args.concurrency, args.max_tokens, args.reference,
                          not args.no_progress)
        sweep = []
    else:
        from vllm_ptd.model import default_model_path

        methods = build_methods(args.methods, args.ptd)
        meta["model"] = args.model or f"embedded SmolLM2-135M-Instruct ({default_model_path()})"
        meta["engines"] = engines_text(args)
        if args.sweep:
            meta["sweep_base"] = parse_ptd_config(args.ptd[0])[1]
        rows, sweep = run_offline(args, methods, workloads)
    if meta["device"] == "cpu":
        meta["note"] = ("CPU numbers: vLLM's CPU backend, not a GPU; with a small model the "
                        "extra rows PTD feeds per step are not free, so speedups here do not "
                        "predict GPU speedups.")
    add_speedups(rows)
    add_speedups_sweep(rows, sweep)
    out = Path(args.out or Path("benchmarks/results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    written = write_outputs(out, meta, rows, sweep)
    print(report.render(meta, rows, sweep))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def add_speedups_sweep(rows: list[dict], sweep: list[dict]) -> None:
    """Sweep points against plain's batch-1 run on the same set, when there is one."""
    plain = {r["dataset"]: r["tokens_per_s"] for r in rows
             if r["kind"] == "plain" and r["concurrency"] == 1}
    for r in sweep:
        base = plain.get(r["dataset"])
        r["speedup"] = r["tokens_per_s"] / base if base else None
