"""Markdown: the paper's Tables 1/2 layout (rows methods, columns datasets: speedup and DE),
a detail table with every metric, and the width/depth sweep."""

from __future__ import annotations

from statistics import mean

from .workloads import title


def _f(value, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if value is None else fmt.format(value)


def _ordered(values) -> list:
    return list(dict.fromkeys(values))


def paper_table(rows: list[dict], mode: str, concurrency: int) -> str:
    """Rows: methods; per dataset a speedup and a DE column; then their means."""
    rows = [r for r in rows if r["mode"] == mode and r["concurrency"] == concurrency]
    datasets = _ordered(r["dataset"] for r in rows)
    cell = {(r["method"], r["dataset"]): r for r in rows}
    head = ["Method"] + [f"{title(d)} {k}" for d in datasets for k in ("Speedup", "DE")]
    head += ["Mean Speedup", "Mean DE"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in _ordered(r["method"] for r in rows):
        found = [cell.get((method, d)) for d in datasets]
        cols = [method]
        for r in found:
            cols += [_f(r and r.get("speedup"), "{:.2f}x"), _f(r and r.get("DE"))]
        speedups = [r["speedup"] for r in found if r and r.get("speedup") is not None]
        des = [r["DE"] for r in found if r and r.get("DE") is not None]
        cols += [_f(mean(speedups) if speedups else None, "{:.2f}x"),
                 _f(mean(des) if des else None)]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def depth_rates(row: dict, most: int = 8) -> str:
    """Acceptance by depth as rates per decode step: share of steps that accepted >= k drafts."""
    steps = row.get("steps")
    depths = row.get("accepted_by_depth") or []
    if not steps or not depths:
        return "-"
    return " / ".join(f"{n / steps:.2f}" for n in depths[:most])


def detail_table(rows: list[dict]) -> str:
    head = ["method", "dataset", "mode", "conc.", "tokens/s", "speedup", "DE", "HR", "AL",
            "C/step", "T/step", "host ms/step", "accepted >= k (k=1..)", "mismatches"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        mism = r.get("mismatches")
        cols = [r["method"], title(r["dataset"]), r["mode"],
                str(r["concurrency"]), _f(r["tokens_per_s"], "{:.1f}"),
                _f(r.get("speedup"), "{:.2f}x"), _f(r.get("DE")), _f(r.get("HR")),
                _f(r.get("AL")), _f(r.get("C_nodes_per_step"), "{:.1f}"),
                _f(r.get("T_nodes_per_step"), "{:.1f}"), _f(r.get("host_ms_per_step")),
                depth_rates(r), "-" if mism is None else f"{mism}/{r['requests']}"]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def sweep_table(rows: list[dict]) -> str:
    head = ["w", "d", "dataset", "tokens/s", "speedup", "DE", "HR", "AL", "C/step", "T/step",
            "mismatches"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        mism = r.get("mismatches")
        lines.append("| " + " | ".join([
            str(r["width"]), str(r["depth"]), title(r["dataset"]),
            _f(r["tokens_per_s"], "{:.1f}"), _f(r.get("speedup"), "{:.2f}x"), _f(r.get("DE")),
            _f(r.get("HR")), _f(r.get("AL")), _f(r.get("C_nodes_per_step"), "{:.1f}"),
            _f(r.get("T_nodes_per_step"), "{:.1f}"), "-" if mism is None else str(mism),
        ]) + " |")
    return "\n".join(lines)


def _setting(mode: str, concurrency: int) -> str:
    if mode == "server":
        return f"server, {concurrency} client{'s' if concurrency > 1 else ''}"
    if concurrency == 1:
        return "offline, batch 1 (one request at a time)"
    return f"offline, {concurrency} requests at once"


def _sampling_text(sampling: dict | None) -> str:
    if not sampling or sampling.get("temperature", 0.0) <= 0.0:
        return "greedy"
    return (f"sampled (temperature {sampling['temperature']}, top-p {sampling.get('top_p', 1.0)},"
            f" per-request seeds from {sampling.get('seed', 0)}: mismatches compare seeded "
            "samples)")


def render(meta: dict, rows: list[dict], sweep: list[dict]) -> str:
    """The whole results.md."""
    out = ["# PTD benchmark", "",
           f"- date: {meta.get('date')}",
           f"- machine: {meta.get('machine')}",
           f"- model: {meta.get('model')} ({meta.get('dtype')})",
           *([f"- engines: {meta['engines']}"] if meta.get("engines") else []),
           f"- command: `{meta.get('command')}`",
           (f"- {_sampling_text(meta.get('sampling'))}, max {meta.get('max_tokens')} new "
            f"tokens per request, {meta.get('prompts') or 'all'} conversations per set"
            + ("" if meta.get("split", "all") == "all" else f" (its {meta['split']} half)")),
           ""]
    if meta.get("note"):
        out += [meta["note"], ""]
    for mode in _ordered(r["mode"] for r in rows):
        for conc in sorted({r["concurrency"] for r in rows if r["mode"] == mode}):
            out += [f"## {_setting(mode, conc)}", "", paper_table(rows, mode, conc), ""]
    out += ["## All metrics", "", detail_table(rows), ""]
    if sweep:
        out += ["## Width / depth sweep (Figure 6)", "", sweep_table(sweep), ""]
    bad = sum(r.get("mismatches") or 0 for r in rows + sweep)
    out.append(f"Greedy mismatches against plain decoding: **{bad}**.")
    return "\n".join(out) + "\n"
