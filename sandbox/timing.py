"""Honest timing: CUDA events on the launch stream around many chained steps, after warm-up; for a
candidate, every timed sample is verified.

A sample is a chain as decoding runs it: the state carries from step to step and every step gets a
fresh token. A candidate may tell a timed launch from a checked one in many ways (context length,
poisoned buffers, counters in its globals or scratch, the clock). So timing does not rely on looking
alike. Each sample times a chain from fresh inputs drawn like the checker's (a new seed, poisoned the
same way), after a warm-up on a throwaway chain of its own (the timed tokens do not exist before the
timed window, so no work can be done on them ahead of it). Every step writes its output to a buffer of
its own. The chain is then replayed untimed from a copy of its inputs kept in host memory, which no kernel
can address: a kernel may find and rewrite any device buffer, so everything the verdict reads (the inputs,
the timed run's outputs and end state, the replay's state around the step it checks) is copied to the host
the moment it exists (device copies were once all zeroed by a red team's kernel, so that doing nothing
matched; and a binding may hand out views of buffers that the replay rewrites). Every output and the final state
must be bit-identical to the timed run's, the rows of the cache the chain started with must be
untouched, and some of its steps are checked against the fp32 reference from the candidate's own state
before each. The samples of a context start at the same position, and between them every step is checked
(20 steps over 7 samples: 3 each, in an order drawn on the host). A kernel that works on fewer steps than it is
timed on is caught at every position it skips, whatever the rule it skips by (one random step per sample let a
kernel that skipped one position in 20 pass an evaluation about a third of the time), as long as it cannot
learn the order: the replay copies every step's state and output to the host alike, and the checks run after
the context's last replay (a red team's kernel read the checked steps from the replay's pauses, and with them
the steps later samples would check, and skipped half its work). One that behaves differently when timed ends
differently from its replay. Not closed: within the timed window every token of the chain is in device memory
from its first step, so a kernel that found them could work on later steps early (with correct results).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

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


def _host(x):
    """A copy of a tensor (or of a list / dict of them) in pageable host memory, which no kernel can address."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: _host(v) for k, v in x.items()}
    return [_host(v) for v in x]


def _on(x, device):
    """A fresh device copy of what _host kept."""
    if isinstance(x, torch.Tensor):
        return x.to(device, copy=True)
    if isinstance(x, dict):
        return {k: _on(v, device) for k, v in x.items()}
    return [_on(v, device) for v in x]


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
    """A candidate's samples at `ctx` (timed steps at ctx .. ctx + steps - 1), each replayed, then all checked
    against the reference; stops at the first sample that fails."""
    rng = rng or random.SystemRandom()
    stream = torch.cuda.current_stream(device)
    gpu_us, host_us, replayed = [], [], []
    order, per = rng.sample(range(steps), steps), -(-steps // samples)   # every step checked in some sample
    for n in range(samples):
        seed = rng.randrange(1, 2**31 - 2 * (steps + warmup))
        warm_tokens, warm_state = _chain(task, seed + steps, ctx, warmup, device)   # a throwaway chain
        checker.poison(warm_state)
        _run(model, warm_tokens, warm_state, _poisoned_outputs(warm_tokens))
        tokens, pristine = _chain(task, seed, ctx, steps, device)
        kept_tokens, kept_state = _host(tokens), _host(pristine)   # the replay's inputs, out of the kernel's reach
        outs, state = _poisoned_outputs(tokens), clone_state(pristine)
        del pristine
        checker.poison(state)
        torch.cuda.synchronize(device)
        gpu, host, state = _timed(model, tokens, state, stream, outs)
        _settle(device)
        timed = _host(outs), _host(state)   # before the kernel runs again: it knows these buffers
        written = [i for i, (a, b) in enumerate(zip(_host(tokens), kept_tokens, strict=True)) if not _same_bits(a, b)]
        verified = sorted({order[(n * per + j) % steps] for j in range(per)})
        sample = (_replay(task, checker, kept_tokens, kept_state, timed, seed, ctx, verified, device) if not written
                  else _tampered(seed, ctx, f"the kernel wrote into its input tokens {written[:4]}"))
        replayed.append(sample)
        gpu_us.append(gpu)
        host_us.append(host)
        if isinstance(sample, SampleCheck) or sample.failure:
            break
    checks = []
    for sample in replayed:   # after the context's last kernel run: no later run can learn which steps were checked
        checks.append(sample if isinstance(sample, SampleCheck) else _judge(task, checker, sample, device))
        if not checks[-1].passed:
            break
    return gpu_us[:len(checks)], host_us[:len(checks)], checks


def _settle(device) -> None:
    """Wait for every stream of `device`: a binding may launch on a stream of its own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Replayed:
    """A sample's untimed replay, its reference checks still to come: what they read, in host memory."""

    seed: int
    ctx: int
    tokens: list[torch.Tensor]
    verified: list[int]               # the steps to check against the reference
    states: dict[int, list]           # the state before step i (i = the chain's length: its end), around them
    outs: dict[int, torch.Tensor]     # their outputs, as each stood right after its step
    failure: str                      # why the replay already refuses the sample ("" if it does not)
    replay_identical: bool


def _replay(task: Task, checker, kept_tokens: list[torch.Tensor], kept_state: list, timed, seed: int, ctx: int,
            verified: list[int], device) -> _Replayed:
    """Replay the chain from host copies of its inputs exactly as it was timed, and compare it with the timed run
    bit for bit, and the cache rows the chain was given with their host copy. Every step's state before it and
    output after it are copied to the host, whichever steps are checked, so the kernel cannot tell which (nor, as
    the checks cover every step between a context's samples, which steps later samples will check); only those
    around the steps in `verified` are kept. A kernel may rewrite any device buffer it can find, during any step."""
    tokens = _on(kept_tokens, device)
    outs, state = _poisoned_outputs(tokens), _on(kept_state, device)
    checker.poison(state)
    bounds = set(verified) | {i + 1 for i in verified}
    states, step_outs = {}, {}
    for i, token in enumerate(tokens):
        _settle(device)
        before = _host(state)
        if i in bounds:
            states[i] = before
        _, state = checker.cand.step(token, state, out=outs[i])
        _settle(device)
        out = _host(outs[i])
        if i in verified:
            step_outs[i] = out
    _settle(device)
    replay_outs, replay_state = _host(outs), _host(state)
    states[len(tokens)] = replay_state
    timed_outs, timed_state = timed
    differing = [f"out[{i}]" for i, (a, b) in enumerate(zip(timed_outs, replay_outs, strict=True))
                 if not _same_bits(a, b)]
    differing += _state_differences(timed_state, replay_state)
    written = [i for i, (a, b) in enumerate(zip(_host(tokens), kept_tokens, strict=True)) if not _same_bits(a, b)]
    changed = [k for k, same in task.untouched(kept_state, replay_state, ctx).items() if not same]
    failure = ""
    if written:
        failure = f"the kernel wrote into its input tokens {written[:4]} in the untimed replay"
    elif differing:
        failure = (f"the timed run ended differently from its untimed replay in {differing[:4]}: the kernel does "
                   "not compute the same result when timed")
    elif changed:
        failure = f"the chain changed {changed} of the state it was given, which must stay bit-identical"
    return _Replayed(seed=seed, ctx=ctx, tokens=kept_tokens, verified=verified, states=states, outs=step_outs,
                     failure=failure, replay_identical=not differing)


def _judge(task: Task, checker, r: _Replayed, device) -> SampleCheck:
    """Check the replayed steps `r.verified` against the fp32 reference, each from fresh device copies of the state
    before it and of the step's output. Run after the context's last replay, so no later run in this context can
    learn which steps were checked. Not closed: the weight guard compares the reference's weights only after the
    whole evaluation, so a kernel that changed them before a check could undo that in a later context's runs."""
    cases = []
    for i in r.verified:   # step 0 runs from the fresh state, not its own: no continuation slack
        cases.append(checker.judge("timed", r.seed, r.ctx + i, _on(r.tokens[i], device), _on(r.states[i], device),
                                   _on(r.outs[i], device), _on(r.states[i + 1], device), i,
                                   task.spec.continuation_slack if i else 1.0))
        if not cases[-1].passed:
            break
    case = cases[-1] if not cases[-1].passed else cases[0]
    message = r.failure or ("" if case.passed else describe(case))
    passed = not message
    return SampleCheck(seed=r.seed, start_ctx=r.ctx, verified_step=case.step, checked_steps=r.verified,
                       replay_identical=r.replay_identical, passed=passed, worst=worst_line(case), message=message,
                       case=None if passed else case)


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
