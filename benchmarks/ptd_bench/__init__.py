"""PTD benchmark: plain vs vLLM's `ngram` and `suffix` vs PTD on the paper's four prompt sets,
offline (one request at a time and a concurrency sweep) or against a running server.

    .venv/bin/python -m benchmarks.ptd_bench --smoke          # minutes, CI
    vllm-ptd bench --datasets mt_bench gsm8k --prompts 10     # same CLI
    vllm-ptd bench --help

Outputs go to --out: results.json (raw rows), results.md (paper-style tables), PNG plots.
"""
