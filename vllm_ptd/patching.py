"""The mechanism for touching vLLM internals: one explicit Patch object per attribute.

Every patch PTD applies is listed in `vllm_ptd.vllm_integration.patches.ALL_PATCHES`; this
module only knows how to apply them once and refuses to patch an attribute twice.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_APPLIED: dict[tuple[str, str], Patch] = {}


@dataclass
class Patch:
    """Replace `module.owner.attr` (owner may be empty for module attributes).

    `make(original)` returns the replacement; it receives the original so wrappers can call it.
    """

    module: str
    owner: str
    attr: str
    make: Callable[[Any], Any]
    why: str
    original: Any = field(default=None, init=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.module, f"{self.owner}.{self.attr}" if self.owner else self.attr)

    def _holder(self) -> Any:
        holder: Any = importlib.import_module(self.module)
        for part in filter(None, self.owner.split(".")):
            holder = getattr(holder, part)
        return holder

    def apply(self) -> None:
        if self.key in _APPLIED:
            return  # idempotent: vLLM loads plugins several times per process
        holder = self._holder()
        if not hasattr(holder, self.attr):
            raise RuntimeError(
                f"vllm-ptd patch target {self.module}.{self.key[1]} does not exist in the "
                "installed vLLM: the plugin does not match this vLLM version."
            )
        current = getattr(holder, self.attr)
        if getattr(current, "_vllm_ptd_patch", False):
            raise RuntimeError(f"{self.module}.{self.key[1]} is already patched by vllm-ptd")
        self.original = current
        replacement = self.make(current)
        try:
            replacement._vllm_ptd_patch = True
        except (AttributeError, TypeError):
            pass
        setattr(holder, self.attr, replacement)
        _APPLIED[self.key] = self

    def revert(self) -> None:
        """Put vLLM's own attribute back (used when a later patch of the set fails)."""
        if _APPLIED.get(self.key) is not self:
            return
        setattr(self._holder(), self.attr, self.original)
        del _APPLIED[self.key]


def applied_patches() -> list[Patch]:
    return list(_APPLIED.values())


def apply_together(patches: list[Patch]) -> None:
    """Apply every patch or none: on a failure the ones applied so far are reverted."""
    done: list[Patch] = []
    try:
        for patch in patches:
            if patch.key not in _APPLIED:
                patch.apply()
                done.append(patch)
    except BaseException:
        for patch in reversed(done):
            patch.revert()
        raise
