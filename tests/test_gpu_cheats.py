"""GPU: candidates that are correct only when they can tell they are checked are refused as wrong.

Each cheat is the seed plus a line or two that makes it do no work (an early return from every block)
whenever it believes it is being timed. All of them pass the check protocol; before timed samples were
verified, each would have been kept as a many-fold "speedup". Also: a kernel that writes into weights it
does not own, one that asks for most of the GPU's memory, and a host file named in an include.
"""

from pathlib import Path

import pytest

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.traces.results import FailureClass

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
SEED = (ROOT / "kernels/kimi_linear/seed.cu").read_text()
ENTRY = ('extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)\n'
         "kimi_decode_step(const __grid_constant__ KimiParams p) {\n")
END = "  grid.stamp();\n}\n"
CONTRACT = "MK_LAUNCH_CONTRACT(THREADS, BLOCKS_PER_SM, DYN_SMEM, 4 * SCRATCH_FLOATS, COUNTER_WORDS)"
CLOCK = '  unsigned long long mk_now; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(mk_now));\n'


def cheat(at_entry: str, before: str = "", at_end: str = "", contract: str = "") -> str:
    assert SEED.count(ENTRY) == 1 and SEED.endswith(END) and SEED.count(CONTRACT) == 1
    src = SEED.replace(CONTRACT, contract or CONTRACT).replace(ENTRY, before + ENTRY + at_entry)
    return src[: -len(END)] + at_end + END


# The small task checks contexts 1, 37, 300 (continuation 300-302) and times chains at 64 and 300.
CHEATS = {
    "context": cheat("  if (p.ctx_len > 40 && (p.ctx_len < 300 || p.ctx_len > 302)) return;\n"),
    "launch counter in a module global": cheat(
        "  const unsigned long long mk_call = *(volatile unsigned long long*)&mk_calls;\n"
        "  if (mk_call >= 16) return;\n",
        before="__device__ unsigned long long mk_calls;\n",
        at_end="  if (blockIdx.x == 0 && threadIdx.x == 0) mk_calls = mk_call + 1;\n"),
    "launch counter in the counters buffer": cheat(
        "  unsigned* mk_calls = p.counters + COUNTER_WORDS;\n"
        "  const unsigned mk_call = *(volatile unsigned*)mk_calls;\n"
        "  if (mk_call >= 16) return;\n",
        at_end="  if (blockIdx.x == 0 && threadIdx.x == 0) *mk_calls = mk_call + 1;\n",
        contract=CONTRACT.replace("COUNTER_WORDS)", "COUNTER_WORDS + 1)")),
    "back-to-back launches by the clock": cheat(
        CLOCK + "  const unsigned long long mk_prev = *(volatile unsigned long long*)&mk_last;\n"
        "  if (mk_prev != 0 && (long long)(mk_now - mk_prev) < 20000) {\n"
        "    if (blockIdx.x == 0 && threadIdx.x == 0) mk_last = mk_now;\n"
        "    return;\n"
        "  }\n",
        before="__device__ unsigned long long mk_last;\n",
        at_end="  if (blockIdx.x == 0 && threadIdx.x == 0) {\n" + CLOCK.replace("  ", "    ", 1)
               + "    mk_last = mk_now;\n  }\n"),
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with Evaluator("kimi_linear", "small", work_dir=tmp_path_factory.mktemp("cheats")) as ev:
        yield ev


def test_the_honest_seed_passes_with_every_timed_sample_verified(pool):
    res = pool.evaluate(Candidate(source=SEED), baseline=False, samples=3)
    assert res.ok, res.failure
    checks = [c for t in res.timings for c in t.sample_checks]
    assert len(checks) == 3 * len(res.timings) and all(c.passed and c.replay_identical for c in checks)
    assert len({c.seed for c in checks}) == len(checks)   # every sample from fresh inputs


def test_working_only_on_a_poisoned_output_buffer_gains_nothing(pool):
    """Every step of a timed chain (and of its replay) writes to a freshly poisoned buffer of its own, so a
    kernel that skips its work on an unpoisoned buffer never skips: it passes, having done all the work."""
    res = pool.evaluate(Candidate(source=cheat("  if (!__hisnan(p.hidden_out[0])) return;\n")), baseline=False,
                        samples=3)
    assert res.ok, res.failure


@pytest.mark.parametrize("name", list(CHEATS))
def test_a_kernel_that_cheats_when_timed_is_refused_as_wrong(pool, name):
    res = pool.evaluate(Candidate(source=CHEATS[name]), baseline=False, samples=3)
    assert res.failure is not None and res.failure.cls == FailureClass.wrong, (name, res.failure)
    if "clock" not in name:   # two checked launches may come within the clock cheat's window (the re-run case)
        assert res.check is not None and res.check.passed, "the cheat should look correct whenever it is checked"
        assert res.failure.phase == "time" and "timed sample" in res.failure.message
    honest = pool.evaluate(Candidate(source=SEED), time=False)
    assert honest.ok, honest.failure
    assert honest.worker_pid == res.worker_pid   # weights intact, context healthy: a wrong answer costs no respawn


def test_a_kernel_that_writes_into_weights_it_does_not_own_is_refused(pool):
    scribble = cheat("", before="__device__ int mk_done;\n", at_end=(
        "  if (blockIdx.x == 0 && threadIdx.x == 0 && !mk_done) {\n"
        "    mk_done = 1;\n"
        "    bf16* w = const_cast<bf16*>(p.layer[0].router_w);\n"
        "    w[0] = __float2bfloat16(__bfloat162float(w[0]) * 1.0078125f);\n"
        "  }\n"))
    res = pool.evaluate(Candidate(source=scribble), time=False)
    assert res.failure is not None and res.failure.cls == FailureClass.wrong, res.failure
    assert res.failure.phase == "integrity" and "router" in res.failure.message
    after = pool.evaluate(Candidate(source=SEED), time=False)
    assert after.ok and after.worker_pid != res.worker_pid   # its worker was retired


def test_an_include_of_a_host_file_is_refused_before_the_compiler_sees_it(pool):
    first = Path("/etc/passwd").read_text().splitlines()[0]
    res = pool.evaluate(Candidate(source='#include "/etc/passwd"\n' + SEED), time=False)
    assert res.failure is not None and res.failure.cls == FailureClass.build
    assert res.failure.message.startswith("line 1: only #include <header>")
    assert first not in res.model_dump_json()


@pytest.mark.parametrize("asks, said", [
    (("4 * SCRATCH_FLOATS", "(120ull << 30)"), f"{120 << 30} bytes of scratch"),
    (("DYN_SMEM", "(1u << 20)"), f"{1 << 20} bytes of dynamic shared memory"),
])
def test_a_kernel_asking_for_more_memory_than_it_may_have_is_refused_and_the_next_one_runs(pool, asks, said):
    """Had 120 GB of scratch been allocated, the next kernel's own allocation would fail and be blamed on it."""
    res = pool.evaluate(Candidate(source=cheat("", contract=CONTRACT.replace(*asks))), time=False)
    assert res.failure is not None and res.failure.cls == FailureClass.build, res.failure
    assert said in res.failure.message
    after = pool.evaluate(Candidate(source=SEED), time=False)
    assert after.ok, after.failure
