"""Why the Kimi step's warps stall, from Nsight Compute: is instruction fetch ("no instruction") a real share?

The cold-code probe (scripts/cold_code_probe.py) times a cold 8 KB code path at 3.5-3.8 µs idle and 6.3-15 µs
while bulk copies stream into the SM (1.09 µs warm), and the seed's 169 KiB of code is more than the SM's
instruction caches keep (they degrade from ~40 KB). This runs a short chain of steps at ctx 2048 so that
`ncu` (gpu_suite.sh step `stalls`) can profile one step with caches left as the previous step left them
(--cache-control none) and clocks untouched (--clock-control none). The build is the seed's own (NVRTC, same
options) plus -lineinfo, so the profile's SASS rows carry source lines. Usage under ncu:
  ncu --cache-control none --clock-control none -k regex:kimi_decode --launch-skip 6 --launch-count 1 \
      --section WarpStateStats --section SourceCounters python3 scripts/kimi_stall_profile.py [KERNEL.cu]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.sandbox.timing import time_steps  # noqa: E402
from megakernel_agent.tasks.cuda_runtime import compile_kernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.abi import DECLARATIONS, ENTRY  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import kernel_defines, kernel_prelude  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402


def main() -> None:
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / task.spec.seed_kernel
    source = path.read_text()
    knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
    major, minor = torch.cuda.get_device_capability()
    options = ("-std=c++17", f"-arch=sm_{major}{minor}", "-lineinfo",
               *(f"-D{k}={v}" for k, v in {**kernel_defines(task.cfg), **knobs}.items()))
    kernel = compile_kernel(kernel_prelude(task.cfg) + source, ENTRY, options, DECLARATIONS)
    model = task.build_candidate(task.build_reference(dev, 0), kernel)
    gpu, _ = time_steps(task, model, 2048, 3, 8, 1, 3, dev)
    print(f"{path.name}: {gpu[0]:.1f} µs per step (under the profiler: not a timing)")


if __name__ == "__main__":
    main()
