"""The checker at a routing near-tie: both valid expert sets pass at tight bounds, a wrong one fails."""

import torch
import torch.nn.functional as F

from sandbox.checks import Checker
from tasks.base import clone_state
from tasks.kimi_linear import baseline as base
from tasks.kimi_linear import reference as ref
from tasks.kimi_linear.calibrate import calibrate
from tasks.kimi_linear.config import SMALL
from tasks.kimi_linear.inputs import build_model, init_state, init_token
from tasks.kimi_linear.task import KimiTask

CPU = torch.device("cpu")


class Flipped:
    """A 'candidate' that is the reference with some layers' k-th/(k+1)-th experts swapped."""

    def __init__(self, model, flips):
        self.model, self.flips = model, frozenset(flips)

    def step(self, hidden, state):
        return self.model.step(hidden, state, flips=self.flips)


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
    for name, flips in (("reference", ()), ("other side of the tie", (0,)), ("wrong routing", (far,))):
        checker = Checker(task, model, Flipped(model, flips), CPU)
        case, _, _ = checker._case("step", 3, 12, hidden.clone(), clone_state(state))
        verdicts[name] = case
    assert verdicts["reference"].passed and verdicts["reference"].message == ""
    assert verdicts["other side of the tie"].passed
    assert "flipped at layer(s) [0]" in verdicts["other side of the tie"].message
    assert all(t.tensor_class != "after_tie" for t in verdicts["other side of the tie"].tensors)
    assert not verdicts["wrong routing"].passed


def test_calibration_measures_errors_and_margin_shifts_and_restores_the_models():
    originals = (ref.moe_step, base.moe_step)
    errors, shifts = calibrate(KimiTask("small"), seeds=2, ctx=9, device=CPU)
    assert (ref.moe_step, base.moe_step) == originals
    assert {"out", "later", "S_first", "conv_first"} <= set(errors)
    assert all(0.0 <= e < 0.05 for vals in errors.values() for e in vals)
    assert 2 <= len(shifts) <= 2 * len(SMALL.pattern) and all(s >= 0.0 for s in shifts)


class ScriptedReference:
    """Stands in for the reference: each set of flipped layers yields scripted routing margins."""

    def __init__(self, margins_by_flips):
        self.margins_by_flips = margins_by_flips
        self.routing_margins = margins_by_flips[frozenset()]
        self.runs = []

    def step(self, hidden, state, flips=frozenset()):
        self.runs.append(frozenset(flips))
        self.routing_margins = self.margins_by_flips.get(frozenset(flips), [50.0] * 4)
        return hidden, state


def test_a_near_tie_that_appears_only_after_a_flip_is_branched_too():
    far = 50.0
    reference = ScriptedReference({
        frozenset(): [far, 8.0, far, 0.0],          # near ties at layers 1 and 3 in the plain run
        frozenset({1}): [far, 8.0, 2.0, 13.0],      # flipping layer 1 makes layer 2 tie and widens layer 3
        frozenset({3}): [far, 8.0, far, 0.0],
        frozenset({1, 2}): [far, 8.0, 2.0, 1.0],
    })
    variants = KimiTask("small").reference_variants(reference, torch.zeros(1), [])
    names = [name.split(" (margins")[0] for name, _, _ in variants]
    assert names == ["routing flipped at layer(s) [1]", "routing flipped at layer(s) [3]",
                     "routing flipped at layer(s) [1, 2]", "routing flipped at layer(s) [1, 2, 3]"]
    assert variants[0][0].endswith("(margins [50.0, 8.0, 2.0, 13.0])")   # the branch's own run
    assert frozenset({1, 3}) not in reference.runs   # layer 3 is 13 ulps wide once layer 1 flips
    assert reference.routing_margins == [far, 8.0, far, 0.0]   # classes refer to the plain run
