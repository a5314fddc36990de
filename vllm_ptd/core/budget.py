"""Load-adaptive node budget: how many tree rows each drafting request gets in the next step.

The policy picks, for the whole batch, one tree size n per drafting request from a small
grid (none, and a quarter, half, three quarters or all of max_nodes), whichever maximises
the batch's expected committed tokens per second:

    rate(n) = (R + D * G * s(n)) / step_time(R + D * n)

R requests are in the batch (each commits one token without drafts), D of them may draft.

- `step_time` is `StepCostModel` (core/step_cost.py): a + c * drafting + b * N, fitted
  online to measured step periods against the tokens each step scheduled (tree sizes,
  batch sizes and the exploration below give it the spread it needs; ridge priors keep it
  sane until then; idle gaps and steps with prompt tokens are not samples). On a GPU at small batch b is
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
  more, 4x less often: exploring costs 9-14% of batch-1 speed on a CPU, and an error that
  large in the model is unlikely.

Why a coarse grid and C's proportional share: T's rows are never accepted in their own
step; they pay later, through the pool they fill. A tree whose size drifts row by row, or
whose T is squeezed out by C, starves T, the gain measured under it falls and the budget
spirals down (with every size from 0 to max_nodes allowed and C filling first, batch 1
settles near 5 rows and 1.1 tokens per step). The proposer gives C the same share of any
size as of max_nodes, so T keeps growing at every grid size, and the floor on G keeps
drafting alive: G can only be measured while drafting, so an estimate that stops drafting
would never be revised.

Chains (config draft_shape "chain", and auto's chain steps): each request's chain is cut on its own,
row by row, from what its evidence predicts. `RowAcceptanceModel` learns, per evidence class of a
row (core/chain.py: pool or context, how many matched occurrences agree, n-gram length,
depth), how often such a row is accepted after the rows before it were; a chain's k-th row
is then all-accepted with P_k = p_1 ... p_k. A row is kept while P_k exceeds its price, b *
rate tokens (rate: the batch's expected tokens per second at its usual chains), and the
chain is run only when its rows' surplus also pays c * rate, the fixed price of a drafting
request; both with the 15% margin. This is the marginal condition of maximising (R + sum
of accepted) / step_time over every request's rows at once, so it shrinks drafts as the batch
grows (rate * b and rate * c grow with it) without a grid or exploration: chains of every
length and steps without any happen on their own. Rows a chain offered but did not run are
checked against the tokens the request commits next (core/shadow.py) and teach the row model
too, so declined classes keep being revised. Unsure chains (a pool guess, a single
earlier occurrence after a 2-gram) are cut short or skipped where a suffix-tree drafter
would also stop, sure ones (several occurrences agree) run long.

One policy for the draft's shape (config draft_shape "auto"): per step, for the whole batch
but one explored request (below), chains or trees, and then their budget as above.
`StepCostModel`'s tree terms price a tree request apart from a chain request (what tree attention adds, per request and per row); the trees' value
is G * s(n), learned from tree steps only, the chains' the accepted tokens per drafting
request at their current prices (ChainUsage), learned from chain steps only. Trees run when
their best size beats the chains' expected tokens per second and no drafts by the margin;
chains otherwise (they cut themselves down to no drafts where rows do not pay). So trees run
where rows are cheap and trees accept more (a GPU at small batch) and chains where a tree
step costs ~1.8x a chain step (the AMX CPU), without a platform switch. Each shape is learned
only from its own request-steps, so the one not chosen runs on one drafting request of a step
(`explore`) after `shape_explore_after` (32) steps without it, 4x later when the other wins by
25%. One request, not the batch: it measures the shape as well, one request pays for it,
and the other requests' rows keep vLLM's kernel (in bf16 a tree's rows, attending through
PTD's, round differently). T grows only on tree steps (core/request_state.py).

Engine independent: the vLLM proposer feeds it step timings, token counts and acceptances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vllm_ptd.config import CHAIN, TREE
from vllm_ptd.core.chain import CLASSES_PER_SOURCE, NUM_CLASSES
from vllm_ptd.core.step_cost import StepCostModel


def budget_sizes(max_nodes: int) -> list[int]:
    """The sizes the policy chooses from: none, and about a quarter, half, three quarters
    and all of max_nodes (ascending, distinct)."""
    sizes = {0, max_nodes}
    sizes.update(max(1, round(max_nodes * f)) for f in (0.25, 0.5, 0.75) if max_nodes > 0)
    return sorted(sizes)


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
        (at batch 1 young requests measure G near 0.45, which would stop drafting for good).
        At the floor, trees still pay at batch 1 on this CPU and stop paying from a few
        requests per step on."""
        return max(self.measured_gain, self.floor)


@dataclass
class RowAcceptanceModel:
    """Chains (config draft_shape "chain"): for each evidence class of a row (core/chain.py), how
    often such a row was accepted when every row before it in its chain was. A chain's
    rows then have predicted acceptances P_k = p_1 * ... * p_k (the chance that its first k
    rows are all accepted), which the policy weighs against their cost. Each class forgets
    by `decay` per observation of that class, so rare classes keep what they learned.

    A class's prior is not a constant but the measured rate of its evidence shape: rows of
    the same match length and depth from any source (class % CLASSES_PER_SOURCE). So a
    class met for the first time, such as a repeated prompt's long match in the shared
    outputs when earlier long matches all came from the requests' own contexts, starts at
    what long matches do. Under load every request of a busy batch meets such a class in
    the same steps, before any of its rows is verified; at a flat 0.5 per row its chains
    stopped after two rows (P_k below a busy batch's row price) and a 64-token answer spent
    most of its steps learning the class. `prior` is the shapes' own prior."""

    num_classes: int
    prior: float = 0.5          # p of a shape before any of its rows is observed
    prior_weight: float = 2.0   # the prior's weight, in observations
    decay: float = 0.998
    # A class seen fewer times than this (prior included) is probed: see `needs_probe`.
    probe_below: float = 8.0
    # Python lists, not arrays: every request's chain reads a few entries every step, and
    # numpy's per-call overhead on 1-16 elements was most of the chain's pricing time.
    _hit: list[float] = field(init=False)
    _seen: list[float] = field(init=False)
    _shape_hit: list[float] = field(init=False)    # per evidence shape, all sources
    _shape_seen: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self._hit = [0.0] * self.num_classes
        self._seen = [0.0] * self.num_classes
        shapes = min(self.num_classes, CLASSES_PER_SOURCE)
        self._shape_hit = [self.prior * self.prior_weight] * shapes
        self._shape_seen = [self.prior_weight] * shapes

    def _rate(self, cls: int) -> float:
        shape = cls % CLASSES_PER_SOURCE
        w = self.prior_weight
        prior = self._shape_hit[shape] / self._shape_seen[shape]
        return (self._hit[cls] + w * prior) / (self._seen[cls] + w)

    def rates(self, classes) -> np.ndarray:
        """p of each class (acceptance given the rows before were accepted)."""
        return np.array([self._rate(c) for c in classes], dtype=np.float64)

    def leading_surplus(self, classes, row_price: float) -> tuple[int, float]:
        """(keep, surplus): how many leading rows have P_k above `row_price` (P_k only
        falls with k) and the sum of their P_k - row_price."""
        hit, seen, shape_hit, shape_seen = self._hit, self._seen, self._shape_hit, self._shape_seen
        w = self.prior_weight
        p, keep, surplus = 1.0, 0, 0.0
        for cls in classes:   # _rate, inlined: every request's chain, every step
            shape = cls % CLASSES_PER_SOURCE
            p *= (hit[cls] + w * shape_hit[shape] / shape_seen[shape]) / (seen[cls] + w)
            if p <= row_price:
                break
            keep += 1
            surplus += p - row_price
        return keep, surplus

    def needs_probe(self, cls: int) -> bool:
        """Whether a row of this class should run one past a chain's cut: a class only
        learns from rows that run, so under a high row price (a busy batch) a class the
        prior or one early rejection priced out would never run again and keep its
        estimate for good (a repeated answer's deeper rows stuck at 0.33-0.5 while their
        true rate is ~0.97, cutting its chains to 2 rows at 16 requests at once)."""
        return self._seen[cls] + self.prior_weight < self.probe_below

    def record(self, classes, accepted: int) -> None:
        """One verified chain: its first `accepted` rows were accepted; the row after them
        (if any) was reached and rejected; rows past it say nothing."""
        d = self.decay
        for k, cls in enumerate(list(classes)[: accepted + 1]):
            hit = float(k < accepted)
            shape = cls % CLASSES_PER_SOURCE
            self._hit[cls] = d * self._hit[cls] + hit
            self._seen[cls] = d * self._seen[cls] + 1.0
            self._shape_hit[shape] = d * self._shape_hit[shape] + hit
            self._shape_seen[shape] = d * self._shape_seen[shape] + 1.0


@dataclass
class ChainUsage:
    """Running means over drafting request-steps of chains (those that ran no rows
    included): accepted tokens, the share that ran rows, rows. They predict the batch's
    tokens per second, the yardstick a row's or a chain's price is measured against."""

    decay: float = 0.99
    accepted: float = 1.0   # priors: about what a first chain of a request achieves
    drafted: float = 1.0
    rows: float = 4.0

    def record(self, rows: int, accepted: int) -> None:
        d = self.decay
        self.accepted = d * self.accepted + (1 - d) * accepted
        self.drafted = d * self.drafted + (1 - d) * float(rows > 0)
        self.rows = d * self.rows + (1 - d) * rows


@dataclass
class BudgetPolicy:
    """Chooses the next step's per-request row budget (and with draft_shape "auto" its
    shape) from the models above."""

    max_nodes: int
    chain: bool = False   # requests draft chains (config draft_shape "chain"), not trees
    auto: bool = False    # each step's shape is chosen too (config draft_shape "auto")
    cost: StepCostModel = field(default_factory=StepCostModel)
    gain: GainModel = field(init=False)   # trees only
    # A tree must be predicted to beat no drafts by 15% to be used: a margin for what the
    # models miss (young requests accept less than G; rows of several trees cost more than
    # the line says). A 1% margin drafts at 0.88-0.95x plain with 4 requests at once: the
    # models predict gains of ~10% in the steps after some requests of the batch end.
    min_improvement: float = 1.15
    warmup_samples: int = 5         # full budget until the cost model has this many
    explore_every: int = 8          # every k-th choice runs half the budget (0: never)
    # When the chosen budget beats the other by this factor, exploring pays less (a model
    # error would have to be large to flip the choice) and costs the same: explore
    # `clear_explore_factor` times less often.
    clear_margin: float = 1.25
    clear_explore_factor: int = 4
    # Chains: after this many batch steps in a row without any chain, the next chain asked
    # for runs whole (one request's, one step), or as many of its rows as cost one plain
    # step where rows are dear (`_explore_rows`). Prices that drafting never pays are never
    # revised otherwise (a class no row of which runs keeps its prior; steps without drafts
    # do not inform the cost of drafting), and a noisy spell can leave a busy engine
    # declining even a repeated answer's near-certain rows for good.
    chain_explore_after: int = 32
    # Auto: after this many drafting steps without one shape, one step runs it (its value
    # and its cost are learned only from its own steps); `clear_explore_factor` times later
    # when the other shape wins by `clear_margin` (0: never).
    shape_explore_after: int = 32
    _timed_first: bool = False
    _choices: int = 0
    _batches_without_chain: int = 0
    _explore_chain: bool = False
    _warmup_choices: int = 0
    _steps_without: dict[str, int] = field(default_factory=lambda: {TREE: 0, CHAIN: 0})
    # Auto: the shape not preferred, and its rows, for one drafting request of this step
    # (None: every request drafts `step_shape`). The proposer hands it to the first request
    # that drafts and clears it. One request is enough to measure the shape, and only its
    # rows pay for it: batch-wide, a tree step sent every drafting request's rows through
    # PTD's attention instead of vLLM's kernel (in bf16 they round differently).
    explore: tuple[str, int] | None = None

    sizes: np.ndarray = field(init=False)   # budget_sizes(max_nodes), fixed per policy
    step_shape: str = field(init=False)     # TREE or CHAIN: what the next step drafts
    # Chains only: what one row and one chain cost this step, in tokens (set by choose()).
    row_price: float = 0.0
    chain_price: float = 0.0
    rows_model: RowAcceptanceModel = field(
        default_factory=lambda: RowAcceptanceModel(NUM_CLASSES))
    usage: ChainUsage = field(default_factory=ChainUsage)

    def __post_init__(self) -> None:
        self.gain = GainModel(self.max_nodes)
        self.sizes = np.array(budget_sizes(self.max_nodes))
        self.step_shape = CHAIN if self.chain else TREE

    def choose(self, num_requests: int, num_drafting: int) -> int:
        """Rows per drafting request (0..max_nodes) maximising expected tokens per second,
        and `step_shape`. Chains: max_nodes, and the prices `chain_length` cuts each chain
        by. Auto: the shape first (`_choose_shape`)."""
        self.explore = None
        if num_drafting <= 0 or self.max_nodes <= 0:
            return 0
        if self.auto:
            return self._choose_shape(num_requests, num_drafting)
        if self.chain:
            return self._choose_chain(num_requests, num_drafting)
        return self._choose_tree(num_requests, num_drafting)

    def time_step(self, tokens: int, seconds: float, drafting: int, trees: int = 0,
                  tree_rows: int = 0) -> None:
        """One measured step period (see `StepCostModel.observe` for the counts); idle
        gaps are not samples. Only auto tells trees apart: with a fixed shape every drafting
        request is priced by c and b alone."""
        if not self._timed_first:
            # The engine's first timed step pays one-off costs (allocations, first calls).
            self._timed_first = True
            return
        if self.cost.is_outlier(tokens, seconds):
            return
        if not self.auto:
            trees = tree_rows = 0
        self.cost.observe(tokens, seconds, drafting, trees, tree_rows)

    # -- trees -------------------------------------------------------------------------
    def _choose_tree(self, num_requests: int, num_drafting: int) -> int:
        self.step_shape = TREE
        if self.cost.samples < self.warmup_samples:
            return self.max_nodes
        return self._pick_tree(self._tree_rates(num_requests, num_drafting))

    def _tree_rates(self, num_requests: int, num_drafting: int) -> np.ndarray:
        """Expected tokens per second with trees of each grid size (the first: none)."""
        n = self.sizes
        a, b, c = self.cost.coefficients()
        d, e = self.cost.tree_extras()
        tokens = num_requests + num_drafting * self.gain.full_gain * self.gain.shape(n)
        seconds = (a + (c + d) * num_drafting * (n > 0) + b * (num_requests + num_drafting * n)
                   + e * num_drafting * n)
        return tokens / np.maximum(seconds, 1e-9)

    def _pick_tree(self, rate: np.ndarray) -> int:
        """The best size by `rate`, none without the margin, or an exploring size."""
        best = int(self.sizes[int(np.argmax(rate))])
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

    def record_tree(self, rows: int, accepted: int, request_steps: int) -> None:
        """A tree step of a request (its `request_steps`-th step) that ran `rows` rows and
        accepted `accepted`. Auto learns from every tree step, young requests' included:
        the chains it is weighed against are measured over every step too."""
        self.gain.record(rows, accepted, None if self.auto else request_steps)

    # -- auto: the shape ---------------------------------------------------------------
    def _choose_shape(self, num_requests: int, num_drafting: int) -> int:
        """The step's shape, then its budget as that shape's mode would choose it. Trees
        win when their best size beats both the chains (at their current prices) and no
        drafts by the margin; chains otherwise, since they cut themselves down to no
        drafts where rows do not pay."""
        if self.cost.samples < self.warmup_samples:
            # Both shapes in turn, each at its warm-up budget: each is priced by its own steps.
            self._warmup_choices += 1
            if self._warmup_choices % 2:
                return self._choose_tree(num_requests, num_drafting)
            return self._choose_chain(num_requests, num_drafting)
        trees = self._tree_rates(num_requests, num_drafting)
        best = 1 + int(np.argmax(trees[1:]))
        chains = self._chain_rate(num_requests, num_drafting)
        wins = trees[best] > max(chains, self.min_improvement * trees[0])
        prefer = TREE if wins else CHAIN
        ratio = trees[best] / chains if wins else chains / trees[best]
        if self._explore_other_shape(prefer, ratio):
            if prefer == TREE:
                self._set_chain_prices(num_requests, num_drafting)
                self.explore = (CHAIN, self.max_nodes)
            else:
                self.explore = (TREE, int(self.sizes[best]))
        if prefer == CHAIN:
            return self._choose_chain(num_requests, num_drafting)
        self.step_shape = TREE
        return self._pick_tree(trees)

    def _explore_other_shape(self, prefer: str, ratio: float) -> bool:
        """True once the shape not preferred has not run for `shape_explore_after` steps
        (`clear_explore_factor` times as many when `prefer` wins by `ratio` >=
        `clear_margin`); it then runs on one drafting request of the step (`explore`)."""
        other = CHAIN if prefer == TREE else TREE
        wait = self.shape_explore_after
        if ratio >= self.clear_margin:
            wait *= self.clear_explore_factor
        self._steps_without[prefer] = 0
        self._steps_without[other] += 1
        due = wait > 0 and self._steps_without[other] > wait
        if due:
            self._steps_without[other] = 0
        return due

    # -- chains ------------------------------------------------------------------------
    def _choose_chain(self, num_requests: int, num_drafting: int) -> int:
        self.step_shape = CHAIN
        self._batches_without_chain += 1
        if self._batches_without_chain > self.chain_explore_after:
            self._explore_chain = True
            self._batches_without_chain = 0
        self._set_chain_prices(num_requests, num_drafting)
        return self.max_nodes

    def _chain_rate(self, num_requests: int, num_drafting: int) -> float:
        """Expected tokens per second with the batch's usual chains (ChainUsage)."""
        a, b, c = self.cost.coefficients()
        u = self.usage
        seconds = a + c * num_drafting * u.drafted + b * (num_requests + num_drafting * u.rows)
        return (num_requests + num_drafting * u.accepted) / max(seconds, 1e-9)

    def _set_chain_prices(self, num_requests: int, num_drafting: int) -> None:
        """A row is worth keeping when its predicted acceptance beats what its step time
        would commit elsewhere: b * rate tokens, rate the batch's expected tokens per second
        at its usual chains (ChainUsage); a chain must also pay c * rate, the fixed price of
        a drafting request (verification, sampler and drafting glue: ~1.8 ms, 13% of a
        plain step, on the AVX-512 CPU, against ~0.4 ms a row). Both carry the policy's
        margin. Before the cost model has samples every row is kept."""
        if self.cost.samples < self.warmup_samples:
            self.row_price = self.chain_price = 0.0
            return
        _, b, c = self.cost.coefficients()
        rate = self._chain_rate(num_requests, num_drafting)
        self.row_price = self.min_improvement * b * rate
        self.chain_price = self.min_improvement * c * rate

    def chain_plan(self, classes) -> tuple[int, float]:
        """(rows, value) for a chain with these evidence classes: how many leading rows to
        run (those whose predicted acceptance exceeds the row price, or none when together
        they do not also pay the chain's price) and what they are expected to gain beyond
        their price (tokens; 0 when not run), the yardstick between candidate chains."""
        keep, surplus = self.rows_model.leading_surplus(classes, self.row_price)
        value = surplus - self.chain_price
        if not keep or value <= 0:
            return 0, 0.0
        if keep < len(classes) and self.rows_model.needs_probe(classes[keep]):
            keep += 1   # learn the row after the cut; its value is not counted
        return keep, value

    def chain_length(self, classes) -> int:
        if self._explore_chain and len(classes):
            self._explore_chain = False
            return min(len(classes), self._explore_rows())
        return self.chain_plan(classes)[0]

    def _explore_rows(self) -> int:
        """Rows of an exploring chain: at most what one plain step costs, (a + b) / b rows.
        Where rows are cheap (~1-4% of a step) that is every row of any chain; where they
        are dear (bf16 through PyTorch's fallback GEMM on an AVX2 CPU: ~30% of a step) a
        whole 15-row chain cost ~4.5 plain steps every 33 steps, and a few rows measure the
        slope as well."""
        if self.cost.samples < self.warmup_samples:
            return self.max_nodes
        a, b, _ = self.cost.coefficients()
        if b <= 0:
            return self.max_nodes
        return max(1, int((a + b) / b))

    def chain_value(self, classes) -> float:
        return self.chain_plan(classes)[1]

    def record_shadow(self, classes, accepted: int) -> None:
        """Rows of a chain that did not run, checked against the tokens the request
        committed after it (core/shadow.py): they teach the row model as verified rows do,
        so that rows the prices decline still revise their classes' rates."""
        self.rows_model.record(classes, accepted)

    def record_chain(self, classes, rows: int, accepted: int) -> None:
        """A chain that ran `rows` rows (the first `rows` of `classes`) and accepted
        `accepted`; rows 0 for a step whose chain was cut or empty."""
        self.usage.record(rows, accepted)
        if rows:
            self._batches_without_chain = 0
            self.rows_model.record(list(classes)[:rows], accepted)
