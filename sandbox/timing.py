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
untouched, and some of its steps, picked only after the timed run and not marked in any way the kernel could
see in its buffers, are checked against the fp32 reference from the candidate's own state before each. The
samples of a context start at the same position, and between them every step is checked (20 steps over 7
samples: 3 each, in a random order). A kernel that works on fewer steps than it is timed on is caught at
every position it skips, whatever the rule it skips by (one random step per sample let a kernel that skipped
one position in 20 pass an evaluation about a third of the time); one that behaves differently when timed
ends differently from its replay. Not closed: within the timed
window every token of the chain is in device memory from its first step, so a kernel that found them could
work on later steps early (with correct results).
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
    """A candidate's samples at `ctx` (timed steps at ctx .. ctx + steps - 1), each verified; stops at the
    first sample that fails verification."""
    rng = rng or random.SystemRandom()
    stream = torch.cuda.current_stream(device)
    gpu_us, host_us, checks = [], [], []
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
        check = (_verify(task, checker, kept_tokens, kept_state, timed, seed, ctx, verified, device)
                 if not written else _tampered(seed, ctx, f"the kernel wrote into its input tokens {written[:4]}"))
        checks.append(check)
        gpu_us.append(gpu)
        host_us.append(host)
        if not check.passed:
            break
    return gpu_us, host_us, checks


def _settle(device) -> None:
    """Wait for every stream of `device`: a binding may launch on a stream of its own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _verify(task: Task, checker, kept_tokens: list[torch.Tensor], kept_state: list, timed, seed: int, ctx: int,
            verified: list[int], device) -> SampleCheck:
    """Replay the chain from host copies of its inputs exactly as it was timed; then compare the replay with the
    timed run bit for bit, the cache rows the chain was given with their host copy, and each step in `verified`
    with the reference. Everything the verdict reads is copied to the host the moment it
    exists (the state before and after a checked step, that step's output, the replay's end), and the reference
    starts from fresh device copies of those after the replay, when the kernel runs no more: a kernel may rewrite
    any device buffer it can find during any step, and could undo after a check what it did before it (the
    reference's weights are compared with their start-up fingerprints only after the evaluation)."""
    tokens = _on(kept_tokens, device)
    outs, state = _poisoned_outputs(tokens), _on(kept_state, device)
    checker.poison(state)
    bounds = {i for i in verified} | {i + 1 for i in verified}   # the state before step i (len(tokens): the end)
    states, step_outs = {}, {}
    for i, token in enumerate(tokens):
        if i in bounds:
            _settle(device)
            states[i] = _host(state)
        _, state = checker.cand.step(token, state, out=outs[i])
        if i in verified:
            _settle(device)
            step_outs[i] = _host(outs[i])
    _settle(device)
    replay_outs, replay_state = _host(outs), _host(state)
    states[len(tokens)] = replay_state
    timed_outs, timed_state = timed
    differing = [f"out[{i}]" for i, (a, b) in enumerate(zip(timed_outs, replay_outs, strict=True))
                 if not _same_bits(a, b)]
    differing += _state_differences(timed_state, replay_state)
    written = [i for i, (a, b) in enumerate(zip(_host(tokens), kept_tokens, strict=True)) if not _same_bits(a, b)]
    changed = [k for k, same in task.untouched(kept_state, replay_state, ctx).items() if not same]
    cases = {}
    for i in verified:   # step 0 runs from the fresh state, not its own: no continuation slack
        cases[i] = checker.judge("timed", seed, ctx + i, _on(kept_tokens[i], device), _on(states[i], device),
                                 _on(step_outs[i], device), _on(states[i + 1], device), i,
                                 task.spec.continuation_slack if i else 1.0)
        if not cases[i].passed:
            break
    case = next((c for c in cases.values() if not c.passed), cases[verified[0]])
    message = ""
    if written:
        message = f"the kernel wrote into its input tokens {written[:4]} in the untimed replay"
    elif differing:
        message = (f"the timed run ended differently from its untimed replay in {differing[:4]}: the kernel does "
                   "not compute the same result when timed")
    elif changed:
        message = f"the chain changed {changed} of the state it was given, which must stay bit-identical"
    elif not case.passed:
        message = describe(case)
    passed = not message
    return SampleCheck(seed=seed, start_ctx=ctx, verified_step=case.step, checked_steps=verified,
                       replay_identical=not differing, passed=passed, worst=worst_line(case), message=message,
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
