"""Check the schedule model against the H200: knob moves of the seed, each profiled and timed interleaved with
the seed, against what the model predicted for it from the seed's stamps alone (issue 28, step 6).

Per move: the measured change in µs/token (interleaved with the seed, medians, with the verdict of `compare`),
the change in the stamped kernel (the move's own stamps against the seed's, where the model's figures come
from), the model's prediction made from the seed's stamps, and the phases where the model's shape misses most
(the model replayed on the move's own stamps against them). Writes model_check.json to $OUT (or /tmp).

Usage: python3 scripts/model_check.py [--moves K=V[,K2=V2] ...] [--rounds 3] [--ctx 16384]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.agent.compare import Version, interleave, speedups  # noqa: E402
from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.sandbox.pool import Evaluator  # noqa: E402
from megakernel_agent.tasks.registry import get_task  # noqa: E402

# Moves with a measured history (BENCHMARKS.md, 2026-12-05) and the two the model calls most clearly.
MOVES = ["KSPLIT_GU=12", "KSPLIT_GU=6", "KSPLIT_DOWN=4", "KSPLIT_DOWN=2", "KSPLIT_O=16", "KSPLIT_O=8",
         "KSPLIT_MLA=12", "KSPLIT_KDA=4", "KSPLIT_SHARED=36", "PREFETCH=0"]


def knobs_of(move: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in move.split(","))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", nargs="+", default=MOVES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=16384, help="the profiled context (the model's stamps)")
    args = ap.parse_args()
    task, console = get_task("kimi_linear", "full"), Console(width=160)
    seed = task.seed_source()
    versions = [Version("seed", Candidate(source=seed), ok=True)]
    versions += [Version(m, Candidate(source=seed, knobs=knobs_of(m)), ok=True) for m in args.moves]
    stamped = {}
    with Evaluator("kimi_linear", "full", work_dir=Path(tempfile.mkdtemp(prefix="model-check-")),
                   build_ahead=4) as ev:
        ev.start()
        ev.prebuild([v.candidate for v in versions])
        for v in versions:
            res = ev.evaluate(v.candidate, check=False, time=False, baseline=False, profile=[args.ctx])
            if not res.ok:
                v.ok, v.check = False, f"profile failed: {res.failure.message[:200]}"
                continue
            stamped[v.label] = res.phases[0]
        interleave(ev, [v for v in versions if v.ok], args.rounds, 3, [2048, args.ctx])
    rows = speedups(versions)
    median = {(r["label"], r["ctx"]): r["median_us"] for r in rows}
    verdicts = {(r["label"], r["ctx"]): r.get("verdict", "") for r in rows}
    base_model = task.model_step(seed, {}, stamped["seed"])
    out, t = [], Table(title=f"schedule model vs the H200 (model from the seed's stamps at ctx {args.ctx})")
    for col in ("move", "measured Δ µs/token 2K", f"measured Δ {args.ctx}", "stamped kernel Δ", "model Δ",
                "model on its own stamps: worst phases"):
        t.add_column(col, justify="left" if col in ("move", "model on its own stamps: worst phases") else "right")
    for v in versions[1:]:
        if v.label not in stamped:
            t.add_row(v.label, v.check, "", "", "", "")
            continue
        knobs = knobs_of(v.label)
        modelled = task.model_step(seed, knobs, stamped["seed"], stamped_knobs={})
        if modelled is None:   # a launch-shape or attention-split knob: no prediction
            t.add_row(v.label, v.check, "", "", "not modelled", "")
            continue
        predicted = modelled.kernel_us - base_model.kernel_us
        own = task.model_step(seed, knobs, stamped[v.label])
        misses = sorted(((r.name, own.spans_us[r.name] - r.span_us) for r in stamped[v.label].rows
                         if r.name in own.spans_us), key=lambda kv: -abs(kv[1]))[:3]
        measured = {c: median.get((v.label, c), float("nan")) - median.get(("seed", c), float("nan"))
                    for c in (2048, args.ctx)}
        kernel = stamped[v.label].kernel_us - stamped["seed"].kernel_us
        out.append({"move": v.label, "measured_us": measured, "verdict": {c: verdicts.get((v.label, c)) for c in
                    (2048, args.ctx)}, "stamped_kernel_delta": kernel, "model_delta": predicted,
                    "own_stamp_misses": misses})
        t.add_row(v.label, f"{measured[2048]:+.1f} ({verdicts.get((v.label, 2048))})",
                  f"{measured[args.ctx]:+.1f} ({verdicts.get((v.label, args.ctx))})", f"{kernel:+.1f}",
                  f"{predicted:+.1f}", ", ".join(f"{n} {d:+.1f}" for n, d in misses))
    console.print(t)
    dest = Path(os.environ.get("OUT", "/tmp")) / "model_check.json"
    dest.write_text(json.dumps({"moves": out, "stamped": {k: v.model_dump() for k, v in stamped.items()}}, indent=1))
    console.print(f"written: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
