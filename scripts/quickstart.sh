#!/usr/bin/env bash
# Quick start: install everything, then measure what PTD gives on this machine, offline:
# plain vLLM, vLLM's ngram (and suffix, where arctic-inference is installed) and PTD in bf16
# (float32 on an x86 CPU without AVX-512) on 20 prompts of the packaged sets (tokens/s, x plain,
# tokens per step), and PTD's greedy output against plain decoding's in float32. vLLM's log
# lines go to a file behind a progress bar.
# Options go to `vllm-ptd demo` (`--prompts N` conversations per set, `--max-tokens`,
# `--verbose`; `vllm-ptd demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/vllm-ptd model-path >/dev/null   # converts the embedded model once
exec .venv/bin/vllm-ptd demo "$@"
