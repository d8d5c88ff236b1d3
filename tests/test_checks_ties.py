"""The checker at a routing near-tie: both valid expert sets pass at tight bounds, a wrong one fails."""

import torch
import torch.nn.functional as F

from megakernel_agent.sandbox.checks import Checker
from megakernel_agent.tasks.base import clone_state
from megakernel_agent.tasks.kimi_linear import baseline as base
from megakernel_agent.tasks.kimi_linear import reference as ref
from megakernel_agent.tasks.kimi_linear.calibrate import calibrate
from megakernel_agent.tasks.kimi_linear.config import SMALL
from megakernel_agent.tasks.kimi_linear.inputs import build_model, init_state, init_token
from megakernel_agent.tasks.kimi_linear.task import KimiTask

CPU = torch.device("cpu")


class Routed:
    """A 'candidate' that is the reference routing some layers by another valid (or an invalid) expert set."""

    def __init__(self, model, choices):
        self.model, self.choices = model, dict(choices)

    def step(self, hidden, state):
        return self.model.step(hidden, state, choices=self.choices)


class Misrouted(Routed):
    """Routes its chosen layers by a set that is *not* valid there: the k-th expert swapped for the (k+1)-th
    however far apart their logits are (every expert counts as near the k-th while it steps)."""

    def step(self, hidden, state):
        valid = ref.routing_sets
        ref.routing_sets = lambda logits, k, ulps=None: valid(logits, k, ulps=1e9)
        try:
            return super().step(hidden, state)
        finally:
            ref.routing_sets = valid


def tied_model_and_inputs():
    """A small model whose layer-0 router has its k-th and (k+1)-th logits tied for this input."""
    model = build_model(ref.ReferenceModel, SMALL, seed=4, device=CPU)
    hidden, state = init_token(SMALL, 3, CPU), init_state(SMALL, 12, 3, CPU)
    blk = model.blocks[0]
    st = clone_state(state)[0]
    h = hidden + ref.kda_step(blk.attn, SMALL, ref.rmsnorm(hidden, blk.attn_norm), st)
    x = ref.rmsnorm(h, blk.moe_norm).float()
    w = blk.moe.router.weight
    logits = F.linear(x, w.float())
    order = torch.argsort(logits, descending=True)
    k = SMALL.n_active
    a, b = order[k - 1], order[k]
    with torch.no_grad():
        w[b] = w[a]   # identical router rows: identical logits, two different but equally valid experts
    model.step(hidden.clone(), clone_state(state))
    assert model.routing_margins[0] == 0.0, model.routing_margins
    return model, hidden, state


def test_both_sides_of_a_near_tie_pass_and_a_wrong_routing_fails():
    model, hidden, state = tied_model_and_inputs()
    task = KimiTask("small")
    far = max(range(1, 4), key=lambda i: model.routing_margins[i])
    assert model.routing_margins[far] > 4.0
    verdicts = {}
    model.step(hidden.clone(), clone_state(state))
    assert model.routing_sets[0] >= 2 and model.routing_sets[far] == 1
    for name, choices in (("reference", {}), ("other side of the tie", {0: 1}), ("wrong routing", {far: 1})):
        candidate = (Misrouted if name == "wrong routing" else Routed)(model, choices)
        checker = Checker(task, model, candidate, CPU)
        case, _, _ = checker._case("step", 3, 12, hidden.clone(), clone_state(state))
        verdicts[name] = case
    assert verdicts["reference"].passed and verdicts["reference"].message == ""
    assert verdicts["other side of the tie"].passed
    assert "routing: layer 0 set 2 of" in verdicts["other side of the tie"].message
    assert all(t.rel_l2_max <= 0.05 for t in verdicts["other side of the tie"].tensors)   # the tight bounds
    assert not verdicts["wrong routing"].passed


def test_calibration_measures_errors_and_margin_shifts_and_restores_the_models():
    originals = (ref.moe_step, base.moe_step)
    errors, shifts, flipped = calibrate(KimiTask("small"), seeds=2, ctx=9, device=CPU)
    assert (ref.moe_step, base.moe_step) == originals
    assert not flipped and {"out", "later", "S_first", "conv_first"} <= set(errors)
    assert all(0.0 <= e < 0.05 for vals in errors.values() for e in vals)
    assert 2 <= len(shifts) <= 2 * len(SMALL.pattern) and all(u >= 0.0 and d >= 0.0 for u, d in shifts)


def test_a_routing_flip_is_judged_by_each_model_s_own_rule():
    """Experts 1 and 2 tie exactly in the reference's logits, which routes to the lower index; the baseline's
    input puts expert 2 ahead. torch.topk on the reference's logits could pick either, so it cannot tell."""
    from types import SimpleNamespace

    from megakernel_agent.tasks.kimi_linear.calibrate import margin_shifts

    cfg = SimpleNamespace(n_active=2)
    tie = SimpleNamespace(router=SimpleNamespace(weight=torch.tensor([[3.0, 0], [2, 0], [2, 0.001], [1, 0]])))
    clear = SimpleNamespace(router=SimpleNamespace(weight=torch.tensor([[3.0, 0], [2, 0], [1.5, 0], [1, 0]])))
    x_ref, x_base = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])
    shifts, flip = margin_shifts(cfg, [(tie, x_ref), (clear, x_ref)], [(tie, x_base), (clear, x_ref)])
    assert flip and len(shifts) == 1, "the flip at the exact tie was missed (or a later layer counted)"
    assert abs(shifts[0][1] - 0.001 / torch.tensor([3.0, 2, 2, 1]).std().item()) < 1e-4
    shifts, flip = margin_shifts(cfg, [(clear, x_ref)] * 2, [(clear, x_ref)] * 2)
    assert not flip and shifts == [(0.0, 0.0), (0.0, 0.0)]


class ScriptedReference:
    """Stands in for the reference: each set of layer choices yields scripted margins and valid-set counts."""

    def __init__(self, sets_by_choices):
        self.sets_by_choices = sets_by_choices
        self.routing_sets = sets_by_choices[()]
        self.routing_margins = [0.0 if n > 1 else 50.0 for n in self.routing_sets]
        self.runs = []

    def step(self, hidden, state, choices=None):
        key = tuple(sorted((choices or {}).items()))
        self.runs.append(key)
        self.routing_sets = self.sets_by_choices.get(key, [1] * 4)
        self.routing_margins = [0.0 if n > 1 else 50.0 for n in self.routing_sets]
        return hidden, state


def test_every_valid_set_and_a_near_tie_that_appears_only_in_a_branch_are_tried():
    """Every layer's second set before any layer's third (each layer's likeliest alternatives first)."""
    reference = ScriptedReference({
        (): [1, 3, 1, 2],                    # near ties at layers 1 (three valid sets) and 3 in the plain run
        ((1, 1),): [1, 3, 2, 1],              # set 2 at layer 1 makes layer 2 tie and settles layer 3
        ((1, 2),): [1, 3, 1, 1],
        ((3, 1),): [1, 3, 1, 2],
        ((1, 1), (2, 1)): [1, 3, 2, 2],
    })
    variants = KimiTask("small").reference_variants(reference, torch.zeros(1), [])
    names = [name.split(" (margins")[0] for name, _, _ in variants]
    assert names == ["routing: layer 1 set 2 of 3", "routing: layer 3 set 2 of 2", "routing: layer 1 set 3 of 3",
                     "routing: layer 1 set 2 of …, layer 2 set 2 of 2",
                     "routing: layer 1 set 2 of …, layer 2 set 2 of …, layer 3 set 2 of 2"]
    assert ((1, 1), (3, 1)) not in reference.runs     # layer 3 is settled once layer 1 takes set 2
    assert reference.routing_sets == [1, 3, 1, 2]       # classes refer to the plain run


class KeyedReference(ScriptedReference):
    """A scripted reference whose 'output' is the set of choices it ran with (what a distance can look at)."""

    def step(self, hidden, state, choices=None):
        super().step(hidden, state, choices)
        return tuple(sorted((choices or {}).items())), state


def test_the_branch_nearest_the_candidate_is_extended_first_and_a_match_ends_the_search():
    # seed 227359290 ctx 8201 on the H200: ties at layers 0, 2 and 3 left more valid sets than the run limit;
    # breadth first spent it on layer-0 sets the kernel was far from, and the honest seed was refused
    sets = {(): [3, 1, 8, 2], ((0, 1),): [3, 1, 8, 2], ((0, 2),): [3, 1, 8, 2], ((2, 3),): [3, 1, 8, 3]}
    match = ((2, 3), (3, 2))

    def distance(out, _state) -> float:
        return 0.5 if out == match else 1.01 if out == ((2, 3),) else 6.0

    reference = KeyedReference(sets)
    variants = KimiTask("small").reference_variants(reference, torch.zeros(1), [], distance, start=6.0)
    # in turn nearest first and breadth first: layer 2's fourth set, nearer than the plain run, is extended
    # as soon as it has run, while the plain run's alternatives go on in the other turns
    assert [out for _, out, _ in variants] == [((0, 1),), ((2, 1),), ((3, 1),), ((0, 2),), ((2, 2),), ((2, 3),),
                                               ((2, 3), (3, 1)), ((2, 4),), match]
    assert reference.routing_sets == [3, 1, 8, 2]

    breadth_first = KimiTask("small").reference_variants(KeyedReference(sets), torch.zeros(1), [])
    assert [out for _, out, _ in breadth_first].index(match) > len(variants)


def test_a_branch_nearer_than_the_plain_run_is_extended_before_the_plain_run_s_alternatives_run_out():
    """Near ties at all four layers: the plain run has 28 alternatives, more than the run limit. The candidate
    routed layers 2 and 3 differently; one layer's set alone brings it nearer, and the search follows that."""
    sets = {(): [8, 8, 8, 8], ((2, 1),): [8, 8, 8, 8]}
    match = ((2, 1), (3, 1))

    def distance(out, _state) -> float:
        return 0.5 if out == match else 1.6 if out == ((2, 1),) else 2.7

    variants = KimiTask("small").reference_variants(KeyedReference(sets), torch.zeros(1), [], distance, start=2.7)
    assert [out for _, out, _ in variants] == [((0, 1),), ((1, 1),), ((2, 1),), ((3, 1),), match]


def test_a_branch_nearer_by_noise_alone_does_not_take_every_run():
    """A review's case: layer 0's second set is nearer than the plain run by noise (2.69 against 2.7) and the
    candidate took layer 3's third set. Following layer 0 alone would spend all 24 runs under it; every
    other run goes to the plain run's alternatives breadth first, and they reach the match."""
    sets = {(): [8, 8, 8, 8], ((0, 1),): [8, 8, 8, 8]}
    match = ((3, 2),)

    def distance(out, _state) -> float:
        return 0.5 if out == match else 2.69 if out == ((0, 1),) else 2.7

    variants = KimiTask("small").reference_variants(KeyedReference(sets), torch.zeros(1), [], distance, start=2.7)
    assert variants[-1][1] == match and len(variants) == 14
