"""The Kimi binding refuses, with the task's contract error, a kernel whose declarations it cannot honour. These
checks run before any device work, so a stand-in for the loaded kernel (its ABI size and its declarations, as
read at load) is enough on the CPU."""

import ctypes

import pytest
import torch
import torch.nn.functional as F

from megakernel_agent.tasks.cuda_runtime import KernelContractError
from megakernel_agent.tasks.kimi_linear.abi import (
    ROUTE_FOLD_SYMBOL,
    WEIGHT_NIBBLES_SYMBOL,
    WEIGHT_SWIZZLE_SYMBOL,
    params_type,
)
from megakernel_agent.tasks.kimi_linear.config import SMALL
from megakernel_agent.tasks.kimi_linear.inputs import init_token, random_weights_
from megakernel_agent.tasks.kimi_linear.megakernel import MegakernelModel, route_fold
from megakernel_agent.tasks.kimi_linear.quant import dequantize
from megakernel_agent.tasks.kimi_linear.reference import rmsnorm, routing_sets


class LoadedKernel:
    """What _pack reads of a loaded kernel before it lays anything out."""

    def __init__(self, abi_size: int, declared: dict[str, int]):
        self.abi_size, self.declared = abi_size, declared

    def read_u64(self, symbol: str) -> int:
        assert symbol == "kimi_abi_size"
        return self.abi_size


ABI_SIZE = ctypes.sizeof(params_type(len(SMALL.pattern)))


@pytest.mark.parametrize("symbol", [WEIGHT_SWIZZLE_SYMBOL, WEIGHT_NIBBLES_SYMBOL, ROUTE_FOLD_SYMBOL])
@pytest.mark.parametrize("value", [2, 7, 1 << 40])
def test_a_layout_declaration_other_than_0_or_1_is_the_kernel_s_failure(symbol, value):
    model = MegakernelModel(SMALL).attach(LoadedKernel(ABI_SIZE, {symbol: value}))
    with pytest.raises(KernelContractError, match=f"{symbol} is {value}: 0 or 1"):
        model._pack(model.blocks[0].attn_norm.device)


def test_a_wrong_abi_size_is_the_kernel_s_failure():
    model = MegakernelModel(SMALL).attach(LoadedKernel(ABI_SIZE + 8, {}))
    with pytest.raises(KernelContractError, match="ABI size"):
        model._pack(model.blocks[0].attn_norm.device)


@torch.no_grad()
def test_the_folded_router_ranks_the_experts_as_the_reference_router_does():
    """route_fold (MK_ROUTE_FOLD): W'.resid + M.o is the router's logit times rms(h), h = resid + o W_o, before any
    bf16 rounding. So its top-k is one of the expert sets the checker accepts for the reference's own logits (which
    round h, the norm's output and the logits to bf16), and z / rms(h) is the logit to within those roundings."""
    model = random_weights_(MegakernelModel(SMALL), 3)
    gen = torch.Generator().manual_seed(5)
    for i, blk in enumerate(model.blocks):
        o_proj = blk.attn.o_proj
        fold = route_fold(blk.moe.router.weight, blk.moe_norm, o_proj).float()
        assert fold.shape == (SMALL.n_experts, SMALL.hidden + o_proj.in_f) and fold.dtype == torch.float32
        w_o = dequantize(o_proj.w_q, o_proj.scales, o_proj.zeros, o_proj.group).float()
        for t in range(8):
            resid = init_token(SMALL, 100 * i + t)
            o = (torch.randn(o_proj.in_f, generator=gen) * 2.0).to(torch.bfloat16)
            h = resid + (o.float() @ w_o).to(torch.bfloat16)
            logits = F.linear(rmsnorm(h, blk.moe_norm), blk.moe.router.weight).float()
            z = fold[:, :SMALL.hidden] @ resid.float() + fold[:, SMALL.hidden:] @ o.float()
            rms = h.float().pow(2).mean().add(1e-6).sqrt()
            assert torch.allclose(z / rms, logits, rtol=0.02, atol=0.02 * float(logits.abs().max()))
            top = sorted(range(SMALL.n_experts), key=lambda e: (-float(z[e]), e))[:SMALL.n_active]
            assert sorted(top) in [sorted(s) for s in routing_sets(logits, SMALL.n_active)]
