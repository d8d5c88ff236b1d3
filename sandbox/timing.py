"""Honest timing: CUDA events on the launch stream around many chained steps, after warm-up; for a
candidate, every timed sample is verified.

A sample is a chain as decoding runs it: the state carries from step to step and every step gets a
fresh token. A candidate may tell a timed launch from a checked one in many ways (context length,
poisoned buffers, counters in its globals or scratch, the clock). So timing does not rely on looking
alike: each sample starts from fresh inputs drawn like the checker's (a new seed, poisoned the same
way), runs its warm-up and timed steps as one chain, and is then replayed untimed from a copy of
those inputs. The replay must end bit-identical to the timed run (same outputs, same state), and one of
its timed steps, picked only after the timed run, is checked against the fp32 reference from the
candidate's own state before that step. A kernel that does less work when timed ends differently
from its replay or fails that check; one that does the same work in both is what was timed.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from tasks.base import Task, clone_state
from traces.results import CheckCase, SampleCheck, TimingResult

from .checks import describe, worst_line
from .stats import spread


def _chain(task: Task, seed: int, ctx: int, length: int, device) -> tuple[list[torch.Tensor], list]:
    """Inputs of a chain of `length` steps from `ctx`: a token per step (as decoding feeds them; a step's
    output is not its successor's input, which would grow the residual stream without bound) and the state."""
    hidden, state = task.make_inputs(seed, ctx, device)
    return [hidden] + [task.make_token(seed + i, device) for i in range(1, length)], state


def _run(model, tokens: list[torch.Tensor], state) -> tuple[torch.Tensor | None, list]:
    out = None
    for token in tokens:
        out, state = model.step(token, state)
    return out, state


def _timed(model, tokens: list[torch.Tensor], state, stream) -> tuple[float, float, torch.Tensor, list]:
    """(µs per step by CUDA events on the launch stream, host µs per step() call, last output, state)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    t0 = time.perf_counter()
    out, state = _run(model, tokens, state)
    host = time.perf_counter() - t0
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / len(tokens), host * 1e6 / len(tokens), out, state


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
        gpu, host, _, _ = _timed(model, tokens[warmup:], state, stream)
        gpu_us.append(gpu)
        host_us.append(host)
    return gpu_us, host_us


def time_candidate(task: Task, model, checker, ctx: int, steps: int, samples: int, warmup: int,
                   device: torch.device, rng: random.Random | None = None
                   ) -> tuple[list[float], list[float], list[SampleCheck]]:
    """A candidate's samples at `ctx`, each verified; stops at the first sample that fails verification.

    A chain starts `warmup` tokens before `ctx`, so its timed steps run at ctx .. ctx + steps - 1.
    """
    rng = rng or random.SystemRandom()
    stream = torch.cuda.current_stream(device)
    start_ctx = ctx - warmup if ctx >= warmup else ctx
    gpu_us, host_us, checks = [], [], []
    for _ in range(samples):
        seed = rng.randrange(1, 2**31 - steps - warmup)
        tokens, state = _chain(task, seed, start_ctx, warmup + steps, device)
        pristine = clone_state(state)
        checker.poison(state)
        _, state = _run(model, tokens[:warmup], state)
        torch.cuda.synchronize(device)
        gpu, host, out, state = _timed(model, tokens[warmup:], state, stream)
        timed_end = (out.clone(), clone_state(state))
        check = _verify(checker, tokens, pristine, timed_end, seed, start_ctx, warmup + rng.randrange(steps))
        checks.append(check)
        gpu_us.append(gpu)
        host_us.append(host)
        if not check.passed:
            break
    return gpu_us, host_us, checks


def _verify(checker, tokens, state, timed_end, seed: int, start_ctx: int, verified: int) -> SampleCheck:
    """Replay the chain from its pristine `state`; step `verified` is checked against the reference."""
    checker.poison(state)
    case: CheckCase | None = None
    out = None
    for i, token in enumerate(tokens):
        if i == verified:
            case, out, state = checker.chained_case("timed", seed, start_ctx + i, token, state, i)
        else:
            out, state = checker.cand.step(token, state)
    torch.cuda.synchronize()
    differing = _differences(timed_end, (out, state))
    message = (f"the timed run ended differently from its untimed replay in {differing[:4]}: the kernel does "
               "not compute the same result when timed" if differing else "")
    passed = case.passed and not differing
    message = message or ("" if case.passed else describe(case))
    return SampleCheck(seed=seed, start_ctx=start_ctx, verified_step=verified, replay_identical=not differing,
                       passed=passed, worst=worst_line(case), message=message, case=None if passed else case)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (NaN payloads included): the raw bytes, not the values, are compared."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _differences(a, b) -> list[str]:
    """Names of the tensors (last output, then every state tensor) that differ in any bit between two ends."""
    (ha, sa), (hb, sb) = a, b
    out = [] if _same_bits(ha, hb) else ["out"]
    for i, (la, lb) in enumerate(zip(sa, sb, strict=True)):
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
