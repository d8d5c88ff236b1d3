"""Honest timing: CUDA events on the launch stream around many chained steps, after warm-up; for a
candidate, every timed sample is verified.

A sample is a chain as decoding runs it: the state carries from step to step and every step gets a
fresh token. A candidate may tell a timed launch from a checked one in many ways (context length,
poisoned buffers, counters in its globals or scratch, the clock). So timing does not rely on looking
alike. Each sample times a chain from fresh inputs drawn like the checker's (a new seed, poisoned the
same way), after a warm-up on a throwaway chain of its own (the timed tokens do not exist before the
timed window, so no work can be done on them ahead of it). Every step writes its output to a buffer of
its own. The chain is then replayed untimed from a copy of its inputs kept in host memory, which no kernel
can address (device copies could be found and rewritten by the kernel under test, e.g. all zeroed so that
doing nothing matches), and the timed run's end state is copied out first (a binding may hand out views of
buffers that the replay rewrites): every output and the final state
must be bit-identical to the timed run's, the rows of the cache the chain started with must be
untouched, and one step, picked only after the timed run and not marked in any way the kernel could see
in its buffers, is checked against the fp32 reference from the candidate's own state before it. A kernel
that works on fewer steps than it is timed on fails the check on one of them as often as it skips one
(each of 21 samples per evaluation picks anew); one that behaves differently when timed ends differently
from its replay.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from megakernel_agent.tasks.base import Task, clone_state
from megakernel_agent.traces.results import SampleCheck, TimingResult

from .checks import describe, worst_line
from .stats import spread


def _chain(task: Task, seed: int, ctx: int, length: int, device) -> tuple[list[torch.Tensor], list]:
    """Inputs of a chain of `length` steps from `ctx`: a token per step (as decoding feeds them; a step's
    output is not its successor's input, which would grow the residual stream without bound) and the state."""
    hidden, state = task.make_inputs(seed, ctx, device)
    return [hidden] + [task.make_token(seed + i, device) for i in range(1, length)], state


class HostCopy:
    """A tensor's bytes in host memory that no kernel can address (pageable numpy, not pinned or mapped). The
    replay's inputs are rebuilt from these after the timed run: device copies made before it could have been
    found and rewritten by the kernel under test (e.g. every input zeroed, so that doing nothing matches)."""

    def __init__(self, t: torch.Tensor):
        self.dtype, self.shape = t.dtype, t.shape
        self.data = t.detach().to("cpu", copy=True).contiguous().reshape(-1).view(torch.uint8).numpy()

    def tensor(self, device) -> torch.Tensor:
        return torch.from_numpy(self.data).view(self.dtype).reshape(self.shape).to(device, copy=True)


def _run(model, tokens: list[torch.Tensor], state, outs: list[torch.Tensor] | None = None):
    """(last output, state) after a step per token; step i writes to outs[i] when given."""
    out = None
    for i, token in enumerate(tokens):
        out, state = model.step(token, state) if outs is None else model.step(token, state, out=outs[i])
    return out, state


def _timed(model, tokens: list[torch.Tensor], state, stream, outs: list[torch.Tensor] | None = None):
    """(µs per step by CUDA events on the launch stream, host µs per step() call, state)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    t0 = time.perf_counter()
    _, state = _run(model, tokens, state, outs)
    host = time.perf_counter() - t0
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / len(tokens), host * 1e6 / len(tokens), state


def _poisoned_outputs(tokens: list[torch.Tensor]) -> list[torch.Tensor]:
    """One NaN-filled output buffer per step (fresh allocations: 16-byte aligned)."""
    return [torch.full_like(t, float("nan")) for t in tokens]


def time_steps(task: Task, model, ctx: int, seed: int, steps: int, samples: int, warmup: int,
               device: torch.device) -> tuple[list[float], list[float]]:
    """Our own models (the baseline): (µs per step per sample, host µs per step per sample), each sample
    a fresh chain whose timed steps run at ctx .. ctx + steps - 1."""
    stream = torch.cuda.current_stream(device)
    start_ctx = ctx - warmup if ctx >= warmup else ctx
    gpu_us, host_us = [], []
    for i in range(samples):
        tokens, state = _chain(task, seed + 1000 * i, start_ctx, warmup + steps, device)
        _, state = _run(model, tokens[:warmup], state)
        torch.cuda.synchronize(device)
        gpu, host, _ = _timed(model, tokens[warmup:], state, stream)
        gpu_us.append(gpu)
        host_us.append(host)
    return gpu_us, host_us


def time_candidate(task: Task, model, checker, ctx: int, steps: int, samples: int, warmup: int,
                   device: torch.device, rng: random.Random | None = None
                   ) -> tuple[list[float], list[float], list[SampleCheck]]:
    """A candidate's samples at `ctx` (timed steps at ctx .. ctx + steps - 1), each verified; stops at the
    first sample that fails verification."""
    rng = rng or random.SystemRandom()
    stream = torch.cuda.current_stream(device)
    gpu_us, host_us, checks = [], [], []
    for _ in range(samples):
        seed = rng.randrange(1, 2**31 - 2 * (steps + warmup))
        warm_tokens, warm_state = _chain(task, seed + steps, ctx, warmup, device)   # a throwaway chain
        checker.poison(warm_state)
        _run(model, warm_tokens, warm_state, _poisoned_outputs(warm_tokens))
        tokens, pristine = _chain(task, seed, ctx, steps, device)
        kept = [HostCopy(t) for t in tokens], [{k: HostCopy(v) for k, v in st.items()} for st in pristine]
        outs, state = _poisoned_outputs(tokens), clone_state(pristine)
        del pristine   # what the replay starts from is rebuilt from `kept`, after the timed run
        checker.poison(state)
        torch.cuda.synchronize(device)
        gpu, host, state = _timed(model, tokens, state, stream, outs)
        state = clone_state(state)   # the timed run's own end: a binding may hand out views the replay rewrites
        kept_tokens = [t.tensor(device) for t in kept[0]]
        written = [i for i, (a, b) in enumerate(zip(tokens, kept_tokens, strict=True)) if not _same_bits(a, b)]
        check = (_verify(task, checker, kept_tokens, kept[1], (outs, state), seed, ctx, rng.randrange(steps))
                 if not written else _tampered(seed, ctx, f"the kernel wrote into its input tokens {written[:4]}"))
        checks.append(check)
        gpu_us.append(gpu)
        host_us.append(host)
        if not check.passed:
            break
    return gpu_us, host_us, checks


def _pristine(kept: list[dict[str, HostCopy]], device) -> list[dict[str, torch.Tensor]]:
    return [{k: v.tensor(device) for k, v in st.items()} for st in kept]


def _verify(task: Task, checker, tokens, kept: list[dict[str, HostCopy]], timed, seed: int, ctx: int,
            verified: int) -> SampleCheck:
    """Replay the chain from the host's copy of its state exactly as it was timed, keeping the state around
    step `verified`; then compare the replay with the timed run bit for bit, the cache rows the chain was
    given with that copy (fetched again: the replay's kernel ran since), and that step with the reference."""
    device = tokens[0].device
    outs, state = _poisoned_outputs(tokens), _pristine(kept, device)
    checker.poison(state)
    before = after = None
    for i, token in enumerate(tokens):
        if i == verified:
            before = clone_state(state)
        _, state = checker.cand.step(token, state, out=outs[i])
        if i == verified:
            after = clone_state(state)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    timed_outs, timed_state = timed
    differing = [f"out[{i}]" for i, (a, b) in enumerate(zip(timed_outs, outs, strict=True)) if not _same_bits(a, b)]
    differing += _state_differences(timed_state, state)
    changed = [k for k, same in task.untouched(_pristine(kept, device), state, ctx).items() if not same]
    slack = task.spec.continuation_slack if verified else 1.0   # step 0 runs from the fresh state, not its own
    case = checker.judge("timed", seed, ctx + verified, tokens[verified], before, outs[verified], after, verified,
                         slack)
    message = ""
    if differing:
        message = (f"the timed run ended differently from its untimed replay in {differing[:4]}: the kernel does "
                   "not compute the same result when timed")
    elif changed:
        message = f"the chain changed {changed} of the state it was given, which must stay bit-identical"
    elif not case.passed:
        message = describe(case)
    passed = not message
    return SampleCheck(seed=seed, start_ctx=ctx, verified_step=verified, replay_identical=not differing,
                       passed=passed, worst=worst_line(case), message=message, case=None if passed else case)


def _tampered(seed: int, ctx: int, message: str) -> SampleCheck:
    return SampleCheck(seed=seed, start_ctx=ctx, verified_step=-1, replay_identical=False, passed=False,
                       message=message)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (NaN payloads included): the raw bytes, not the values, are compared."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _state_differences(a: list, b: list) -> list[str]:
    """Names of the state tensors that differ in any bit between two ends of a chain."""
    out = []
    for i, (la, lb) in enumerate(zip(a, b, strict=True)):
        out += [f"L{i}.{k}" for k in la if not _same_bits(la[k], lb[k])]
    return out


def timing_result(task: Task, ctx: int, steps: int, samples: list[float], host: list[float], copy_tbs: float,
                  baseline: list[float] | None, sample_checks: list[SampleCheck] | None = None) -> TimingResult:
    med = statistics.median(samples)
    nbytes = task.spec.bytes_per_step[ctx]
    achieved = nbytes / (med * 1e-6) / 1e12
    base_med = statistics.median(baseline) if baseline else None
    return TimingResult(
        ctx=ctx, steps_per_sample=steps, samples_us=samples, median_us=med, spread=spread(samples),
        tok_s=1e6 / med, bytes_per_step=nbytes, achieved_tbs=achieved, roofline=achieved / copy_tbs,
        host_us=statistics.median(host), baseline_median_us=base_med, baseline_samples_us=baseline or [],
        speedup=base_med / med if base_med else None, sample_checks=sample_checks or [],
    )
