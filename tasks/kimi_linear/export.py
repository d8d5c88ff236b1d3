"""Write a standalone KernelBench-Mega `solution.py` for a kernel version.

The file embeds the CUDA source and this project's host binding (the same code the sandbox runs,
concatenated with intra-project imports removed), builds with CuPy on first use, exposes upstream's
`Model(cfg)` / `step(hidden, state)` contract, and imports nothing from this project.
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
EMBEDDED = [HERE.parent / "abi_gen.py", HERE.parent / "cuda_runtime.py", HERE / "modules.py", HERE / "quant.py",
            HERE / "abi.py", HERE / "megakernel.py"]
# Upstream problem.yaml's forbidden substrings (check.py greps solution.py for them).
FORBIDDEN = ["transformers", "flash_mla", "flashmla", "fla.ops", "flash_linear_attention", "vllm", "sglang",
             "bitsandbytes", "torchao", "marlin", "auto_gptq", "autoawq", "awq", "exllama", "import reference",
             "from reference", "import baseline", "from baseline", "torch.compile", "CUDAGraph", "cuda.graph",
             "make_graphed_callables"]
# an intra-project import (one line, or a parenthesised list over several) or the __future__ import
LOCAL_IMPORT = re.compile(r"^from \.+[\w.]* import (?:\([^)]*\)|.*)$|^from __future__ import annotations$",
                          re.MULTILINE)


def export_solution(source: str, knobs: dict[str, int], label: str) -> str:
    body = []
    for path in EMBEDDED:
        text = LOCAL_IMPORT.sub("", path.read_text())
        body.append(f"# ---- {path.relative_to(HERE.parent.parent)} ----\n{text.strip()}\n")
    defines = {k: str(v) for k, v in knobs.items()}
    out = "\n".join([
        f'"""KernelBench-Mega 02_kimi_linear_decode solution exported by megakernel-agent ({label}).',
        "",
        "One cooperative CUDA kernel launch per step(); weights stream as int4. Built with CuPy (NVRTC) on",
        'the first step. Generated file: edit the kernel in the project and export again."""',
        "",
        "from __future__ import annotations",
        "",
        *body,
        "# ---- the kernel version ----",
        f"KERNEL_SOURCE = {source!r}",
        f"KNOB_DEFINES = {defines!r}",
        "",
        "",
        "class Model(MegakernelModel):",
        '    """Upstream contract: Model(cfg), load_state_dict(strict=True), step(hidden, state)."""',
        "",
        "    def __init__(self, cfg):",
        "        super().__init__(cfg, source=KERNEL_SOURCE, knob_defines=KNOB_DEFINES)",
        "",
    ])
    found = [f for f in FORBIDDEN if f in out]
    if found:
        raise ValueError(f"the exported file contains upstream-forbidden text {found}; rename it in the sources")
    return out
