"""GPU: the sandbox end to end on the smoke task, including every kind of broken candidate."""

from pathlib import Path

import pytest

from sandbox.candidate import Candidate
from sandbox.pool import Evaluator
from sandbox.protocol import PhaseTimeouts
from traces.results import FailureClass

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
SEED = (ROOT / "kernels/w4a16_gemv/seed.cu").read_text()
HEAD = 'extern "C" __global__ void __launch_bounds__(THREADS) gemv_step(const __grid_constant__ GemvParams p) {\n'


def variant(old: str, new: str) -> str:
    assert old in SEED, old
    return SEED.replace(old, new, 1)


BAD = {
    "compile error": (variant("float ss = 0.0f;", "float ss = 0.0f"), FailureClass.build),
    "include outside the allow-list": ("#include <stdio.h>\n" + SEED, FailureClass.build),
    "grid too large to co-reside": (
        variant("// @knob BLOCKS_PER_SM 1 {1,2,4}", "// @knob BLOCKS_PER_SM 64 {64}"),
        FailureClass.build,
    ),
    "deadlocked barrier": (
        variant(HEAD, HEAD + "  if (blockIdx.x == 0) cooperative_groups::this_grid().sync();\n"),
        FailureClass.timeout,
    ),
    "infinite loop": (variant(HEAD, HEAD + "  while (p.x != nullptr) { __nanosleep(1000); }\n"), FailureClass.timeout),
    "illegal address": (variant(HEAD, HEAD + "  p.out[(size_t)1 << 40] = p.x[0];\n"), FailureClass.crash),
    "NaN output": (
        variant("p.out[col + j] = __float2bfloat16_rn(", 'p.out[col + j] = __float2bfloat16_rn(nanf("") + '),
        FailureClass.wrong,
    ),
    "writes only part of the output": (
        variant("if (last && col < HIDDEN) {", "if (last && col < HIDDEN - 64) {"),
        FailureClass.wrong,
    ),
    "racy reduction": (variant("last = prev == KSPLIT - 1;", "last = split == 0;"), FailureClass.wrong),
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with Evaluator(
        "w4a16_gemv",
        "full",
        work_dir=tmp_path_factory.mktemp("gemv"),
        timeouts=PhaseTimeouts(startup=300, build=120, check=20, time=60),
    ) as ev:
        yield ev


def test_seed_passes_and_is_timed(pool):
    res = pool.evaluate(Candidate(source=SEED))
    assert res.ok, res.failure
    assert res.check.passed and len(res.check.fresh_seeds) == 2
    assert res.launches.kernels == 1
    t = res.timings[0]
    assert len(t.samples_us) >= 5 and t.median_us > 0 and t.speedup and t.roofline > 0
    assert res.build.resources.grid == res.device.sms * res.build.resources.blocks_per_sm


@pytest.mark.parametrize("name", list(BAD))
def test_broken_candidate_is_classified_and_the_next_one_still_evaluates(pool, name):
    source, cls = BAD[name]
    res = pool.evaluate(Candidate(source=source, knobs={"KSPLIT": 8} if "racy" in name else {}), time=False)
    assert res.failure is not None and res.failure.cls == cls, (name, res.failure)
    good = pool.evaluate(Candidate(source=SEED), time=False)
    assert good.ok, (name, good.failure)


def test_knob_variant_is_a_different_build_and_correct(pool):
    a = pool.evaluate(Candidate(source=SEED, knobs={"KSPLIT": 16, "THREADS": 128}), time=False)
    b = pool.evaluate(Candidate(source=SEED), time=False)
    assert a.ok and b.ok and a.key != b.key and a.knobs["KSPLIT"] == 16
