"""Score the schedule model against recorded H200 measurements, on the CPU: the knob moves of a tuner session
that were timed (Δ µs/token against the session's own timing of the seed at the same context; moves of the
launch shape or the attention's split are left out, the model does not predict them), and the moves of a
model check (`scripts/model_check.py`'s model_check.json, Δ measured interleaved with the seed).

Why: every change to the model's figures or structure needs the same before/after numbers (correlation, right
sign, median error), computed the same way on both datasets. The model predicts each move from the seed's
stamps in model_check.json; `--knobs` sets knobs on both sides of every move (a seed that declares a knob the
data were measured without: set it to the value the data had), `--machine` sets MachineModel fields (what-ifs
of a recalibration).

Usage: python3 scripts/model_score.py [--knobs K=V ...] [--machine slab_latency_us=1.4 ...] [--ctx 16384]
       [--rows] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy  # noqa: E402

from megakernel_agent.sandbox.candidate import parse_knobs, resolve_knobs  # noqa: E402
from megakernel_agent.tasks.kimi_linear.config import FULL  # noqa: E402
from megakernel_agent.tasks.kimi_linear.step_model import (  # noqa: E402
    STAMPED_KNOBS,
    machine_from,
    simulate,
    stamped_spans,
)
from megakernel_agent.traces.results import PhaseTimeline  # noqa: E402

DATA = ROOT / "traces/examples/kimi-tuner-h200-model"
SEED = ROOT / "kernels/kimi_linear/seed.cu"


def tuner_moves(trace: Path, ctx: int) -> list[tuple[str, dict[str, int], float]]:
    """(label, knobs, measured Δ µs at ctx) of every proposal that was timed and moves no stamped or unmodelled
    knob; Δ is against the session's seed measurement."""
    records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    seed = next(r for r in records if r["type"] == "measure")["result"]
    base = {t["ctx"]: t["median_us"] for t in seed["timings"]}
    timed = {r["id"]: {t["ctx"]: t["median_us"] for t in r["result"]["timings"]}
             for r in records if r["type"] == "evaluate" and r["result"]["timings"]}
    out = []
    for p in (r for r in records if r["type"] == "proposal" and r["id"] in timed):
        moved = {k: v for k, v in p["knobs"].items() if seed["knobs"].get(k) != v}
        if any(k in STAMPED_KNOBS for k in moved):
            continue
        label = ",".join(f"{k}={v}" for k, v in moved.items())
        out.append((f"{p['id']} {label}", moved, timed[p["id"]][ctx] - base[ctx]))
    return out


def check_moves(check: dict, ctx: int) -> list[tuple[str, dict[str, int], float]]:
    """(label, knobs, measured Δ µs at ctx) of every move of a model check."""
    return [(m["move"], {k: int(v) for k, v in (kv.split("=") for kv in m["move"].split(","))},
             m["measured_us"][str(ctx)]) for m in check["moves"]]


def predict(args: tuple[dict[str, int], dict[str, int], dict[str, object], dict[str, float]]) -> float:
    """The model's kernel µs for one knob setting (a process-pool task)."""
    knobs, fixed, machine, spans = args
    declared = parse_knobs(SEED.read_text())
    return simulate(FULL, resolve_knobs(declared, {**fixed, **knobs}), machine_from(machine), spans).kernel_us


def score(pred: list[float], meas: list[float]) -> dict[str, float]:
    """Correlation, moves with the right sign (a prediction of exactly 0 counts as wrong), median |error|."""
    p, m = numpy.array(pred), numpy.array(meas)
    return {"n": len(p), "correlation": float(numpy.corrcoef(p, m)[0, 1]),
            "right_sign": int(numpy.sum(numpy.sign(p) == numpy.sign(m))),
            "median_error": statistics.median(abs(p - m))}


def parse_pairs(items: list[str], cast) -> dict:
    """K=V arguments as a dict, each value through `cast`."""
    return {k: cast(v) for k, v in (item.split("=", 1) for item in items)}


def number(v: str) -> object:
    """A machine figure: a number, or a word (dram_order's fifo / shared)."""
    try:
        return float(v)
    except ValueError:
        return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knobs", nargs="*", default=[], help="K=V set on the seed and on every move")
    ap.add_argument("--machine", nargs="*", default=[], help="MachineModel field=value")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--rows", action="store_true", help="print every move")
    ap.add_argument("--json", type=Path, help="write the per-move predictions and scores here")
    args = ap.parse_args()
    fixed, machine = parse_pairs(args.knobs, int), parse_pairs(args.machine, number)
    check = json.loads((DATA / "model_check.json").read_text())
    spans = stamped_spans(PhaseTimeline.model_validate(check["stamped"]["seed"]))
    sets = {"tuner": tuner_moves(DATA / "trace.jsonl", args.ctx), "model check": check_moves(check, args.ctx)}
    jobs = [({}, fixed, machine, spans)] + [(k, fixed, machine, spans) for s in sets.values() for _, k, _ in s]
    with ProcessPoolExecutor() as pool:
        kernel = list(pool.map(predict, jobs))
    base, rest, report = kernel[0], iter(kernel[1:]), {}
    for name, moves in sets.items():
        pred = [next(rest) - base for _ in moves]
        meas = [m for _, _, m in moves]
        report[name] = {"score": score(pred, meas),
                        "moves": [{"move": label, "model": p, "measured": m}
                                  for (label, _, m), p in zip(moves, pred, strict=True)]}
        s = report[name]["score"]
        print(f"{name}: {s['n']} moves, correlation {s['correlation']:.2f}, right sign {s['right_sign']}/{s['n']}, "
              f"median error {s['median_error']:.1f} µs")
        if args.rows:
            for row in report[name]["moves"]:
                print(f"  {row['move']:<40} model {row['model']:+6.1f}  measured {row['measured']:+6.1f}")
    if args.json:
        args.json.write_text(json.dumps({"knobs": fixed, "machine": machine, **report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
