"""PTD step counters and the paper's metrics, under the paper's names (DE, HR, AL)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class PTDStats:
    """Counters over decoding steps (one target forward pass each; prefill not counted)."""

    steps: int = 0
    tokens: int = 0  # committed tokens, bonus included
    hits: int = 0  # steps whose C was non-empty
    accepted_on_hits: int = 0  # accepted C tokens summed over hit steps
    candidate_nodes: int = 0  # C rows fed, summed over steps
    draft_nodes: int = 0  # T rows fed, summed over steps

    def record(
        self, num_candidates: int, num_draft: int, num_accepted: int, num_tokens: int
    ) -> None:
        self.steps += 1
        self.tokens += num_tokens
        self.candidate_nodes += num_candidates
        self.draft_nodes += num_draft
        if num_candidates > 0:
            self.hits += 1
            self.accepted_on_hits += num_accepted

    def merge(self, other: PTDStats) -> PTDStats:
        return PTDStats(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    @property
    def DE(self) -> float:
        """Decoding efficiency: generated tokens / target forward passes."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def HR(self) -> float:
        """Hit rate: steps with a non-empty C / steps."""
        return self.hits / self.steps if self.steps else 0.0

    @property
    def AL(self) -> float:
        """Accept length per hit: 1 + mean accepted C tokens on hit steps."""
        return 1.0 + self.accepted_on_hits / self.hits if self.hits else 0.0

    @property
    def C_per_step(self) -> float:
        return self.candidate_nodes / self.steps if self.steps else 0.0

    @property
    def T_per_step(self) -> float:
        return self.draft_nodes / self.steps if self.steps else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "DE": self.DE,
            "HR": self.HR,
            "AL": self.AL,
            "C_nodes_per_step": self.C_per_step,
            "T_nodes_per_step": self.T_per_step,
            "steps": self.steps,
            "tokens": self.tokens,
        }
