"""Every copy between host and device on PTD's per-step path, in one place and counted.

A PTD step on a GPU must not stall on the host once per request: what the host prepares
(tree positions, masks, the sampler output rows, KV compaction pairs) goes up in one upload
each, from pinned staging buffers without blocking; what the host needs back (the rows'
argmax) comes down in one read after sampling. Slots and sample counts the host already
knows (block table, draft counts) are computed there, not read back.

Staging buffers are reused step after step, one per kind of upload: an upload's buffer is
rewritten only in a later step, after that step's read has waited for the device's queue
(a read is a synchronising copy), so a non-blocking copy never sees its source change.

On the CPU every call is a plain view or copy, and is counted all the same, so that the
number of transfers per step is tested where the engine runs (tests/test_step_transfers.py).
Sampled requests whose rows need vLLM's sampler read one drawn token per visited row
(tree_sampling.py); greedy steps need none of that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class TransferCounts:
    uploads: int = 0
    reads: int = 0
    steps: int = 0
    max_uploads_per_step: int = 0
    max_reads_per_step: int = 0


class StepTransfers:
    def __init__(self, device: torch.device | str, pin_memory: bool | None = None) -> None:
        self.device = torch.device(device)
        if pin_memory is None:
            pin_memory = self.device.type == "cuda" and torch.cuda.is_available()
        self.pin_memory = pin_memory
        self.counts = TransferCounts()
        self._step_uploads = 0
        self._step_reads = 0
        self._staging: dict[str, torch.Tensor] = {}
        self._scratch: dict[str, torch.Tensor] = {}

    def start_step(self) -> None:
        """Close the previous step's tally (called as each step's inputs are prepared)."""
        c = self.counts
        if self._step_uploads or self._step_reads:
            c.steps += 1
            c.max_uploads_per_step = max(c.max_uploads_per_step, self._step_uploads)
            c.max_reads_per_step = max(c.max_reads_per_step, self._step_reads)
        self._step_uploads = self._step_reads = 0

    def upload(self, kind: str, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """`array` on the device as `dtype`, through the staging buffer of `kind`."""
        self.counts.uploads += 1
        self._step_uploads += 1
        host = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
        if self.device.type == "cpu":
            return host
        if not self.pin_memory:
            return host.to(self.device)
        staging = self._staging.get(kind)
        if staging is None or staging.numel() < host.numel() or staging.dtype != dtype:
            staging = torch.empty(max(host.numel(), 1024), dtype=dtype, pin_memory=True)
            self._staging[kind] = staging
        view = staging[: host.numel()].view(host.shape)
        view.copy_(host)
        return view.to(self.device, non_blocking=True)

    def scratch(self, kind: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host buffer of `shape` for work on the host side of a step (kind: what it is
        for), reused step after step: a fresh buffer of tens of MB every step costs its
        first touch each time. Not a transfer."""
        numel = int(np.prod(shape))
        buffer = self._scratch.get(kind)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype:
            buffer = torch.empty(numel, dtype=dtype)
            self._scratch[kind] = buffer
        return buffer[:numel].view(shape)

    def read(self, tensor: torch.Tensor) -> np.ndarray:
        """The tensor's values on the host (waits for the device)."""
        self.counts.reads += 1
        self._step_reads += 1
        return tensor.detach().cpu().numpy()
