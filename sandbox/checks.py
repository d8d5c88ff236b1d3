"""Fail-closed correctness protocol: a candidate passes only if every case and every tensor passes.

Cases (all against the fp32 reference run from a copy of the very same inputs):
- step: fixed seeds at every check context, fresh seeds at one context each; outputs poisoned first;
- repeat: the first case run again from identical inputs must be bit-identical (races show);
- continuation: the candidate goes on from its own returned state, each step compared with the
  reference run from a copy of that state (a chained trajectory would measure precision drift);
- swap: mid-run, a different state object is handed in (stale internal copies show).
Every tensor the step updates is compared (cosine AND relative L2, all values finite), and state the
step must not touch (old cache rows) must stay bit-identical.
"""

from __future__ import annotations

import math
import time

import torch

from megakernel_agent.tasks.base import Task
from megakernel_agent.traces.results import CheckCase, CheckResult, TensorCheck


def compare(name: str, got: torch.Tensor, want: torch.Tensor, task: Task, slack: float = 1.0,
            reference=None) -> TensorCheck:
    cls = task.tensor_class(name, reference)
    tol = task.spec.tolerances[cls]
    g, w = got.detach().double().flatten(), want.detach().double().flatten()
    # both sides: a state crafted to drive the reference out of range must not make any answer pass
    finite = g.shape == w.shape and bool(torch.isfinite(g).all()) and bool(torch.isfinite(w).all())
    if finite:
        denom = w.norm().item()
        rel = (g - w).norm().item() / denom if denom > 0 else float((g - w).norm().item() > 0)
        cos = torch.nn.functional.cosine_similarity(g, w, dim=0).item() if denom > 0 else float(rel == 0)
    else:
        rel, cos = float("inf"), float("nan")
    passed = finite and cos >= tol.cos_min and rel <= tol.rel_l2_max * slack
    return TensorCheck(name=name, tensor_class=cls, cos=cos, rel_l2=rel, finite=finite,
                       cos_min=tol.cos_min, rel_l2_max=tol.rel_l2_max * slack, passed=passed)


def _worst(tensors: list[TensorCheck]) -> float:
    """How far the worst tensor is from its bound (below 1 passes); NaN and inf rank last."""
    worst = max((t.rel_l2 / t.rel_l2_max if t.finite else float("inf") for t in tensors), default=0.0)
    return worst if worst == worst else float("inf")


def _distance(tensors: list[TensorCheck]) -> float:
    """How far a candidate is from an answer: its worst tensor's share of the bound, and above 1.0 whenever a
    tensor fails (a cosine below its gate fails however small the relative error)."""
    worst = _worst(tensors)
    return worst if all(t.passed for t in tensors) else max(worst, math.nextafter(1.0, math.inf))


def _not_finite(hidden: torch.Tensor, state) -> list[str]:
    names = [] if bool(torch.isfinite(hidden).all()) else ["hidden"]
    for i, layer in enumerate(state):
        names += [f"L{i}.{k}" for k, v in layer.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    return names


def worst_line(case: CheckCase) -> str:
    """The tensor closest to (or furthest past) its bound, e.g. 'L3.c_kv_row rel_l2 0.012 of 0.05'."""
    if not case.tensors:
        return ""
    t = max(case.tensors, key=lambda t: t.rel_l2 / t.rel_l2_max if t.finite else float("inf"))
    return f"{t.name} rel_l2 {t.rel_l2:.3g} of {t.rel_l2_max:.3g}, cos {t.cos:.4f}"


def describe(case: CheckCase) -> str:
    where = f"{case.kind} seed={case.seed} ctx={case.ctx}" + (f" step={case.step}" if case.step else "")
    bad = [t for t in case.tensors if not t.passed]
    if case.message and not bad:
        return f"{where}: {case.message}"
    if bad:
        t = bad[0]
        return (f"{where}: tensor {t.name} cos={t.cos:.4f} (min {t.cos_min}) rel_l2={t.rel_l2:.4g} "
                f"(max {t.rel_l2_max:.4g}) finite={t.finite}")
    broken = [k for k, ok in case.untouched.items() if not ok]
    return f"{where}: {broken[0]} changed but must stay bit-identical" if broken else where


class Checker:
    def __init__(self, task: Task, reference, candidate, device: torch.device):
        self.task, self.ref, self.cand, self.device = task, reference, candidate, device

    def poison(self, state) -> None:
        """Fill what the candidate's next step must write with NaN (when its binding can)."""
        poison = getattr(self.cand, "poison", None)
        if poison is not None:
            poison(state)

    def _candidate_step(self, hidden, state):
        self.poison(state)
        out, st = self.cand.step(hidden, state)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return out.clone(), st

    def _case(self, kind, seed, ctx, hidden, state, step=0, slack=1.0):
        """Run the candidate on (hidden, state), poisoned first, and judge it; returns (case, out, state)."""
        before = Task.clone_state(state)
        c_out, c_state = self._candidate_step(hidden.clone(), state)
        return self.judge(kind, seed, ctx, hidden, before, c_out, c_state, step, slack), c_out, c_state

    def judge(self, kind, seed, ctx, hidden, before, c_out, c_state, step=0, slack=1.0) -> CheckCase:
        """A candidate's step from (hidden, `before`), its output and state after, against the reference run
        afterwards from copies of the same inputs.

        The candidate must match the reference or one of its equally valid variants (the task's
        reference_variants, e.g. another valid expert set at a routing near-tie); the case names the variant.
        Variants are run only when the plain reference does not match (each is a whole reference step).
        """
        broken = _not_finite(hidden, before)
        if broken:
            message = (f"the step's input (the candidate's own earlier output and state) is not finite in "
                       f"{broken[:4]}: an earlier step wrote NaN or inf")
            return CheckCase(kind=kind, seed=seed, ctx=ctx, step=step, passed=False, message=message)
        r_out, r_state = self.ref.step(hidden.clone(), Task.clone_state(before))
        try:
            got = self.task.observables(c_out, c_state, ctx)

            def against(out, st) -> list[TensorCheck]:
                want = self.task.observables(out, st, ctx)
                return [compare(n, got[n], want[n], self.task, slack, self.ref) for n in want]

            branches = [("", against(r_out, r_state))]
            if not all(t.passed for t in branches[0][1]):
                judged = {}   # id(variant output) -> (that output, its tensors), as the task's search measured them

                def distance(out, st) -> float:
                    judged[id(out)] = (out, against(out, st))
                    return _distance(judged[id(out)][1])

                def measured(out, st) -> list[TensorCheck]:
                    seen = judged.get(id(out))
                    return seen[1] if seen is not None and seen[0] is out else against(out, st)

                variants = self.task.reference_variants(self.ref, hidden, before, distance,
                                                        start=_distance(branches[0][1]))
                branches += [(label, measured(out, st)) for label, out, st in variants]
        except ValueError as e:
            return CheckCase(kind=kind, seed=seed, ctx=ctx, step=step, passed=False, message=str(e))
        label, tensors = min(branches, key=lambda b: _distance(b[1]))
        untouched = self.task.untouched(before, c_state, ctx)
        passed = all(t.passed for t in tensors) and all(untouched.values())
        note = f"matched the reference with {label}" if label and passed else ""
        tried = [f"{b or 'plain reference'}: worst {_worst(t):.2f} of its bound" for b, t in branches]
        return CheckCase(kind=kind, seed=seed, ctx=ctx, step=step, tensors=tensors, untouched=untouched,
                         passed=passed, message=note, branches=tried if len(branches) > 1 else [])

    def chained_case(self, kind: str, seed: int, ctx: int, hidden, state, step: int):
        """A step from the candidate's own earlier state (continuation tolerance); returns (case, out, state)."""
        return self._case(kind, seed, ctx, hidden, state, step, self.task.spec.continuation_slack)

    def _repeat(self, seed, ctx) -> CheckCase:
        hidden, state = self.task.make_inputs(seed, ctx, self.device)
        first = self._candidate_step(hidden.clone(), Task.clone_state(state))
        first_obs = {k: v.clone() for k, v in self.task.observables(first[0], first[1], ctx).items()}
        second = self._candidate_step(hidden.clone(), Task.clone_state(state))
        second_obs = self.task.observables(second[0], second[1], ctx)
        differing = [n for n in first_obs if not torch.equal(first_obs[n], second_obs[n])]
        msg = f"two runs from identical inputs differ in {differing} (race?)" if differing else ""
        return CheckCase(kind="repeat", seed=seed, ctx=ctx, passed=not differing, message=msg)

    def run(self, fresh: list[int]) -> CheckResult:
        t0 = time.perf_counter()
        spec = self.task.spec
        ctxs = spec.check_context_lengths
        plan = [(s, c) for s in spec.fixed_seeds for c in ctxs]
        plan += [(s, ctxs[i % len(ctxs)]) for i, s in enumerate(fresh)]
        cases: list[CheckCase] = []

        def done() -> CheckResult:
            failed = next((c for c in cases if not c.passed), None)
            return CheckResult(passed=failed is None, seeds=list(spec.fixed_seeds) + fresh, fresh_seeds=fresh,
                               cases=cases, first_failure=describe(failed) if failed else "",
                               seconds=time.perf_counter() - t0)

        for seed, ctx in plan:
            hidden, state = self.task.make_inputs(seed, ctx, self.device)
            cases.append(self._case("step", seed, ctx, hidden, state)[0])
            if not cases[-1].passed:
                return done()
        cases.append(self._repeat(*plan[0]))
        if not cases[-1].passed:
            return done()
        # continuation from the candidate's own state, then a swapped-in state
        seed, ctx = plan[len(plan) // 2]
        hidden, state = self.task.make_inputs(seed, ctx, self.device)
        for step in range(1, spec.continuation_steps + 1):
            case, hidden, state = self.chained_case("continuation", seed, ctx + step - 1, hidden, state, step)
            cases.append(case)
            if not case.passed:
                return done()
        swap_seed = seed + 1000
        hidden, state = self.task.make_inputs(swap_seed, ctx, self.device)
        cases.append(self._case("swap", swap_seed, ctx, hidden, state)[0])
        return done()
