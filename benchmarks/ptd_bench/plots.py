"""PNG plots: speedup per dataset and method, speedup against concurrency, and DE and
tokens/s against PTD's width and depth (the paper's Figure 6)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; benchmark machines have no display
import matplotlib.pyplot as plt

from .workloads import title


def speedup_bars(rows: list[dict], path: str, mode: str, concurrency: int) -> None:
    """Grouped bars: one group per dataset, one bar per non-plain method."""
    rows = [r for r in rows if r["mode"] == mode and r["concurrency"] == concurrency
            and r["kind"] != "plain" and r.get("speedup") is not None]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    value = {(r["method"], r["dataset"]): r["speedup"] for r in rows}
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(datasets) + 2), 3.6))
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(datasets))]
        ax.bar(xs, [value.get((method, d), 0.0) for d in datasets], width, label=method)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(datasets)), [title(d) for d in datasets])
    ax.set_ylabel("speedup over plain")
    ax.set_title(f"{mode}, {concurrency} at once")
    if methods:  # a plain-only run (e.g. the plain server) has no bars
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def speedup_vs_concurrency(rows: list[dict], path: str, mode: str) -> None:
    rows = [r for r in rows if r["mode"] == mode and r["kind"] != "plain"
            and r.get("speedup") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for method in dict.fromkeys(r["method"] for r in rows):
        for dataset in dict.fromkeys(r["dataset"] for r in rows):
            pts = sorted((r["concurrency"], r["speedup"]) for r in rows
                         if r["method"] == method and r["dataset"] == dataset)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{method}, {title(dataset)}")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests at once")
    ax.set_ylabel("speedup over plain")
    if rows:
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep_plot(rows: list[dict], path: str, base_width: int = 4, base_depth: int = 6) -> None:
    """Left: against width at the base depth; right: against depth at the base width.
    DE on the left axis, tokens/s on the right one."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, fixed, value in ((axes[0], "width", "depth", base_depth),
                                  (axes[1], "depth", "width", base_width)):
        pts = sorted((r[key], r.get("DE") or 0.0, r["tokens_per_s"]) for r in rows
                     if r[fixed] == value)
        if not pts:
            continue
        xs, de, tps = zip(*pts)
        ax.plot(xs, de, marker="o", color="tab:blue", label="DE")
        ax.set_xlabel(f"{key} ({'w' if key == 'width' else 'd'}), {fixed} = {value}")
        ax.set_ylabel("DE (tokens / target step)", color="tab:blue")
        ax.set_xticks(xs)
        twin = ax.twinx()
        twin.plot(xs, tps, marker="s", color="tab:red", label="tokens/s")
        twin.set_ylabel("tokens/s", color="tab:red")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
