"""Fingerprints of the vLLM functions and classes PTD wraps or builds on.

A fingerprint is a hash of a definition's syntax tree (comments and formatting do not count;
fields a newer Python adds empty do not either), computed from the source file alone, so that
the same function gives the same fingerprint whether it is read from an installed vLLM or
from a released source distribution (`scripts/record_vllm_fingerprints.py`). The guard
(`version_check`) compares the installed vLLM's fingerprints with those recorded for its
version: a changed function is named instead of failing later inside an engine.

Reads files only: nothing here imports vLLM's modules.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from functools import cache
from pathlib import Path

RECORDED_FILE = Path(__file__).parent / "data" / "vllm_fingerprints.json"

# What PTD depends on, as (module, qualified name). The first group is every attribute
# `vllm_integration.patches.ALL_PATCHES` wraps (a test keeps the two lists equal); the second
# is what PTD's attention backends and proposer subclass or rely on without wrapping.
WRAPPED: tuple[tuple[str, str], ...] = (
    ("vllm.engine.arg_utils", "EngineArgs.create_speculative_config"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._prepare_inputs"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._build_attention_metadata"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._input_fits_in_drafter"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._check_and_update_cudagraph_mode"),
    ("vllm.v1.sample.logits_processor", "build_logitsprocs"),
    ("vllm.sampling_params", "SamplingParams._validate_spec_decode"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._update_after_schedule"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.make_spec_decoding_stats"),
    ("vllm.v1.metrics.loggers", "StatLoggerManager.__init__"),
    ("vllm.v1.metrics.loggers", "StatLoggerManager.record"),
)
# Wrapped functions that differ between supported releases, each read against its wrapper:
# the recorded fingerprints accept each release's version, this says why the one wrapper fits
# both (tests/test_vllm_compat.py requires every other wrapped function to be identical).
REVIEWED_CHANGES = {
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner._build_attention_metadata": (
        "0.33 moves the multimodal prefix ranges into a helper; the wrapper uses only what "
        "both releases return, (per-layer metadata: a dict, or a list of dicts with "
        "micro-batching; the speculative common metadata)"),
    "vllm.v1.core.sched.scheduler.Scheduler.update_from_output": (
        "0.33 changes its internals (deferred loads, requeuing, error fields); the wrapper "
        "uses only its signature, its per-request make_spec_decoding_stats(..., request_id) "
        "call and the scheduler_stats of the outputs it returns, unchanged in 0.33"),
}
RELIED_ON: tuple[tuple[str, str], ...] = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._calc_spec_decode_metadata"),
    ("vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer"),
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"),
    ("vllm.v1.attention.backends.triton_attn", "TritonAttentionImpl.forward"),
    ("vllm.v1.attention.backends.triton_attn", "TritonAttentionMetadataBuilder.__init__"),
    ("vllm.v1.attention.backends.triton_attn", "TritonAttentionMetadataBuilder.build"),
    # cuda_graphs.py: what decides a step is the uniform decode batch FULL graphs replay
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._determine_batch_execution_and_padding"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._is_uniform_decode"),
    ("vllm.v1.cudagraph_dispatcher", "CudagraphDispatcher._create_padded_batch_descriptor"),
)
TARGETS = WRAPPED + RELIED_ON


def target_name(module: str, qualname: str) -> str:
    return f"{module}.{qualname}"


def _canonical(node: ast.AST) -> str:
    """The node's fields without line numbers, skipping empty and None fields, which newer
    Pythons add to existing nodes (`type_params` in 3.12)."""
    if isinstance(node, ast.AST):
        parts = []
        for name, value in ast.iter_fields(node):
            if value is None or value == []:
                continue
            parts.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({', '.join(parts)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(item) for item in node) + "]"
    return repr(node)


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    node: ast.AST = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        found = [child for child in body
                 if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and child.name == part]
        if not found:
            return None
        node = found[-1]   # a later definition replaces an earlier one, as at import
    return node


@cache
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def fingerprint_in_file(path: str | Path, qualname: str) -> str | None:
    """Fingerprint of `qualname` defined in the Python file `path`, None if it is absent."""
    stat = Path(path).stat()
    node = _find(_parsed(str(path), stat.st_mtime_ns, stat.st_size), qualname)
    if node is None:
        return None
    return hashlib.sha256(_canonical(node).encode()).hexdigest()[:16]


def module_file(root: str | Path, module: str) -> Path:
    """Where `module` lives under a source tree whose top folder holds the `vllm` package."""
    path = Path(root, *module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def fingerprints_of_tree(root: str | Path) -> dict[str, str | None]:
    """Every target's fingerprint in the vLLM source tree at `root` (None: absent)."""
    out: dict[str, str | None] = {}
    for module, qualname in TARGETS:
        path = module_file(root, module)
        out[target_name(module, qualname)] = (fingerprint_in_file(path, qualname)
                                              if path.is_file() else None)
    return out


def file_digests(root: str | Path) -> dict[str, str | None]:
    """sha256 of each file holding a target, by module: equal digests mean equal
    fingerprints, and hashing bytes is ~50x faster than parsing (a fast path at load)."""
    out: dict[str, str | None] = {}
    for module in sorted({module for module, _ in TARGETS}):
        path = module_file(root, module)
        out[module] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return out


def installed_vllm_root() -> Path | None:
    """The folder above the installed `vllm` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


@cache
def _recorded_file() -> dict:
    return json.loads(RECORDED_FILE.read_text(encoding="utf-8"))


def recorded() -> dict[str, dict[str, str | None]]:
    """{vLLM version: {target: fingerprint}} recorded from released sources."""
    return _recorded_file()["versions"]


def recorded_file_digests() -> dict[str, dict[str, str | None]]:
    """{vLLM version: {module: sha256 of its file}} recorded with the fingerprints."""
    return _recorded_file().get("files", {})
