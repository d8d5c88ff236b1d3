"""GPU: the Kimi task — baseline vs reference at full size, the seed megakernel through the full sandbox
protocol (small and full), the host binding's state handling, and a kernel correct only for some contexts."""

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.tasks.base import clone_state
from megakernel_agent.tasks.kimi_linear.abi import WEIGHT_MMA_SYMBOL, WEIGHT_NIBBLES_SYMBOL, WEIGHT_SWIZZLE_SYMBOL
from megakernel_agent.tasks.kimi_linear.baseline import BaselineModel
from megakernel_agent.tasks.kimi_linear.config import FULL, SMALL
from megakernel_agent.tasks.kimi_linear.inputs import build_model, init_state, init_token
from megakernel_agent.tasks.kimi_linear.megakernel import (
    MegakernelModel,
    build_megakernel,
    mma_fragments,
    pair_nibbles,
    tile_major,
)
from megakernel_agent.tasks.kimi_linear.reference import ReferenceModel

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
SEED = (ROOT / "kernels/kimi_linear/seed.cu").read_text()
DEV = torch.device("cuda:0")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def cos(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def test_full_size_baseline_matches_reference():
    ref = build_model(ReferenceModel, FULL, seed=0, device=DEV)
    base = BaselineModel(FULL).to(DEV)
    base.load_state_dict(ref.state_dict(), strict=True)
    for seed, ctx in ((0, 2048), (1, 3001)):
        h, st = init_token(FULL, seed, DEV), init_state(FULL, ctx, seed, DEV)
        o_r, s_r = ref.step(h.clone(), clone_state(st))
        o_b, s_b = base.step(h.clone(), clone_state(st))
        assert cos(o_b, o_r) > 0.99 and rel(o_b, o_r) < 0.15
        assert rel(s_b[0]["S"], s_r[0]["S"]) < 0.015
        assert cos(s_b[3]["c_kv"][ctx], s_r[3]["c_kv"][ctx]) > 0.98


@pytest.mark.parametrize("size", ["small", "full"])
def test_seed_megakernel_passes_the_full_protocol(size, tmp_path):
    with Evaluator("kimi_linear", size, work_dir=tmp_path) as ev:
        res = ev.evaluate(Candidate(source=SEED), time=False)
    assert res.ok, res.failure
    kinds = {c.kind for c in res.check.cases}
    assert kinds == {"step", "repeat", "continuation", "swap"}
    names = {t.name for c in res.check.cases for t in c.tensors}
    assert {"out", "L0.S", "L2.cv", "L3.c_kv_row", "L3.k_rope_row"} <= names
    assert res.launches.kernels == 1


def test_kernel_correct_only_for_multiples_of_64_is_caught(tmp_path):
    old = "const int tokens = cx.ctx_len + 1;"
    assert SEED.count(old) == 1
    bad = SEED.replace(old, "const int tokens = ((cx.ctx_len + 1) & ~63) ? ((cx.ctx_len + 1) & ~63) : 64;")
    with Evaluator("kimi_linear", "small", work_dir=tmp_path) as ev:
        res = ev.evaluate(Candidate(source=bad), time=False)
        assert res.failure is not None and res.failure.cls.value == "wrong"
        assert "ctx=" in res.failure.message
        assert ev.evaluate(Candidate(source=SEED), time=False).ok


@pytest.fixture(scope="module")
def small_models():
    ref = build_model(ReferenceModel, SMALL, seed=5, device=DEV)
    knobs = Candidate(source=SEED).resolved_knobs()
    kernel = build_megakernel(SEED, SMALL, extra_defines={k: str(v) for k, v in knobs.items()})
    mk = MegakernelModel(SMALL).to(DEV)
    mk.load_state_dict(ref.state_dict(), strict=True)
    return ref, mk.attach(kernel)


def _step_pair(ref, mk, h, st):
    o_r, s_r = ref.step(h.clone(), clone_state(st))
    o_m, s_m = mk.step(h.clone(), st)
    torch.cuda.synchronize()
    return o_r, s_r, o_m.clone(), s_m


def test_binding_updates_in_place_and_returns_cache_views(small_models):
    ref, mk = small_models
    ctx = 50
    h, st = init_token(SMALL, 1, DEV), init_state(SMALL, ctx, 1, DEV)
    s_obj = st[0]["S"]
    o_r, s_r, o_m, s_m = _step_pair(ref, mk, h, st)
    assert s_m[0]["S"] is s_obj                                  # KDA state updated in place
    assert s_m[3]["c_kv"].shape[0] == ctx + 1 and s_m[3]["c_kv"]._base is not None  # a view of capacity
    assert cos(o_m, o_r) > 0.99 and rel(s_m[0]["S"], s_r[0]["S"]) < 0.015


def test_binding_honours_new_and_externally_modified_state(small_models):
    ref, mk = small_models
    ctx = 33
    h, st = init_token(SMALL, 2, DEV), init_state(SMALL, ctx, 2, DEV)
    _, _, o1, st = _step_pair(ref, mk, h, st)
    # external edit of the returned state (same tensors) and a wholly new state next: both must be seen
    st[0]["S"].mul_(0.5)
    st[3]["c_kv"][3].zero_()
    o_r, s_r, o_m, s_m = _step_pair(ref, mk, o1, st)
    assert cos(o_m, o_r) > 0.99 and rel(s_m[0]["S"], s_r[0]["S"]) < 0.015
    h2, st2 = init_token(SMALL, 9, DEV), init_state(SMALL, 7, 9, DEV)
    o_r, s_r, o_m, s_m = _step_pair(ref, mk, h2, st2)
    assert cos(o_m, o_r) > 0.99 and s_m[3]["c_kv"].shape[0] == 8


def test_binding_notices_re_pointed_and_resized_state_tensors(small_models):
    ref, mk = small_models
    h, st = init_token(SMALL, 8, DEV), init_state(SMALL, 40, 8, DEV)
    _, _, o1, st = _step_pair(ref, mk, h, st)   # the binding has now seen these objects and made the views
    # the same objects, changed under the binding: two KDA states re-pointed at new memory (set_ and
    # .data =), and the returned cache views cut back to 30 rows in place
    s1, s2 = st[1]["S"], st[2]["S"]
    s1.set_(s1.clone().mul_(0.5))
    s2.data = s2.clone().mul_(2.0)
    st[3]["c_kv"].resize_(30, SMALL.kv_lora)
    st[3]["k_rope"].resize_(30, SMALL.qk_rope)
    o_r, s_r, o_m, s_m = _step_pair(ref, mk, o1, st)
    assert s_m[1]["S"] is s1 and s_m[2]["S"] is s2
    assert rel(s1, s_r[1]["S"]) < 0.015 and rel(s2, s_r[2]["S"]) < 0.015   # written where they point now
    assert s_m[3]["c_kv"].shape[0] == 31 and cos(s_m[3]["c_kv"][30], s_r[3]["c_kv"][30]) > 0.99
    assert cos(o_m, o_r) > 0.99


def test_binding_sees_weights_loaded_or_edited_after_its_first_step(small_models):
    ref, mk = small_models
    h, st = init_token(SMALL, 7, DEV), init_state(SMALL, 12, 7, DEV)
    other = build_model(ReferenceModel, SMALL, seed=6, device=DEV)
    o_old, _, _, _ = _step_pair(ref, mk, h, clone_state(st))   # the kernel's copies hold ref's weights
    try:
        mk.load_state_dict(other.state_dict(), strict=True)
        o_r, _, o_m, _ = _step_pair(other, mk, h, clone_state(st))
        assert rel(o_m, o_r) < 0.05 and rel(o_old, o_r) > 0.2   # the weights matter for this token
        with torch.no_grad():   # back to ref's weights by in-place edits, announced
            for mine, theirs in zip(mk.state_dict().values(), ref.state_dict().values(), strict=True):
                mine.copy_(theirs)
        mk.weights_changed()
        o_r, _, o_m, _ = _step_pair(ref, mk, h, clone_state(st))
        assert rel(o_m, o_r) < 0.05
    finally:
        mk.load_state_dict(ref.state_dict(), strict=True)


@pytest.mark.parametrize("macro", ["MK_SWIZZLED_WEIGHTS", "MK_PAIRED_NIBBLES", "MK_MMA_WEIGHTS"])
def test_binding_lays_w_q_out_as_the_kernel_declares_it(small_models, macro):
    """The seed and a copy with one declaration toggled: each gets w_q as its loaded kernel declares (only the
    layout is checked here; the copy reads its rows wrongly), and MLA's kv_b never in MMA fragment order."""
    ref, mk = small_models

    def declares(source: str, name: str) -> bool:
        return re.search(rf"^{name}\b", source, re.MULTILINE) is not None

    def expected(model: MegakernelModel, w: torch.Tensor, row_read: bool = False) -> torch.Tensor:
        declared = model._kernel.declared
        if declared[WEIGHT_MMA_SYMBOL] == 1 and not row_read:
            return mma_fragments(tile_major(w))
        tiled = tile_major(w, swizzled=declared[WEIGHT_SWIZZLE_SYMBOL] == 1)
        return pair_nibbles(tiled) if declared[WEIGHT_NIBBLES_SYMBOL] == 1 else tiled

    def kv_b_copy(model: MegakernelModel) -> torch.Tensor:
        ptr = model._params.layer[3].proj[2].wq
        return next(t for t in model._tiled if t.data_ptr() == ptr)

    declaration = re.compile(rf"^{macro}\b.*$", re.MULTILINE)
    toggled_source = declaration.sub("", SEED) if declares(SEED, macro) else f"{macro}\n" + SEED
    knobs = {k: str(v) for k, v in Candidate(source=SEED).resolved_knobs().items()}
    toggled = MegakernelModel(SMALL).to(DEV)
    toggled.load_state_dict(ref.state_dict(), strict=True)
    toggled.attach(build_megakernel(toggled_source, SMALL, extra_defines=knobs))
    h, st = init_token(SMALL, 5, DEV), init_state(SMALL, 9, 5, DEV)
    _step_pair(ref, mk, h, clone_state(st))
    toggled.step(h.clone(), clone_state(st))
    torch.cuda.synchronize()
    w_q, kv_b = mk.blocks[0].attn.q_proj.w_q, mk.blocks[3].attn.kv_b.w_q
    for model in (mk, toggled):
        assert torch.equal(model._tiled[0], expected(model, w_q))
        assert torch.equal(kv_b_copy(model), expected(model, kv_b, row_read=True))
    # the toggle moved q_proj's bytes, or only kv_b's (with MK_MMA_WEIGHTS, the other two change kv_b alone)
    assert not (torch.equal(mk._tiled[0], toggled._tiled[0]) and torch.equal(kv_b_copy(mk), kv_b_copy(toggled)))
    assert torch.equal(toggled._tiled[1], mk._tiled[1])   # scales stay as they are


def test_binding_grows_the_cache_past_its_capacity(small_models):
    ref, mk = small_models
    h, st = init_token(SMALL, 3, DEV), init_state(SMALL, 4094, 3, DEV)
    for _ in range(4):   # crosses the 4096-row capacity
        o_r, s_r, h, st = _step_pair(ref, mk, h, st)
        assert cos(h, o_r) > 0.99
    assert st[3]["c_kv"].shape[0] == 4098


def test_binding_accepts_an_input_vector_that_is_not_16_byte_aligned(small_models):
    ref, mk = small_models
    h, st = init_token(SMALL, 4, DEV), init_state(SMALL, 20, 4, DEV)
    backing = torch.empty(SMALL.hidden + 1, dtype=torch.bfloat16, device=DEV)
    shifted = backing[1:]
    shifted.copy_(h)
    assert shifted.data_ptr() % 16
    o_r, _ = ref.step(h.clone(), clone_state(st))
    o_m, _ = mk.step(shifted, st)
    assert cos(o_m, o_r) > 0.99 and rel(o_m, o_r) < 0.05


def test_binding_rejects_a_malformed_state_with_a_clear_error(small_models):
    _, mk = small_models
    h, st = init_token(SMALL, 6, DEV), init_state(SMALL, 5, 6, DEV)
    st[1]["ck"] = st[1]["ck"][:, :-8].contiguous()
    with pytest.raises(ValueError, match=r"state\[1\]\['ck'\] must be .* shape"):
        mk.step(h, st)
    st = init_state(SMALL, 5, 6, DEV)
    st[3]["k_rope"] = st[3]["k_rope"][:4]
    with pytest.raises(ValueError, match=r"state\[3\]: c_kv must be .* same rows"):
        mk.step(h, st)


def _check_timed_chain(seed: int, ctx: int, verified: int):
    """The seed at full size through a chain of verified + 1 steps from `ctx` (poisoned outputs, the timed
    path's own run), then the chain's step `verified` checked against the reference: the checker's result."""
    from megakernel_agent.sandbox import timing
    from megakernel_agent.sandbox.checks import Checker
    from megakernel_agent.tasks.kimi_linear.task import KimiTask

    task = KimiTask("full")
    ref = task.build_reference(DEV, 0)
    knobs = Candidate(source=SEED).resolved_knobs()
    model = task.build_candidate(ref, build_megakernel(SEED, FULL, extra_defines={k: str(v) for k, v in knobs.items()}))
    tokens, pristine = timing._chain(task, seed, ctx, verified + 1, DEV)
    kept_tokens, kept_state = timing._host(tokens), timing._host(pristine)   # as time_candidate keeps them
    outs = timing._poisoned_outputs(tokens)
    _, state = timing._run(model, tokens, clone_state(pristine), outs)
    torch.cuda.synchronize(DEV)
    timed = timing._host(outs), timing._host(state)
    checker = Checker(task, ref, model, DEV)
    replayed = timing._replay(task, checker, kept_tokens, kept_state, timed, seed, ctx, [verified], DEV)
    return timing._judge(task, checker, replayed, DEV)


def test_the_seed_passes_a_timed_sample_with_near_ties_at_three_layers():
    """bench on the H200 refused the honest seed here (seed 227359290 from ctx 8192, step 9 verified: ties at
    layers 0, 2 and 3) until the checker searched the tie variants nearest-first."""
    check = _check_timed_chain(227359290, 8192, 9)
    assert check.passed, check.message


@pytest.mark.parametrize("ctx", [5031, 16500])
def test_the_attention_handles_a_short_last_tile_after_full_ones(ctx):
    """The last context split ends in a part tile that is not its first (the protocol's contexts 1, 3001 and
    16384 end every split's rows in its first tile): at 5031 two-tile splits, the last with 40 tokens; at 16500
    four-tile splits, the last with 117. Rows past the end are zeroed, never copied; a chain of two steps."""
    check = _check_timed_chain(7 + ctx, ctx, 1)
    assert check.passed, check.message
