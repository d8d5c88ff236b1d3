"""The flagship task: one Kimi-Linear W4A16 decode step, KernelBench-Mega `02_kimi_linear_decode`."""

from __future__ import annotations

import heapq
import itertools

import torch

from megakernel_agent.sandbox.candidate import parse_knobs, resolve_knobs, source_sha256
from megakernel_agent.traces.results import PhaseTimeline

from ..base import ModelledStep, ScheduleModelError, State, Task, sharing_weights
from ..cuda_runtime import CompiledKernel
from ..spec import TaskSpec, Tolerance
from .abi import DECLARATIONS
from .baseline import BaselineModel
from .bytes_model import bytes_per_step
from .bytes_model import phase_bytes as bytes_by_phase
from .config import CONFIGS
from .inputs import build_model, init_state, init_token
from .megakernel import MegakernelModel, kernel_defines, kernel_prelude
from .reference import ReferenceModel

MAX_TIE_VARIANTS = 24   # reference runs at most, over every valid expert set of those layers
TOLERANCE_NOTE = (
    "Relative-L2 bounds sit about 3x above the optimized-PyTorch baseline's own one-step error "
    "against the fp32 reference (H200: ~0.015 output, ~0.004 S, ~0.010 conv window, ~0.014 appended "
    "cache row; re-measure with `python -m megakernel_agent.tasks.kimi_linear.calibrate`). Layer-0 states see no MoE "
    "before them: 0.015 (S), 0.03 (conv). Later tensors and the output: 0.05. When the reference's "
    "top-k margin at a layer is within the tie band (the wider of 8 bf16 ulps at the k-th logit and 0.07 of "
    "the logits' standard deviation: reference.routing_sets), the experts within the band may "
    "fill the top-k's last places in any combination: the baseline itself moves such a margin by up "
    "to 6 ulps (`calibrate --device cpu --seeds 40 --ctx 3001`: 156 layer samples, median 1, p99 6, "
    "max 6), and the megakernel's failed checks on the H200 matched every tensor before one MoE layer "
    "and none after it, on inputs whose margin at that layer was 0-5 ulps (at an exact tie at layer 3, "
    "seed 1876674187 ctx 3001, neither the plain set nor the k/k+1 swap matched: a third expert lay "
    "within reach). So the checker also runs the reference with each other valid set at such a layer "
    "(reference.routing_sets: up to 8 per layer, those giving up the least logit first; 24 runs in all, "
    "taken in turn nearest the candidate first and breadth first, each layer's likeliest sets first) and "
    "accepts a match with any branch at the same tight bounds, at as many such layers as there are. "
    "The cosine gate (0.98, upstream's) applies to every tensor."
)

CONTEXTS = {"full": [2048, 8192, 16384], "small": [64, 300]}
CHECK_CONTEXTS = {"full": [1, 3001, 16384], "small": [1, 37, 300]}


class KimiTask(Task):
    def __init__(self, size: str = "full"):
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r}; choose from {sorted(CONFIGS)}")
        self.cfg = CONFIGS[size]
        ctxs = CONTEXTS[size]
        self.spec = TaskSpec(
            name="kimi_linear",
            size=size,
            description=(
                "Batch-1 decode of a Kimi-Linear W4A16 hybrid block (pattern "
                f"{','.join(self.cfg.pattern)}: KDA gated delta rule + MLA latent attention, each "
                f"followed by a {self.cfg.n_experts}-expert top-{self.cfg.n_active} MoE) in one "
                "cooperative kernel launch per token."
            ),
            dims=self.cfg.model_dump(exclude={"pattern"}) | {"pattern": ",".join(self.cfg.pattern)},
            seed_kernel="kernels/kimi_linear/seed.cu",
            declarations=DECLARATIONS,
            entry="kimi_decode_step",
            context_lengths=ctxs,
            check_context_lengths=CHECK_CONTEXTS[size],
            fixed_seeds=[0],
            tolerances={
                "out": Tolerance(rel_l2_max=0.05),
                "S_first": Tolerance(rel_l2_max=0.015),
                "conv_first": Tolerance(rel_l2_max=0.03),
                "later": Tolerance(rel_l2_max=0.05),
            },
            tolerance_note=TOLERANCE_NOTE,
            bytes_per_step={c: bytes_per_step(self.cfg, c) for c in ctxs},
        )

    def defines(self) -> dict[str, str]:
        return kernel_defines(self.cfg)

    def prelude(self) -> str:
        return kernel_prelude(self.cfg)

    def build_reference(self, device, weight_seed: int):
        return build_model(ReferenceModel, self.cfg, seed=weight_seed, device=device)

    def build_baseline(self, reference):
        return sharing_weights(BaselineModel, self.cfg, reference)

    def build_candidate(self, reference, kernel: CompiledKernel):
        return sharing_weights(MegakernelModel, self.cfg, reference).attach(kernel)

    def make_token(self, seed: int, device):
        return init_token(self.cfg, seed, device)

    def make_state(self, seed: int, ctx: int, device):
        return init_state(self.cfg, ctx, seed, device)

    def observables(self, hidden: torch.Tensor, state: State, ctx: int) -> dict[str, torch.Tensor]:
        obs = {"out": hidden}
        for i, (kind, st) in enumerate(zip(self.cfg.pattern, state, strict=True)):
            if kind == "K":
                for key in ("S", "cq", "ck", "cv"):
                    obs[f"L{i}.{key}"] = st[key]
            else:
                for key in ("c_kv", "k_rope"):
                    rows = st[key]
                    if rows.shape[0] != ctx + 1:
                        raise ValueError(f"L{i}.{key} has {rows.shape[0]} rows after the step, expected {ctx + 1}")
                    obs[f"L{i}.{key}_row"] = rows[ctx]
        return obs

    def untouched(self, state_before: State, state_after: State, ctx: int) -> dict[str, bool]:
        out = {}
        for i, kind in enumerate(self.cfg.pattern):
            if kind == "M":
                for key in ("c_kv", "k_rope"):
                    same = torch.equal(state_before[i][key][:ctx], state_after[i][key][:ctx])
                    out[f"L{i}.{key}[:ctx]"] = bool(same)
        return out

    def tensor_class(self, name: str, reference=None) -> str:
        if name == "out":
            return "out"
        if name == "L0.S":
            return "S_first"
        if name in ("L0.cq", "L0.ck", "L0.cv"):
            return "conv_first"
        return "later"

    def reference_variants(self, reference, hidden, state, distance=None, start=0.0):
        """The other valid answers at routing near-ties: at each layer whose top-k boundary is a near tie,
        every other valid expert set (reference.routing_sets). A branch looks for its next near tie in its
        own run: another set at one layer moves every later layer's logits (a tie that is exact in one branch
        may be 13 ulps wide in another). Any number of layers deep, MAX_TIE_VARIANTS runs in all.

        Branches run one at a time, taken in turn from two orders of the same untried branches: nearest the
        candidate first (by the distance of the run they extend; `start` is the plain run's), and breadth
        first. In both, shallower branches and each layer's likeliest sets (routing_sets ranks them) come
        before less likely ones. With near ties at four layers the plain run alone has more alternatives than
        the run limit: the first order follows a branch that brings the candidate nearer, the second keeps
        covering the plain run's alternatives when nearness was noise. The search stops at a match."""
        margins, sets = list(reference.routing_margins), list(reference.routing_sets)
        variants = []
        order = itertools.count()
        nearest, breadth = [], []   # heaps of the same untried branches: (key, branch, its run's set counts, layer)

        def push(far, choices, run_sets, last):
            """A run's untried branches, each choosing another set at one more layer past `last`."""
            depth = len(choices) + 1
            for i, j in ((i, j) for i, n in enumerate(run_sets) if i > last for j in range(1, n)):
                branch, tie = {**choices, i: j}, next(order)
                heapq.heappush(nearest, ((far, depth, j, i, tie), branch, run_sets, i))
                heapq.heappush(breadth, ((depth, j, i, tie), branch, run_sets, i))

        ran = set()
        try:
            push(start, {}, sets, -1)
            while (nearest or breadth) and len(variants) < MAX_TIE_VARIANTS:
                turn = (nearest, breadth) if len(variants) % 2 == 0 else (breadth, nearest)
                _, branch, run_sets, layer = heapq.heappop(turn[0] or turn[1])
                chosen = tuple(sorted(branch.items()))
                if chosen in ran:
                    continue   # already run from the other order
                ran.add(chosen)
                out, st = reference.step(hidden.clone(), Task.clone_state(state), choices=branch)
                here = [round(m, 1) for m in reference.routing_margins]
                branch_sets = list(reference.routing_sets)
                # tolerance classes refer to the plain run: restored before the candidate is judged
                reference.routing_margins, reference.routing_sets = margins, sets
                label = ", ".join(f"layer {k} set {v + 1} of {run_sets[k] if k == layer else '…'}"
                                  for k, v in sorted(branch.items()))
                variants.append((f"routing: {label} (margins {here})", out, st))
                far = 0.0 if distance is None else distance(out, st)
                if distance is not None and far <= 1.0:
                    return variants
                push(far, branch, branch_sets, layer)
            return variants
        finally:
            reference.routing_margins, reference.routing_sets = margins, sets   # classes refer to the plain run

    def rewind(self, state: State, ctx: int) -> State:
        for kind, st in zip(self.cfg.pattern, state, strict=True):
            if kind == "M":
                st["c_kv"], st["k_rope"] = st["c_kv"][:ctx], st["k_rope"][:ctx]
        return state

    def what_ifs(self) -> dict[str, str]:
        from .step_model import WHAT_IFS

        return {w.key: w.label for w in WHAT_IFS}

    def model_step(self, source: str, knobs: dict[str, int], stamped: PhaseTimeline, what_if: str | None = None,
                   machine: dict[str, float | str] | None = None,
                   stamped_knobs: dict[str, int] | None = None) -> ModelledStep | None:
        """The seed's discrete-event schedule model (step_model.py); only the seed's own source is modelled:
        the work plan mirrors its schedule, and an edited kernel may not keep it."""
        from .step_model import STAMPED_KNOBS, WHAT_IFS, machine_from, simulate, stamped_spans

        if source_sha256(source) != source_sha256(self.seed_source()):
            return None
        declared = parse_knobs(source)
        if stamped_knobs is not None:
            moved = resolve_knobs(declared, knobs), resolve_knobs(declared, stamped_knobs)
            if any(moved[0][k] != moved[1][k] for k in STAMPED_KNOBS if k in moved[0]):
                return None
        what = {w.key: w for w in WHAT_IFS}
        if what_if is not None and what_if not in what:
            raise ScheduleModelError(f"no what-if {what_if!r} (known: {', '.join(what)})")
        chosen = what.get(what_if)
        try:
            fig = machine_from(machine or {})
            if chosen is not None:
                fig = chosen.applied_to(fig)
            est = simulate(self.cfg, resolve_knobs(declared, knobs), fig, stamped_spans(stamped))
        except ValueError as e:   # a bad figure, an undeclared knob value, stamps without the phases it needs
            raise ScheduleModelError(str(e)) from None
        return ModelledStep(kernel_us=est.kernel_us, spans_us={p.name: p.span_us for p in est.phases})

    def phase_names(self) -> list[str]:
        """Per layer, the phases between the seed's grid barriers (5 per KDA layer, 7 per MLA layer)."""
        return list(bytes_by_phase(self.cfg, 0))

    def phase_bytes(self, ctx: int) -> list[int]:
        return list(bytes_by_phase(self.cfg, ctx).values())
