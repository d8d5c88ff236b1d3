"""Diagnose the Kimi megakernel against the reference: per-tensor cosine / rel-L2 for a few cases.

Usage: python scripts/kimi_diag.py [small|full] [KERNEL.cu] [NAME=V ...] [SEED:CTX ...]
Each case runs twice (the kernel must repeat itself bit for bit); without cases, two default ones.
Where the plain reference does not match, every routing near-tie branch the checker would try is
compared as well (its label carries that branch's own top-k margins), so a checker false alarm can be
told from a kernel bug.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.sandbox.checks import compare  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402


def main() -> None:
    args = sys.argv[1:]
    size = args.pop(0) if args and not args[0].endswith(".cu") else "full"
    path = Path(args.pop(0)) if args and args[0].endswith(".cu") else ROOT / "kernels/kimi_linear/seed.cu"
    source = path.read_text()
    knobs = Candidate(source=source, knobs={k: int(v) for k, v in (a.split("=") for a in args if "=" in a)})
    cases = [tuple(int(x) for x in a.split(":")) for a in args if ":" in a]
    task = KimiTask(size)
    dev = torch.device("cuda:0")
    t0 = time.perf_counter()
    kernel = build_megakernel(source, task.cfg, extra_defines={k: str(v) for k, v in knobs.resolved_knobs().items()})
    print(f"compiled in {time.perf_counter() - t0:.1f}s: {kernel.registers} regs, local {kernel.local_bytes} B, "
          f"contract {kernel.contract}")
    ref = task.build_reference(dev, 0)
    mk = task.build_candidate(ref, kernel)
    cases = cases or [(0, task.spec.check_context_lengths[0]), (1, task.spec.check_context_lengths[1])]
    for seed, ctx in cases:
        h, st = task.make_inputs(seed, ctx, dev)
        o_r, s_r = ref.step(h.clone(), task.clone_state(st))
        outs = []
        for _ in range(2):
            st_run = task.clone_state(st)
            mk.poison(st_run)
            o_m, s_m = mk.step(h.clone(), st_run)
            outs.append(o_m.clone())
        torch.cuda.synchronize()
        want, got = task.observables(o_r, s_r, ctx), task.observables(o_m, s_m, ctx)
        print(f"seed {seed} ctx {ctx} routing margins (bf16 ulps) {[round(m, 1) for m in ref.routing_margins]}; "
              f"two runs identical: {torch.equal(outs[0], outs[1])}")
        plain = [compare(name, got[name], want[name], task, reference=ref) for name in want]
        for c in plain:
            print(f"  {c.name:14s} cos {c.cos:.5f} rel {c.rel_l2:.4g} finite {c.finite} {'ok' if c.passed else 'FAIL'}")
        if all(c.passed for c in plain):
            continue
        for label, out_v, st_v in task.reference_variants(ref, h, st):
            want_v = task.observables(out_v, st_v, ctx)
            bad = [c for c in (compare(n, got[n], want_v[n], task, reference=ref) for n in want_v) if not c.passed]
            verdict = ", ".join(f"{c.name} rel {c.rel_l2:.3g}" for c in bad) or "every tensor matches"
            print(f"  vs {label}: {verdict}")


if __name__ == "__main__":
    main()
