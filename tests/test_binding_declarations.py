"""The Kimi binding refuses, with the task's contract error, a kernel whose declarations it cannot honour. These
checks run before any device work, so a stand-in for the loaded kernel (its ABI size and its declarations, as
read at load) is enough on the CPU."""

import ctypes

import pytest

from megakernel_agent.tasks.cuda_runtime import KernelContractError
from megakernel_agent.tasks.kimi_linear.abi import WEIGHT_NIBBLES_SYMBOL, WEIGHT_SWIZZLE_SYMBOL, params_type
from megakernel_agent.tasks.kimi_linear.config import SMALL
from megakernel_agent.tasks.kimi_linear.megakernel import MegakernelModel


class LoadedKernel:
    """What _pack reads of a loaded kernel before it lays anything out."""

    def __init__(self, abi_size: int, declared: dict[str, int]):
        self.abi_size, self.declared = abi_size, declared

    def read_u64(self, symbol: str) -> int:
        assert symbol == "kimi_abi_size"
        return self.abi_size


ABI_SIZE = ctypes.sizeof(params_type(len(SMALL.pattern)))


@pytest.mark.parametrize("symbol", [WEIGHT_SWIZZLE_SYMBOL, WEIGHT_NIBBLES_SYMBOL])
@pytest.mark.parametrize("value", [2, 7, 1 << 40])
def test_a_layout_declaration_other_than_0_or_1_is_the_kernel_s_failure(symbol, value):
    model = MegakernelModel(SMALL).attach(LoadedKernel(ABI_SIZE, {symbol: value}))
    with pytest.raises(KernelContractError, match=f"{symbol} is {value}: 0 or 1"):
        model._pack(model.blocks[0].attn_norm.device)


def test_a_wrong_abi_size_is_the_kernel_s_failure():
    model = MegakernelModel(SMALL).attach(LoadedKernel(ABI_SIZE + 8, {}))
    with pytest.raises(KernelContractError, match="ABI size"):
        model._pack(model.blocks[0].attn_norm.device)
