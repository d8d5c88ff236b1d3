"""GPU: the sandbox end to end on the smoke task, including every kind of broken candidate."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.sandbox.protocol import PhaseTimeouts
from megakernel_agent.traces.results import FailureClass

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
    "a launch value that is not 64-bit": (
        variant("MK_LAUNCH_CONTRACT(THREADS, BLOCKS_PER_SM, 0, 4 * (size_t)KSPLIT * HIDDEN, TILES)",
                'extern "C" __device__ unsigned launch_threads = THREADS;\n'
                'extern "C" __device__ unsigned long long launch_blocks_per_sm = BLOCKS_PER_SM;\n'
                'extern "C" __device__ unsigned long long launch_dynamic_smem = 0;\n'
                'extern "C" __device__ unsigned long long scratch_bytes = 4 * (size_t)KSPLIT * HIDDEN;\n'
                'extern "C" __device__ unsigned long long counter_words = TILES;'),
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


def test_each_evaluation_of_a_build_records_the_load_it_ran_from(pool):
    cand = Candidate(source=SEED, knobs={"KSPLIT": 16})
    runs = [pool.evaluate(cand, check=False, baseline=False, samples=3) for _ in range(3)]
    assert all(r.ok for r in runs), [r.failure for r in runs]
    pids, keys, loads = zip(*(r.placement.split(":") for r in runs), strict=True)
    assert len(set(pids)) == 1 and len(set(keys)) == 1 and len(set(loads)) == 3   # one worker, three loads
    assert [int(x) for x in loads] == sorted(int(x) for x in loads)


def test_two_loads_of_one_cubin_are_two_modules_that_compute_the_same_bits():
    import gc
    import weakref

    import torch

    from megakernel_agent.sandbox.build import compile_candidate
    from megakernel_agent.tasks.cuda_runtime import load_kernel
    from megakernel_agent.tasks.registry import get_task

    task, dev = get_task("w4a16_gemv", "full"), torch.device("cuda:0")
    major, minor = torch.cuda.get_device_capability(dev)
    _, out = compile_candidate(task, Candidate(source=SEED), f"sm_{major}{minor}")
    assert out.ok, out.error
    first, second = (load_kernel(out.cubin, task.spec.entry, task.spec.declarations) for _ in range(2))
    assert first.module.handle != second.module.handle and first.handle != second.handle
    assert first.contract == second.contract and first.registers == second.registers > 0
    reference = task.build_reference(dev, 0)
    hidden, state = task.make_inputs(task.spec.fixed_seeds[0], task.spec.check_context_lengths[0], dev)
    outputs = [task.build_candidate(reference, k).step(hidden.clone(), state)[0] for k in (first, second)]
    assert torch.isfinite(outputs[0].float()).all() and torch.equal(outputs[0], outputs[1])
    torch.cuda.synchronize()
    unloaded = weakref.ref(first.module)
    del first
    gc.collect()
    assert unloaded() is None   # its module is gone; the other still runs
    assert torch.equal(task.build_candidate(reference, second).step(hidden.clone(), state)[0], outputs[1])


HANGING_PARENT = """
import sys
sys.path.insert(0, {root!r})
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.sandbox.protocol import PhaseTimeouts
ev = Evaluator("w4a16_gemv", "full", work_dir={work!r}, timeouts=PhaseTimeouts(check=900, time=900))
ev.evaluate(Candidate(source={source!r}), time=False)
"""


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    """Running or sleeping, not a zombie waiting to be reaped (a killed process whose parent died first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gpu_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout
    return {int(x) for x in out.split()}


def test_a_hung_kernels_worker_dies_with_its_killed_parent(tmp_path):
    source = BAD["infinite loop"][0]
    parent = subprocess.Popen([sys.executable, "-c", HANGING_PARENT.format(root=str(ROOT), work=str(tmp_path),
                                                                           source=source)])
    try:
        deadline = time.monotonic() + 240
        workers: set[int] = set()
        while time.monotonic() < deadline and not workers:
            workers = _descendants(parent.pid) & _gpu_pids()
            time.sleep(1)
        assert workers, "the worker never took the GPU"
        time.sleep(15)   # build, then the first launch: the kernel now spins
        family = _descendants(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        gone = time.monotonic() + 20
        while time.monotonic() < gone and (workers & _gpu_pids() or any(_alive(p) for p in family)):
            time.sleep(0.5)
        assert not workers & _gpu_pids(), "the hung worker still holds the GPU"
        assert not [p for p in family if _alive(p)], "a process of the killed session survived"
    finally:
        parent.kill()
        parent.wait()
