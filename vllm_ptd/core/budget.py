"""Load-adaptive node budget: how many tree rows each drafting request gets in the next step.

The policy picks, for the whole batch, one tree size n per drafting request from a small
grid (none, and a quarter, half, three quarters or all of max_nodes), whichever maximises
the batch's expected committed tokens per second:

    rate(n) = (R + D * G * s(n)) / step_time(R + D * n)

R requests are in the batch (each commits one token without drafts), D of them may draft.

- `step_time` is `StepCostModel`: a + c * trees + b * N, fitted online to measured
  step periods against the tokens each step scheduled (tree sizes, batch sizes and the
  exploration below give it the spread it needs; ridge priors keep it sane until then;
  idle gaps and steps with prompt tokens are not samples). On a GPU at small batch b is
  close to 0 and the full tree pays; on a CPU rows cost, the more so without matrix units
  (on an AVX-512 CPU without AMX one row of the embedded model costs ~4% of a plain step,
  on one with AMX ~1-2%), and with a large batch the tree stops paying altogether.
- `G * s(n)` is `GainModel`: accepted tokens per request-step with n rows; s is a saturating
  curve with s(max_nodes) = 1 and tau = max_nodes / 3 (measured on first turns with the
  15-node CPU default: 3 rows kept 40-60% of the full tree's gain, 5 rows 50-70%, 8 rows
  75-80%; the curve says 47%, 67%, 84%). G is measured on the running workload from
  every step with at least the grid's smallest size, each normalised by s(rows), from
  requests past their first 16 drafted steps, and never taken below a floor.
- Exploration: every 8th step runs half the chosen size and every 32nd none, so that the
  cost model sees other step sizes and steps without trees under a steady load (otherwise
  its slope is the prior's and its jump unknown). When one choice beats none by 25% or
  more, 4x less often: exploring cost 9-14% of batch-1 speed on a CPU, and an error that
  large in the model is unlikely.

Why a coarse grid and C's proportional share: T's rows are never accepted in their own
step; they pay later, through the pool they fill. A tree whose size drifts row by row, or
whose T is squeezed out by C, starves T, the gain measured under it falls and the budget
spirals down (seen with every size from 0 to max_nodes allowed and C filling first: batch 1
settled near 5 rows and 1.1 tokens per step). The proposer gives C the same share of any
size as of max_nodes, so T keeps growing at every grid size, and the floor on G keeps
drafting alive: G can only be measured while drafting, so an estimate that stops drafting
would never be revised.

Chains (config draft_shape 1, the CPU default): the policy instead picks a cap L on the
chain's length, 0..max_nodes, from `ChainGainModel`, the measured acceptance at each chain
position and how often chains reach it: rate(L) = (R + D * tokens(L)) / step_time(R + D *
rows(L)), with no per-tree price (a chain attends through the backend's causal kernel). A
row is kept while its acceptance pays for its cost; exploration and the 15% margin as above.

Engine independent: the vLLM proposer feeds it step timings, token counts and acceptances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def budget_sizes(max_nodes: int) -> list[int]:
    """The sizes the policy chooses from: none, and about a quarter, half, three quarters
    and all of max_nodes (ascending, distinct)."""
    sizes = {0, max_nodes}
    sizes.update(max(1, round(max_nodes * f)) for f in (0.25, 0.5, 0.75) if max_nodes > 0)
    return sorted(sizes)


@dataclass
class StepCostModel:
    """Step time (s) as a + c * trees + b * tokens, fitted online by least squares with
    exponential forgetting. c is the fixed price of each request's tree in a step (its own
    tree-attention call and glue in every layer, PTD's bookkeeping), which a plain line
    through tree steps would smear over every row and misplace the cost of no drafts. Per
    tree, not per step: with one price per step, 4 requests' trees looked 18% cheaper than
    they were and the budget drafted at 0.85x plain speed (GSM8K, 4 requests at once)."""

    decay: float = 0.995             # weight of a sample after each newer one
    slope_prior: float = 0.01        # prior b as a fraction of the mean step time
    prior_strength: float = 300.0    # ridge weight on b toward that prior (token^2 units)
    jump_strength: float = 4.0       # ridge weight on c toward 0 (in samples)
    samples: int = 0
    fastest: float = float("inf")    # shortest step seen (s): the outlier guard's yardstick
    _xtx: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))
    _xty: np.ndarray = field(default_factory=lambda: np.zeros(3))

    def observe(self, tokens: int, seconds: float, trees: int = 1) -> None:
        """A step of `tokens` scheduled tokens, `trees` of its requests with tree rows."""
        self.fastest = min(self.fastest, seconds)
        x = np.array([1.0, float(trees), float(tokens)])
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + seconds * x
        self.samples += 1

    def coefficients(self) -> tuple[float, float, float]:
        """(a, b, c); zeros before any sample."""
        weight = self._xtx[0, 0]
        if weight == 0.0:
            return 0.0, 0.0, 0.0
        mean_n, mean_y = self._xtx[0, 2] / weight, self._xty[0] / weight
        # Centre the token column so that the ridge on b does not pull the intercept.
        centre = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-mean_n, 0.0, 1.0]])
        xtx = centre @ self._xtx @ centre.T
        xty = centre @ self._xty
        ridge = np.diag([1e-9, self.jump_strength, self.prior_strength])
        target = np.array([0.0, 0.0, self.slope_prior * mean_y])
        a_c, c, b = np.linalg.solve(xtx + ridge, xty + ridge @ target)
        b = max(float(b), 0.0)
        # back from the centred intercept: y = a_c + c*t + b*(n - mean_n)
        a = max(float(a_c) - b * mean_n, 0.0)
        return a, b, max(float(c), 0.0)

    def predict(self, tokens: float, trees: int = 1) -> float:
        a, b, c = self.coefficients()
        return a + c * trees + b * tokens

    def is_outlier(self, tokens: int, seconds: float) -> bool:
        """An interval far beyond any step: the engine sat idle between two steps (one such
        sample among the first few once set the slope 50x too high and stopped drafting)."""
        if seconds > 4.0 * self.fastest + 0.05:
            return True
        return self.samples >= 5 and seconds > 4.0 * self.predict(tokens) + 0.05


@dataclass
class GainModel:
    """Accepted tokens per request-step with n rows: G * s(n) (see the module docstring)."""

    max_nodes: int
    decay: float = 0.99        # per learning request-step
    prior_gain: float = 1.0    # G before measurements
    prior_steps: float = 10.0  # its weight in request-steps
    mature_steps: int = 16     # a request's first steps are not learned from
    floor: float = 0.6         # G used is never below this (see `full_gain`)
    _sum: float = field(init=False)
    _weight: float = field(init=False)
    min_rows: int = field(init=False)   # smallest tree learned from: the grid's least size

    def __post_init__(self) -> None:
        self._sum = self.prior_gain * self.prior_steps
        self._weight = self.prior_steps
        self.min_rows = budget_sizes(self.max_nodes)[1] if self.max_nodes > 0 else 1

    def shape(self, n: np.ndarray | int) -> np.ndarray:
        """s(n), 0 at n = 0 and 1 at max_nodes (tau = max_nodes / 3)."""
        tau = max(self.max_nodes, 1) / 3.0
        return (1.0 - np.exp(-np.asarray(n, dtype=np.float64) / tau)) / (1.0 - math.exp(-3.0))

    def record(self, rows: int, accepted: int, request_steps: int | None = None) -> None:
        """One request-step that ran `rows` rows besides x and accepted `accepted` tokens,
        the request's `request_steps`-th drafted step (None: mature)."""
        if rows < self.min_rows:
            return   # a tree cut short (e.g. by max_model_len) says little about G
        if request_steps is not None and request_steps < self.mature_steps:
            return   # the pool and T of a young request are still filling
        self._sum = self.decay * self._sum + accepted / float(self.shape(rows))
        self._weight = self.decay * self._weight + 1.0

    @property
    def measured_gain(self) -> float:
        return self._sum / self._weight

    @property
    def full_gain(self) -> float:
        """G: accepted tokens per request-step at the full budget, as measured but never
        below `floor`. A measured G can only come from drafted steps, and a budget cut to
        zero stops T and the pool from growing, so a low estimate would never be revised
        (seen at batch 1: G fell to 0.45 on young requests and drafting stopped for good).
        At the floor, trees still pay at batch 1 on this CPU and stop paying from a few
        requests per step on."""
        return max(self.measured_gain, self.floor)


@dataclass
class ChainGainModel:
    """Chains (config draft_shape 1): per chain position k, how often a request-step had a
    k-th row and how often its first k rows were all accepted. A chain runs as long as its
    sources offer, up to the cap, so a cap L costs the rows that really exist below it and
    gains the acceptance measured at each position: the policy cuts chains where the
    acceptance of one more row no longer pays for it (on first turns the fifth row of a
    chain was accepted in ~10% of steps, the eighth in ~5%)."""

    max_nodes: int
    decay: float = 0.995       # per learning request-step
    prior_steps: float = 10.0  # weight of the prior: every row exists, row k accepted 0.6^k
    mature_steps: int = 16     # a request's first steps are not learned from
    _steps: float = field(init=False)
    _exist: np.ndarray = field(init=False)   # decayed count of steps with a k-th row
    _hit: np.ndarray = field(init=False)     # ... whose first k rows were accepted

    def __post_init__(self) -> None:
        k = np.arange(1, self.max_nodes + 1)
        self._steps = self.prior_steps
        self._exist = np.full(self.max_nodes, self.prior_steps)
        self._hit = self.prior_steps * 0.6 ** k

    def record(self, rows: int, accepted: int, request_steps: int | None = None) -> None:
        if request_steps is not None and request_steps < self.mature_steps:
            return
        rows, accepted = min(rows, self.max_nodes), min(accepted, rows, self.max_nodes)
        self._steps = self.decay * self._steps + 1.0
        self._exist *= self.decay
        self._hit *= self.decay
        self._exist[:rows] += 1.0
        self._hit[:accepted] += 1.0

    def expected(self) -> tuple[np.ndarray, np.ndarray]:
        """(accepted tokens, rows) per request-step for each cap L = 0..max_nodes."""
        zero = np.zeros(1)
        tokens = np.concatenate([zero, np.cumsum(self._hit) / self._steps])
        rows = np.concatenate([zero, np.cumsum(self._exist) / self._steps])
        return tokens, rows

    @property
    def full_gain(self) -> float:
        """Accepted tokens per request-step with the whole budget (reported)."""
        return float(self.expected()[0][-1])


@dataclass
class BudgetPolicy:
    """Chooses one per-request row budget for the next step from the two models."""

    max_nodes: int
    chain: bool = False   # requests draft chains (config draft_shape 1), not trees
    cost: StepCostModel = field(default_factory=StepCostModel)
    gain: GainModel | ChainGainModel = field(init=False)
    # A tree must be predicted to beat no drafts by 15% to be used: a margin for what the
    # models miss (young requests accept less than G; rows of several trees cost more than
    # the line says). With 1% it drafted at 0.88-0.95x plain with 4 requests at once, where
    # it predicted gains of ~10% in the steps after some requests of the batch had ended.
    min_improvement: float = 1.15
    warmup_samples: int = 5         # full budget until the cost model has this many
    explore_every: int = 8          # every k-th choice runs half the budget (0: never)
    # When the chosen budget beats the other by this factor, exploring pays less (a model
    # error would have to be large to flip the choice) and costs the same: explore
    # `clear_explore_factor` times less often.
    clear_margin: float = 1.25
    clear_explore_factor: int = 4
    _choices: int = 0

    sizes: np.ndarray = field(init=False)   # budget_sizes(max_nodes), fixed per policy

    def __post_init__(self) -> None:
        if self.chain:
            self.gain = ChainGainModel(self.max_nodes)
            self.sizes = np.arange(self.max_nodes + 1)   # a chain may stop at any row
        else:
            self.gain = GainModel(self.max_nodes)
            self.sizes = np.array(budget_sizes(self.max_nodes))

    def choose(self, num_requests: int, num_drafting: int) -> int:
        """Rows per drafting request (0..max_nodes) maximising expected tokens per second."""
        if num_drafting <= 0 or self.max_nodes <= 0:
            return 0
        if self.cost.samples < self.warmup_samples:
            return self.max_nodes
        n = self.sizes
        a, b, c = self.cost.coefficients()
        if isinstance(self.gain, ChainGainModel):
            # Chains attend through the backend's causal kernel: no per-tree price c.
            gained, rows = self.gain.expected()
            tokens = num_requests + num_drafting * gained
            seconds = a + b * (num_requests + num_drafting * rows)
        else:
            tokens = num_requests + num_drafting * self.gain.full_gain * self.gain.shape(n)
            seconds = a + c * num_drafting * (n > 0) + b * (num_requests + num_drafting * n)
        rate = tokens / np.maximum(seconds, 1e-9)
        best = int(n[int(np.argmax(rate))])
        if rate.max() <= self.min_improvement * rate[0]:
            return 0
        self._choices += 1
        every = self.explore_every
        if rate.max() >= self.clear_margin * rate[0]:
            every *= self.clear_explore_factor
        if every and self._choices % every == 0:
            # Alternate half the budget and none: the model needs other batch sizes and
            # steps without trees to place its slope and its jump.
            return 0 if self._choices % (4 * every) == 0 else best // 2
        return best
