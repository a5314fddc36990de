#!/usr/bin/env bash
# The whole test suite (pure-algorithm, kernel and real-engine tests) on the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest tests "$@"
