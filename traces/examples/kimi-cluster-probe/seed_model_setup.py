"""What both plan-variant scripts here model against: the seed's knobs, the full config, the default machine and
the seed's stamped phase spans (the `run_agent.py model` defaults). Imported by moe_variant_model.py and
kda_flags_model.py, which edit the seed's plan and pass it to step_model.simulate."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from megakernel_agent.agent import schedule_model as sm  # noqa: E402
from megakernel_agent.sandbox.candidate import parse_knobs, resolve_knobs  # noqa: E402
from megakernel_agent.tasks.kimi_linear import step_model as stm  # noqa: E402
from megakernel_agent.tasks.kimi_linear import work_plan as wp  # noqa: E402
from megakernel_agent.tasks.kimi_linear.config import FULL as cfg  # noqa: E402

knobs = resolve_knobs(parse_knobs((ROOT / "kernels/kimi_linear/seed.cu").read_text()), {})
# the stamps this probe was modelled with (the model's default timeline has moved on since)
STAMPS = ROOT / "traces/examples/kimi-scripted-history/trace.jsonl#p13~profile-t7"
fixed = stm.stamped_spans(sm.stamped_timeline(str(STAMPS), None))
machine = stm.MachineModel()


def simulate(plan: list[wp.Phase]) -> stm.StepEstimate:
    """`plan` modelled with the seed's knobs and stamps, averaged over the machine's release draws."""
    return stm.simulate(cfg, knobs, machine, fixed, plan)
