"""Typed description of a task, as the sandbox, the planners and the traces see it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Tolerance(BaseModel):
    """A tensor passes when cosine >= cos_min AND relative L2 <= rel_l2_max (and every value is finite)."""

    model_config = ConfigDict(frozen=True)

    cos_min: float = 0.98
    rel_l2_max: float


class TimingSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    warmup_steps: int = 5
    steps_per_sample: int = 20
    samples: int = 7
    baseline_steps_per_sample: int = 3
    baseline_samples: int = 3


class TaskSpec(BaseModel):
    """What a task is: shapes, where its seed kernel lives, how it is checked and timed."""

    model_config = ConfigDict(frozen=True)

    name: str
    size: str = Field(description="configuration name, e.g. 'full' or 'small'")
    description: str
    dims: dict[str, int | float | str]
    seed_kernel: str = Field(description="the seed kernel, kernels/<task>/seed.cu (package data: tasks.base reads it)")
    entry: str = Field(description="name of the kernel's extern \"C\" __global__ entry point")
    context_lengths: list[int] = Field(description="contexts the benchmark times")
    check_context_lengths: list[int] = Field(description="contexts the correctness check runs at")
    fixed_seeds: list[int] = Field(description="seeds checked on every evaluation besides fresh ones")
    fresh_seeds: int = Field(2, description="random seeds drawn per evaluation (recorded)")
    continuation_steps: int = 3
    continuation_slack: float = Field(1.5, description="tolerance multiplier for continuation steps")
    tolerances: dict[str, Tolerance] = Field(description="by tensor class, see Task.tensor_class")
    tolerance_note: str
    timing: TimingSpec = TimingSpec()
    bytes_per_step: dict[int, int] = Field(description="bytes a step must move, per context length")
    declarations: list[str] = Field(default_factory=list, description=(
        "64-bit device globals by which a kernel may declare a property of itself (absent: 0); read once, "
        "when the kernel is loaded, before it can run"))
