"""Typed results of building, checking and timing a candidate (what the sandbox returns and traces keep)."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field, model_validator


class FailureClass(str, Enum):
    build = "build"      # compile error, refused source, bad knobs, launch that cannot co-reside
    timeout = "timeout"  # a phase outlived its limit (hang, deadlocked barrier): the worker was killed
    crash = "crash"      # CUDA error (illegal address...) or the worker died
    wrong = "wrong"      # ran, but a check failed (values, NaN, unwritten output, race, more launches)
    slower = "slower"    # correct but not faster than the best beyond noise (set by the session)
    infra = "infra"      # our side broke (no GPU, worker start failed, bad request)
    duplicate = "duplicate"  # the same source and knobs as a version already evaluated (refused before the GPU)


class Failure(BaseModel):
    cls: FailureClass
    phase: str
    message: str
    retryable: bool = False


class Resources(BaseModel):
    registers: int
    local_bytes: int = Field(description="per-thread local memory: stack frame plus spills")
    static_smem: int
    dynamic_smem: int
    max_threads: int
    threads: int
    blocks_per_sm: int
    blocks_fit_per_sm: int = Field(description="co-resident blocks per SM by the occupancy API")
    grid: int


class BuildResult(BaseModel):
    ok: bool
    key: str
    knobs: dict[str, int] = {}
    log: str = Field("", description="the compiler's log: diagnostics about the candidate, prelude or CUDA headers")
    seconds: float = Field(0.0, description="the build's seconds in the worker: compile (unless built ahead) and load")
    compile_seconds: float = Field(0.0, description="the compiler's own seconds, wherever it ran (ahead on the CPU, "
                                                    "or in the worker)")
    cached: bool = False
    resources: Resources | None = None
    spill_bytes: int = Field(0, description="ptxas spill stores + loads of the entry")
    error: str = ""
    compiler: str = ""
    confinement: str = Field("", description="how the compiler process was confined (Landlock) or why it was not")
    built_ahead: bool = Field(False, description="compiled on the CPU ahead of its evaluation, not in the worker")
    load: int = Field(0, description="which of the worker's loads of this build the evaluation ran from "
                            "(sandbox.build.Placements; 0: the first)")


class TensorCheck(BaseModel):
    name: str
    tensor_class: str
    cos: float
    rel_l2: float
    finite: bool
    cos_min: float
    rel_l2_max: float
    passed: bool


class CheckCase(BaseModel):
    kind: str = Field(description="step | repeat | continuation | swap | timed")
    seed: int
    ctx: int
    step: int = 0
    tensors: list[TensorCheck] = []
    untouched: dict[str, bool] = {}
    passed: bool
    message: str = ""
    branches: list[str] = Field([], description="at a routing near-tie: each reference branch tried, how close")


class CheckResult(BaseModel):
    passed: bool
    seeds: list[int]
    fresh_seeds: list[int]
    cases: list[CheckCase] = []
    first_failure: str = ""
    seconds: float = 0.0


class SampleCheck(BaseModel):
    """How one timed sample was verified: its untimed replay from the same inputs ended bit-identical, and the
    steps picked after the timed run matched the reference (sandbox/timing.py)."""

    seed: int
    start_ctx: int = Field(description="context of the chain's first timed step")
    verified_step: int = Field(description="index among the chain's timed steps of a step checked against the "
                                           "reference (see checked_steps)")
    checked_steps: list[int] = Field(
        default_factory=list, description="every step checked against the reference (between its samples a context's "
        "are all checked); verified_step is the first that failed, else the first of them (empty in traces before "
        "2026-12-08, which checked one)")
    replay_identical: bool
    passed: bool
    worst: str = Field("", description="the checked step's tensor closest to its bound")
    message: str = ""
    case: CheckCase | None = Field(None, description="the checked step in full, kept when the sample failed")


class TimingResult(BaseModel):
    ctx: int
    steps_per_sample: int
    samples_us: list[float] = Field(description="µs per step, one value per sample")
    median_us: float
    spread: float = Field(description="(p90 - p10) / median of the samples")
    tok_s: float
    bytes_per_step: int
    achieved_tbs: float
    roofline: float = Field(description="bytes_per_step / time / measured copy bandwidth")
    host_us: float = Field(description="host time per step() call, measured without synchronizing")
    baseline_median_us: float | None = None
    baseline_samples_us: list[float] = []
    speedup: float | None = None
    sample_checks: list[SampleCheck] = Field([], description="per timed sample of a candidate: its verification")
    sample_loads: list[str] = Field([], description="where several evaluations' samples are pooled (a confirmed "
                                    "version): the module load (EvalResult.placement) each sample ran from, in "
                                    "order; one load's code placement biases its samples alike. Empty: one load")

    @model_validator(mode="after")
    def _loads_name_every_sample(self) -> TimingResult:
        if self.sample_loads and len(self.sample_loads) != len(self.samples_us):
            raise ValueError(f"{len(self.sample_loads)} sample_loads for {len(self.samples_us)} samples")
        return self

    def groups(self) -> list[list[float]]:
        """samples_us grouped by the module load each ran from, loads in order of first use."""
        return by_load(list(zip(self.sample_loads or [""] * len(self.samples_us), self.samples_us, strict=True)))


def by_load(samples: list[tuple[str, float]]) -> list[list[float]]:
    """(load, sample) pairs grouped by load, in order of first use; samples of one load share its code placement."""
    groups: dict[str, list[float]] = {}
    for load, x in samples:
        groups.setdefault(load, []).append(x)
    return list(groups.values())


class LaunchCount(BaseModel):
    kernels: int
    names: list[str] = []
    memcpys: int = 0


class DeviceInfo(BaseModel):
    name: str
    sms: int
    memory_gb: float
    l2_mb: float
    copy_tbs: float = Field(description="measured device-to-device copy bandwidth, read + write bytes")
    driver: str
    cuda: str
    torch: str
    cupy: str
    capability: str
    uuid: str = Field("", description="the GPU's UUID (nvidia-smi -L): which physical GPU every timing was made on")


class PhaseRow(BaseModel):
    """One phase of a step as its stamps show it (medians over the profiled steps)."""

    name: str
    span_us: float = Field(description="critical path: first release into the phase to the last arrival after it")
    mean_us: float = Field(description="the average block's own work: its release to its arrival")
    wait_us: float = Field(description="the barrier after it: last arrival to first release (0 after the last phase)")
    bytes: int = Field(description="what the phase must move, by the task's bytes model")
    tbs: float = Field(description="bytes / span, TB/s")
    events: dict[str, float] = Field({}, description="µs from a block's release to each event it stamped, mean "
                                                     "over the blocks that stamped it")
    critical: dict[str, float] = Field({}, description="the critical block's (last to arrive) 'released' (µs from "
                                                       "the phase's first release), events and 'arrived' (µs from "
                                                       "its own release)")


# What a stamped build costs the step it profiles (BENCHMARKS.md, forty-sixth session: 1.8-2.3 µs/token for the
# seed, 0.4 for another kernel): every place that shows a timeline says it.
STAMP_COST = "its stamps cost ~2 µs per step, unevenly between kernels"


class PhaseTimeline(BaseModel):
    """Where one step's time goes, phase by phase, at one context (from a -DPHASE_STAMPS=1 build)."""

    ctx: int
    steps: int = Field(description="profiled steps the medians are over")
    blocks: int = Field(description="blocks whose stamps were read")
    rows: list[PhaseRow]
    kernel_us: float = Field(description="sum of the spans and waits: the kernel's first start to its last end")
    chained: bool = Field(False, description="the steps ran back to back, as a timed chain runs them; false: each "
                                             "alone, after a synchronize (sandbox/profile.py); their phases agree "
                                             "within ~0.5 µs, the chained kernel 1-3 µs shorter")

    @property
    def steps_kind(self) -> str:
        """How the steps ran: 'chained' (back to back, as timed) or 'isolated' (each alone)."""
        return "chained" if self.chained else "isolated"


class EvalResult(BaseModel):
    """Everything one evaluation produced; `failure` is None only when build, checks, timing and profile all passed."""

    task: str
    size: str
    key: str
    knobs: dict[str, int] = {}
    build: BuildResult | None = None
    check: CheckResult | None = None
    timings: list[TimingResult] = []
    launches: LaunchCount | None = None
    failure: Failure | None = None
    phase_seconds: dict[str, float] = {}
    phases: list[PhaseTimeline] = Field([], description="phase timelines of the profiled contexts")
    device: DeviceInfo | None = None
    worker_pid: int | None = None
    placement: str = Field("", description="the module load the evaluation ran from: worker pid, build key, load "
                                           "index (sandbox.build.Placements); empty in traces before 2026-12-07's "
                                           "forty-eighth session, where every evaluation had a load of its own")

    @property
    def ok(self) -> bool:
        return self.failure is None

    def median_us(self, ctx: int) -> float | None:
        return next((t.median_us for t in self.timings if t.ctx == ctx), None)

    def loaded_samples(self, ctx: int, fallback: str) -> list[tuple[str, float]]:
        """The timing at `ctx` as (load, sample) pairs: its own sample_loads where it pools several evaluations,
        else this evaluation's placement for every sample, or `fallback` (unique to this evaluation) where the
        placement was not recorded."""
        t = next((t for t in self.timings if t.ctx == ctx), None)
        if t is None:
            return []
        return list(zip(t.sample_loads or [self.placement or fallback] * len(t.samples_us), t.samples_us, strict=True))

    def median_by_ctx(self) -> dict[int, float]:
        return {t.ctx: t.median_us for t in self.timings}
