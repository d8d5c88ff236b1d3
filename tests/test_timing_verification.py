"""Verified timing (sandbox.timing) on the CPU, with the real small task, reference and checker and scripted
candidates: an honest one passes every sample; one that skips work on some timed steps, restores its state
before the chain ends, or behaves differently when timed, is refused. CUDA events are replaced by a count of
the real steps in the timed window (the 'µs' below)."""

import random

import pytest
import torch

import megakernel_agent.sandbox.timing as timing
from megakernel_agent.sandbox.checks import Checker
from megakernel_agent.tasks.base import clone_state
from megakernel_agent.tasks.kimi_linear.inputs import build_model
from megakernel_agent.tasks.kimi_linear.reference import ReferenceModel
from megakernel_agent.tasks.registry import get_task

CTX, STEPS, WARMUP, SAMPLES = 12, 6, 2, 8
CPU = torch.device("cpu")
TASK = get_task("kimi_linear", "small")


class Candidate:
    """The reference as a candidate, writing each output where the caller asks; `real(pos, out)` decides
    whether a step does the work (else it appends a zero cache row and copies its input: finite, cheap)."""

    def __init__(self, real=lambda pos, out: True):
        self.ref = build_model(ReferenceModel, TASK.cfg, seed=0, device=CPU)
        self.real, self.real_steps, self.calls = real, 0, 0
        self.ring = torch.zeros(TASK.cfg.hidden, dtype=torch.bfloat16)
        self.mla = [i for i, k in enumerate(TASK.cfg.pattern) if k == "M"]

    def poison(self, state):
        self.ring.fill_(float("nan"))

    def step(self, hidden, state, out=None):
        self.calls += 1
        out = self.ring if out is None else out
        pos = state[self.mla[0]]["c_kv"].shape[0]
        if self.real(pos, out):
            self.real_steps += 1
            result, state = self.ref.step(hidden.clone(), state)
        else:
            for i in self.mla:
                for k in ("c_kv", "k_rope"):
                    v = state[i][k]
                    state[i][k] = torch.cat([v, v.new_zeros(1, v.shape[1])], 0)
            result = hidden
        out.copy_(result)
        return out, state


def run(monkeypatch, cand, rng=None):
    def counted(model, tokens, state, stream, outs=None):
        before = model.real_steps
        _, state = timing._run(model, tokens, state, outs)
        return float(model.real_steps - before), 0.0, state

    monkeypatch.setattr(timing, "_timed", counted)
    monkeypatch.setattr(timing.torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda device=None: None)
    checker = Checker(TASK, build_model(ReferenceModel, TASK.cfg, seed=0, device=CPU), cand, CPU)
    return timing.time_candidate(TASK, cand, checker, CTX, STEPS, SAMPLES, WARMUP, CPU, rng=rng or random.Random(3))


def test_an_honest_candidate_passes_every_sample_with_every_output_compared(monkeypatch):
    real, _, checks = run(monkeypatch, Candidate())
    assert real == [float(STEPS)] * SAMPLES
    assert all(c.passed and c.replay_identical for c in checks)
    assert len({c.verified_step for c in checks}) > 1 and len({c.seed for c in checks}) == SAMPLES


def test_skipping_work_on_every_other_timed_step_is_refused(monkeypatch):
    real, _, checks = run(monkeypatch, Candidate(real=lambda pos, out: (pos - CTX) % 2 == 0))
    assert not checks[-1].passed and "timed" in checks[-1].message


@pytest.mark.parametrize("seed", [0, 1, 8])
def test_skipping_one_position_in_a_chain_is_refused_whatever_steps_are_picked(monkeypatch, seed):
    """A hostile attempt (52nd session): skip the work of one position in STEPS, keyed on the position alone. With
    one random step checked per sample it passed 2 of 10 evaluations here (rng seeds 0 and 8); now a context's
    samples check every position between them, so it is refused at every seed."""
    cand = Candidate(real=lambda pos, out: pos % STEPS != STEPS - 1)
    _, _, checks = run(monkeypatch, cand, rng=random.Random(seed))
    assert not checks[-1].passed and "timed" in checks[-1].message
    assert (CTX + checks[-1].verified_step) % STEPS == STEPS - 1


def test_a_context_s_samples_check_every_step_between_them(monkeypatch):
    _, _, checks = run(monkeypatch, Candidate(), rng=random.Random(8))
    assert all(c.passed for c in checks)
    assert set().union(*(c.checked_steps for c in checks)) == set(range(STEPS))
    assert all(c.verified_step in c.checked_steps for c in checks)


def test_the_replay_treats_every_step_alike_whichever_are_checked(monkeypatch):
    """A red team's kernel (52nd session) read which steps a sample checked from the replay's pauses (a host copy of
    the state only around the checked steps), and from those the steps later samples would check, and skipped half
    its work. Between any two replayed steps the host now does the same, whichever steps are checked."""
    log = []
    settle, host = timing._settle, timing._host
    monkeypatch.setattr(timing, "_settle", lambda device: (log.append("settle"), settle(device))[1])
    monkeypatch.setattr(timing, "_host", lambda x: (log.append("host"), host(x))[1])

    class Logged(Candidate):
        def step(self, hidden, state, out=None):
            log.append("step")
            return super().step(hidden, state, out)

    cand = Logged()
    checker = Checker(TASK, build_model(ReferenceModel, TASK.cfg, seed=0, device=CPU), cand, CPU)
    tokens, pristine = timing._chain(TASK, 5, CTX, STEPS, CPU)
    kept_tokens, kept_state = timing._host(tokens), timing._host(pristine)
    timed = timing._host(timing._poisoned_outputs(tokens)), timing._host(pristine)
    patterns = []
    for verified in ([0], [STEPS - 1], [1, 3]):
        log.clear()
        timing._replay(TASK, checker, kept_tokens, kept_state, timed, 5, CTX, verified, CPU)
        steps = "|".join(log).split("step")
        patterns.append(steps[1:-1])   # between two replayed steps
        assert len(set(steps[1:-1])) == 1
    assert patterns[0] == patterns[1] == patterns[2]


def test_working_only_where_the_buffer_looks_checked_gains_nothing(monkeypatch):
    """The red team's cheat: real work only on a poisoned output buffer. Every step's buffer is poisoned,
    timed or replayed, so the kernel cannot skip anything; it did all the work and passed."""
    real, _, checks = run(monkeypatch, Candidate(real=lambda pos, out: bool(torch.isnan(out[0]))))
    assert real == [float(STEPS)] * SAMPLES and all(c.passed for c in checks)


def test_a_candidate_that_works_only_at_the_chain_ends_is_refused(monkeypatch):
    ends = {CTX, CTX + STEPS - 1}
    real, _, checks = run(monkeypatch, Candidate(real=lambda pos, out: pos in ends))
    assert not checks[-1].passed


def test_doing_less_when_timed_than_in_the_replay_is_refused(monkeypatch):
    """A kernel that can tell the timed run from its replay (here: it counts its calls) and skips work in
    the first ends differently from the replay."""
    per_sample = STEPS * 2 + WARMUP

    def timed_window(pos, out):   # calls of a sample: warm-up, timed run, replay
        return not (WARMUP <= (cand.calls - 1) % per_sample < WARMUP + STEPS and pos == CTX + 3)

    cand = Candidate(real=timed_window)
    real, _, checks = run(monkeypatch, cand)
    assert not checks[0].passed and not checks[0].replay_identical
    assert "timed run ended differently" in checks[0].message


def test_rewriting_the_cache_it_was_given_is_refused(monkeypatch):
    class Rewriter(Candidate):
        def step(self, hidden, state, out=None):
            out, state = super().step(hidden, state, out)
            for i in self.mla:
                state[i]["c_kv"] = state[i]["c_kv"].clone()
                state[i]["c_kv"][0] = 0   # an old row
            return out, state

    real, _, checks = run(monkeypatch, Rewriter())
    assert not checks[0].passed and ("must stay bit-identical" in checks[0].message or "bit-identical" in
                                     checks[0].message)


@pytest.mark.parametrize("length", [1, 3])
def test_the_chain_keeps_a_token_per_step(length):
    tokens, state = timing._chain(TASK, 5, CTX, length, CPU)
    assert len(tokens) == length and all(t.shape == (TASK.cfg.hidden,) for t in tokens)
    assert state[3]["c_kv"].shape[0] == CTX and clone_state(state)[3]["c_kv"].shape[0] == CTX


def test_writing_into_its_input_tokens_is_refused(monkeypatch):
    class Scribbler(Candidate):
        def step(self, hidden, state, out=None):
            out, state = super().step(hidden, state, out)
            hidden.zero_()   # e.g. to make later inputs predictable
            return out, state

    _, _, checks = run(monkeypatch, Scribbler())
    assert not checks[0].passed and "input tokens" in checks[0].message


def test_the_first_step_of_a_chain_is_judged_at_the_plain_tolerance(monkeypatch):
    class Cycling(random.Random):   # verifies step 0, 1, 2, ... in turn
        picks = iter(range(STEPS * SAMPLES))

        def randrange(self, start, stop=None, step=1):
            return next(self.picks) % STEPS if stop is None else super().randrange(start, stop, step)

    judged = []
    plain_judge = Checker.judge

    def recorded(self, kind, seed, ctx, hidden, before, c_out, c_state, step=0, slack=1.0):
        judged.append((step, slack))
        return plain_judge(self, kind, seed, ctx, hidden, before, c_out, c_state, step, slack)

    monkeypatch.setattr(Checker, "judge", recorded)
    run(monkeypatch, Candidate(), Cycling(5))
    assert (0, 1.0) in judged and (1, TASK.spec.continuation_slack) in judged
    assert all(slack == (1.0 if step == 0 else TASK.spec.continuation_slack) for step, slack in judged)


def _tensors(obj):
    """Every tensor reachable from `obj` through lists, tuples and dicts (what a kernel could find in device memory)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def test_zeroing_every_input_it_can_reach_during_the_timed_run_is_refused(monkeypatch):
    """The red team's cheat (fifty-first session): at the timed run's first step the kernel zeroes every tensor
    of the sample it can find (here: the timing loop's own locals, standing in for addresses found in device
    memory), tokens, state and the copies the replay would start from, then does nothing: with a zero token
    and a zero state the reference's output is exactly zero. The replay's inputs come from host memory, which a
    kernel cannot reach: here, every tensor timing._host made is spared."""
    import sys

    host = set()
    keep = timing._host

    def tagged(x):
        kept = keep(x)
        host.update(t.data_ptr() for t in _tensors(kept))
        return kept

    monkeypatch.setattr(timing, "_host", tagged)

    class Zeroer(Candidate):
        def step(self, hidden, state, out=None):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_name != "time_candidate":
                frame = frame.f_back
            timed = (frame is not None and "_replay" not in {f.f_code.co_name for f in _frames()}
                     and any(out is o for o in frame.f_locals.get("outs") or []))
            zero = not bool(hidden.any()) and not any(bool(t.any()) for t in _tensors(state))
            if timed or zero:   # nothing to do: the output and the new cache rows are zero
                if timed and out is frame.f_locals["outs"][0]:
                    for t in _tensors(list(frame.f_locals.values())):
                        if t.data_ptr() not in host:
                            t.zero_()
                    for t in _tensors(state):
                        t.zero_()
                for i in self.mla:
                    for k in ("c_kv", "k_rope"):
                        v = state[i][k]
                        state[i][k] = torch.cat([v, v.new_zeros(1, v.shape[1])], 0)
                out.zero_()
                return out, state
            return super().step(hidden, state, out)

    def _frames():
        f = sys._getframe()
        while f is not None:
            yield f
            f = f.f_back

    real, _, checks = run(monkeypatch, Zeroer())
    assert real == [0.0] and not checks[0].passed, checks[0]
    assert "ended differently" in checks[0].message or "input tokens" in checks[0].message


def test_the_timed_runs_end_state_is_compared_even_where_the_binding_reuses_its_buffers(monkeypatch):
    """Like the Kimi binding, this candidate hands out its cache as views of buffers it owns and refills them
    from the state it is given, so the replay rewrites what the timed run returned. Its timed run writes a
    wrong new cache row at its last step (the replay writes the right one): before the timed state was copied
    out, it was compared with itself."""
    class Reusing(Candidate):
        def __init__(self):
            super().__init__()
            self.buf = {}

        def step(self, hidden, state, out=None):
            out, state = super().step(hidden, state, out)
            for i in self.mla:
                for k in ("c_kv", "k_rope"):
                    v = state[i][k]
                    buf = self.buf.setdefault((i, k), torch.empty(4 * CTX + 64, v.shape[1], dtype=v.dtype))
                    buf[: v.shape[0]].copy_(v)
                    if self.last_timed_step():
                        buf[v.shape[0] - 1] += 1.0   # the new row, wrong (no timed output reads it)
                    state[i][k] = buf[: v.shape[0]]
            return out, state

        def last_timed_step(self):
            return (self.calls - 1) % (STEPS * 2 + WARMUP) == WARMUP + STEPS - 1

    _, _, checks = run(monkeypatch, Reusing())
    assert not checks[0].passed and "ended differently" in checks[0].message, checks[0]


def _phase(cand) -> str:
    """Which run of a sample a call belongs to, as a kernel's own call counter would tell (warm-up, timed, replay)."""
    k = (cand.calls - 1) % (STEPS * 2 + WARMUP)
    return "warm" if k < WARMUP else "timed" if k < WARMUP + STEPS else "replay"


def test_rewriting_the_timed_runs_outputs_from_the_replay_is_refused(monkeypatch):
    """A review's cheat (fifty-first session): the timed run writes junk outputs (skipping the work only they need)
    and the replay, which knows the timed output buffers' addresses, copies its honest outputs into them. The timed
    outputs are copied to the host before the kernel runs again."""
    class Backfiller(Candidate):
        def __init__(self):
            super().__init__()
            self.timed_outs = []

        def step(self, hidden, state, out=None):
            out, state = super().step(hidden, state, out)
            if _phase(self) == "timed":
                self.timed_outs.append(out)
                out.fill_(1.0)
            elif _phase(self) == "replay" and self.timed_outs:
                self.timed_outs.pop(0).copy_(out)
            return out, state

    _, _, checks = run(monkeypatch, Backfiller())
    assert not checks[0].passed and "ended differently" in checks[0].message, checks[0]


def test_ignoring_the_token_and_zeroing_it_in_the_replay_is_refused(monkeypatch):
    """A review's cheat: every step computed as if its token were zero, and in the replay the token buffer it was
    handed is zeroed, so that the reference (which used to read that buffer) agreed. The reference now starts from
    the host's copy of the token, and the replay's tokens are compared with it."""
    class TokenBlind(Candidate):
        def step(self, hidden, state, out=None):
            out, state = super().step(torch.zeros_like(hidden), state, out)
            if _phase(self) == "replay":
                hidden.zero_()
            return out, state

    _, _, checks = run(monkeypatch, TokenBlind())
    assert not checks[0].passed and "input tokens" in checks[0].message, checks[0]
