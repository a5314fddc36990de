#!/usr/bin/env bash
# Quick start: install everything, then answer a few MT-Bench questions with plain vLLM and PTD.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/vllm-ptd model-path >/dev/null   # converts the embedded model once
exec .venv/bin/vllm-ptd demo "$@"
