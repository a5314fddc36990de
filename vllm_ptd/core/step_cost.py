"""The step time model of the load-adaptive budget (core/budget.py), fitted online to
measured step periods.

One model for every draft shape: with draft_shape "tree" or "chain" every drafting request has
that shape and the tree terms below stay 0 (no sample carries them); with "auto" they tell a
tree request from a chain request, so that the policy can weigh one shape against the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepCostModel:
    """Step time (s) as

        a + c * drafting + b * tokens + d * trees + e * tree_rows

    fitted online by least squares with exponential forgetting. `drafting` counts the
    requests with draft rows, `trees` those of them whose rows needed tree attention (a
    masked block) and `tree_rows` those trees' rows besides x.

    c is the fixed price of each request with draft rows in a step (verification, the
    sampler's draft path and PTD's bookkeeping; with a fixed tree shape also its own
    tree-attention call in every layer), which a plain line through drafting steps would
    smear over every row and misplace the cost of no drafts. Per request, not per step: one
    price per step makes 4 requests' trees look 18% cheaper than they are, and the budget then
    drafts at 0.85x plain speed (GSM8K, 4 requests at once).

    d and e (draft_shape "auto"): what tree attention adds to a chain request, per request and
    per row (on the AMX CPU a tree step's forward takes ~1.8x a chain step's, 38 against 21 ms,
    mostly the masked attention call in every layer; on a GPU at small batch close to
    nothing). They are pulled toward 0: until trees are measured a tree costs what a chain of
    as many rows does, so the policy tries trees wherever they promise more accepted tokens,
    and the first trees measured correct it. The pull is weak, a quarter of one tree step:
    where chains win, trees run only when explored, one step in 33 to 129, and with the
    forgetting of ~200 steps only about two explored tree steps weigh at any time (with a
    prior of one step d read ~55% of the true excess in simulation, with a quarter ~85%).
    e's prior (225 rows^2) reads a tree step's excess as a per-tree price (about 80% of it
    for 15-row trees) until trees of several sizes separate the two: the masked attention
    costs per call far more than per row.
    """

    decay: float = 0.995
    slope_prior: float = 0.01        # prior b as a fraction of the mean step time
    prior_strength: float = 300.0    # ridge weight on b toward that prior (token^2 units)
    jump_strength: float = 4.0       # ridge weight on c toward 0 (in samples)
    tree_strength: float = 0.25      # ridge weight on d toward 0 (in tree request-steps)
    tree_row_strength: float = 225.0   # ridge weight on e toward 0 (tree row^2 units)
    samples: int = 0
    tree_samples: int = 0            # samples with at least one tree
    fastest: float = float("inf")
    fastest_tokens: int = 1          # the tokens of that fastest step
    _xtx: np.ndarray = field(default_factory=lambda: np.zeros((5, 5)))
    _xty: np.ndarray = field(default_factory=lambda: np.zeros(5))
    # (a, c, d, b, e), in the features' order, since the last sample
    _fit: tuple[float, ...] | None = None

    def observe(self, tokens: int, seconds: float, drafting: int = 1, trees: int = 0,
                tree_rows: int = 0) -> None:
        """A step of `tokens` scheduled tokens; `drafting` of its requests had draft rows,
        `trees` of those a tree with `tree_rows` rows in all (besides their x)."""
        if seconds < self.fastest:
            self.fastest, self.fastest_tokens = seconds, max(1, tokens)
        x = np.array([1.0, float(drafting), float(trees), float(tokens), float(tree_rows)])
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + seconds * x
        self.samples += 1
        self.tree_samples += int(trees > 0)
        self._fit = None

    def coefficients(self) -> tuple[float, float, float]:
        """(a, b, c): the step, and what a drafting request costs (a chain request; with a
        fixed tree shape a tree request) per request and per token; zeros before any
        sample. Solved once per sample: every step reads them two or three times."""
        a, c, _, b, _ = self._coefficients()
        return a, b, c

    def tree_extras(self) -> tuple[float, float]:
        """(d, e): what a tree request adds to a chain request's price, per request and per
        row."""
        _, _, d, _, e = self._coefficients()
        return d, e

    def predict(self, tokens: float, drafting: int = 1, trees: int = 0,
                tree_rows: float = 0.0) -> float:
        a, c, d, b, e = self._coefficients()
        return a + c * drafting + b * tokens + d * trees + e * tree_rows

    def is_outlier(self, tokens: int, seconds: float) -> bool:
        """An interval far beyond any step of its size (an idle gap the proposer did not
        see, a stall). Such a sample among the first few can set the slope 50x too high and
        stop drafting. The bound grows with the step's tokens: where every row costs a
        sizeable part of a step (bf16 on a CPU without bf16 GEMMs: ~30% a row), a step with
        a long chain takes 4-6x the fastest one-token step and is a sample like any other,
        not an outlier; dropping those left the model blind to what long chains cost."""
        size = max(1.0, tokens / self.fastest_tokens)
        if seconds > 4.0 * self.fastest * size + 0.05:
            return True
        return self.samples >= 5 and seconds > 4.0 * self.predict(tokens) + 0.05

    def _coefficients(self) -> tuple[float, ...]:
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, ...]:
        weight = self._xtx[0, 0]
        if weight == 0.0:
            return (0.0,) * 5
        means = self._xtx[0] / weight
        # Centre every feature, so that the ridge on a slope does not pull the intercept.
        centre = np.eye(5)
        centre[1:, 0] = -means[1:]
        xtx = centre @ self._xtx @ centre.T
        xty = centre @ self._xty
        ridge = np.diag([1e-9, self.jump_strength, self.tree_strength, self.prior_strength,
                         self.tree_row_strength])
        target = np.array([0.0, 0.0, 0.0, self.slope_prior * self._xty[0] / weight, 0.0])
        fit = np.linalg.solve(xtx + ridge, xty + ridge @ target)
        slopes = np.maximum(fit[1:], 0.0)
        # back from the centred intercept: y = fit[0] + slopes . (x - means)
        a = max(float(fit[0] - slopes @ means[1:]), 0.0)
        return (a, *map(float, slopes))
