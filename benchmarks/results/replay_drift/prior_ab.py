"""A class's prior: flat (0.5, as before) against its evidence shape's measured rate (core:
RowAcceptanceModel), replayed with a loaded step's prices; N > 1 in lock-step (a busy
batch: every request drafts before any learns). Usage (repository root):
python THIS TRACES.json   (replay_headroom/traces_{tune,heldout}.json, or a drift dump)"""
import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
import vllm_ptd.core.budget as bm

Shape = bm.RowAcceptanceModel


class Flat(Shape):
    """Shape statistics never learn: every class's prior stays `prior` (the old model)."""

    def record(self, classes, accepted):
        hit, seen = list(self._shape_hit), list(self._shape_seen)
        super().record(classes, accepted)
        self._shape_hit, self._shape_seen = hit, seen


traces = json.load(open(sys.argv[1]))
cost = rd.StepCost(13.2, 0.4, 1.8)
print("| N | set | first DE flat / shape | repeated DE flat / shape |")
print("|---|---|---|---|")
for N in (1, 4, 16, 32):
    for ds, tr in traces.items():
        cells = []
        for model in (Flat, Shape):
            bm.RowAcceptanceModel = model
            cells.append(rd.replay_first_and_repeated(
                tr, {}, cost, load=(N, rd.LOADED_LINES_MS[N]),
                concurrency=None if N == 1 else N))
        a, b = cells
        print(f"| {N} | {ds} | {a[0]:.2f} / {b[0]:.2f} | {a[2]:.2f} / {b[2]:.2f} |", flush=True)
