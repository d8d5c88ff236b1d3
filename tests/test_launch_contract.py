"""A kernel's declared buffers are bounded before any binding allocates them (CPU: the contract alone)."""

import pytest

from megakernel_agent.tasks.cuda_runtime import CONTRACT_MEMORY_LIMIT, KernelContractError, LaunchContract


def contract(scratch_bytes: int, counter_words: int) -> LaunchContract:
    return LaunchContract(threads=512, blocks_per_sm=2, dynamic_smem=112 * 1024, scratch_bytes=scratch_bytes,
                          counter_words=counter_words)


def test_the_seeds_buffers_are_well_inside_the_limit():
    contract(25 << 20, 13_000).check_memory()   # the Kimi seed with its events build's stamps, rounded up


@pytest.mark.parametrize("scratch_bytes, counter_words", [
    (CONTRACT_MEMORY_LIMIT + 1, 0),
    (CONTRACT_MEMORY_LIMIT - 4, 2),
    (0, 1 << 40),
    (1 << 62, 1),
])
def test_a_kernel_asking_for_most_of_the_gpu_is_refused_with_what_it_asked(scratch_bytes, counter_words):
    with pytest.raises(KernelContractError, match=f"{scratch_bytes} bytes of scratch and {counter_words} counter"):
        contract(scratch_bytes, counter_words).check_memory()


def test_the_limit_itself_is_allowed():
    contract(CONTRACT_MEMORY_LIMIT - 400, 100).check_memory()
