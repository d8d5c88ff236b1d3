"""Stand-in for upstream's `reference.py` when running upstream's own `check.py` on an export.

Earlier snapshots of the public store lacked upstream's reference.py (the current one,
Infatoshi/kernelbench.com, has it), so `gpu_suite.sh upstream` copies this file to `upstream/reference.py`
only when no real one is there. It exposes this project's
fp32 reference under upstream's names: `build_config`, `Model(cfg)` (random int4 weights, seed 1234),
`init_token` and `init_state`. check.py, shapes.py and problem.yaml stay upstream's.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megakernel_agent.tasks.kimi_linear.config import build_config  # noqa: E402
from megakernel_agent.tasks.kimi_linear.inputs import init_state, init_token, random_weights_  # noqa: E402
from megakernel_agent.tasks.kimi_linear.reference import ReferenceModel  # noqa: E402

__all__ = ["Model", "build_config", "init_state", "init_token"]


class Model(ReferenceModel):
    """The fp32 reference with the weights every check.py run compares against."""

    def __init__(self, cfg):
        super().__init__(cfg)
        random_weights_(self, 1234)
