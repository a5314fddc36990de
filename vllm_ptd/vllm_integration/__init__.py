"""Engine glue between the PTD core (`vllm_ptd.core`) and vLLM 0.32. Every touch of vLLM
internals is listed in `patches.ALL_PATCHES`."""
