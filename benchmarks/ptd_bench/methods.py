"""The decoding methods a run compares, each with the speculative config it gives vLLM."""

from __future__ import annotations

import json
from dataclasses import dataclass

METHODS = ("plain", "ngram", "suffix", "ptd")

# vLLM's prompt-lookup drafter as the README compares it: k=4, n-grams of 2..4 tokens.
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 4,
              "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# vLLM's suffix decoding (Arctic Inference's suffix tree) with vLLM's own defaults.
SUFFIX_SPEC = {"method": "suffix"}


@dataclass(frozen=True)
class Method:
    """One row of the tables: `ptd` is PTD's config (None: not PTD), `spec` another vLLM
    speculative config (None with `ptd` None: plain decoding)."""

    label: str
    kind: str
    ptd: dict | None = None
    spec: dict | None = None


def parse_ptd_config(text: str) -> tuple[str, dict]:
    """`'{"max_nodes": 24}'` or `'small={"max_nodes": 24}'` -> (label, config)."""
    label, sep, body = text.partition("=")
    if not sep or label.strip().startswith("{"):
        label, body = "", text
    config = json.loads(body)
    if not isinstance(config, dict):
        # ValueError like every other bad config input (PTDConfig.from_dict does the same)
        raise ValueError(f"PTD config must be a JSON object, got {body!r}")  # noqa: TRY004
    if not label:
        label = "ptd" if not config else "ptd " + json.dumps(config, separators=(",", ":"))
    return label.strip(), config


def build_methods(names: list[str], ptd_configs: list[str]) -> list[Method]:
    """Methods in run order; plain first because every other method is compared with it."""
    unknown = sorted(set(names) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    out = []
    for name in sorted(set(names), key=METHODS.index):
        if name == "plain":
            out.append(Method("plain", "plain"))
        elif name == "ngram":
            out.append(Method("ngram k=4", "ngram", spec=dict(NGRAM_SPEC)))
        elif name == "suffix":
            out.append(Method("suffix", "suffix", spec=dict(SUFFIX_SPEC)))
        else:
            for text in ptd_configs or ["{}"]:
                label, config = parse_ptd_config(text)
                out.append(Method(label, "ptd", ptd=config))
    labels = [m.label for m in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"method labels must be unique, got {labels}")
    return out


def sweep_methods(base: dict, widths: list[int], depths: list[int]) -> list[Method]:
    """Figure 6: width at the base depth (default 6), then depth at the base width (default 4);
    the shared (w, d) point runs once."""
    w0, d0 = base.get("width", 4), base.get("depth", 6)
    points = [(w, d0) for w in widths] + [(w0, d) for d in depths]
    out, seen = [], set()
    for w, d in points:
        if (w, d) not in seen:
            seen.add((w, d))
            out.append(Method(f"ptd w={w} d={d}", "ptd", ptd={**base, "width": w, "depth": d}))
    return out
