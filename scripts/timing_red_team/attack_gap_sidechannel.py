"""Attack 1: learn each sample's checked steps from the replay's timing (the host's copies of the state at
`bounds` leave an idle gap before those steps; a kernel reads %globaltimer at start and at end of each step and
keeps the previous end in a device global). `order` is one permutation for all samples, so a step checked in an
earlier sample is not checked again until every step was: skip every step already seen checked."""
import itertools
import time

from common import evaluate, tv


class GapSpy(tv.Candidate):
    def __init__(self):
        super().__init__(real=self.decide)
        self.chains = -1          # chain starts seen (pos == CTX): warm, timed, replay per sample
        self.idx = 0              # step index within the chain
        self.t_end = None
        self.timed_gaps, self.replay_gaps = [], []
        self.learned = []         # per finished sample: the set of steps it checked (decoded)
        self.plan = set()         # steps to do real work on in this sample's timed run (and its replay)
        self.log = []

    # ---- the kernel's own bookkeeping: position, call counter, clock --------------------------------
    def step(self, hidden, state, out=None):
        t0 = time.perf_counter()
        gap = None if self.t_end is None else t0 - self.t_end
        pos = state[self.mla[0]]["c_kv"].shape[0]
        if pos == tv.CTX:
            self.chains += 1
            self.idx = 0
            phase = self.chains % 3
            if phase == 0 and self.chains:          # a new sample: decode the last replay
                self.learn()
            if phase == 1:
                self.plan = self.make_plan()
                self.timed_gaps = []
            if phase == 2:
                self.replay_gaps = []
        else:
            (self.timed_gaps if self.chains % 3 == 1 else self.replay_gaps).append((self.idx, gap))
        self.phase = self.chains % 3
        r = super().step(hidden, state, out)
        self.idx += 1
        self.t_end = time.perf_counter()
        return r

    def decide(self, pos, out):
        if self.phase == 0:
            return False                             # the warm-up chain is never checked
        return (pos - tv.CTX) in self.plan

    def learn(self):
        gaps = dict(self.replay_gaps)    # step index (>= 1) -> idle time before it
        L = tv.STEPS
        per = -(-L // tv.SAMPLES)
        scored = []
        for V in itertools.combinations(range(L), per):
            G = (set(V) | {v + 1 for v in V}) - {0, L}
            inside = min((gaps[i] for i in G), default=float("inf"))
            outside = max((g for i, g in gaps.items() if i not in G), default=1e-9)
            scored.append((inside / outside, set(V)))
        sols = [V for sc, V in scored if sc > 2]      # the idle gaps fit these checked sets
        if sols:   # sure: checked in every fit; possible: in some
            self.learned.append((set.intersection(*sols), set.union(*sols)))
        else:
            self.learned.append((set(), set(range(L))))   # not sure: do everything from now on
        self.log.append((round(max(sc for sc, _ in scored), 1), [sorted(b) for b in sols]))

    def make_plan(self):
        L, n = tv.STEPS, len(self.learned)
        per = -(-L // tv.SAMPLES)
        if any(not p for _, p in self.learned) or any(p == set(range(L)) for _, p in self.learned):
            return set(range(L))                     # undecoded: do everything
        plan = set()
        for slot in range(n * per, n * per + per):
            if slot < L:                             # first cycle: some step not checked yet
                plan |= set(range(L)) - set().union(*(s for s, _ in self.learned))
            else:                                    # second cycle: the step checked in slot - L
                plan |= self.learned[(slot % L) // per][1]
        return plan

if __name__ == "__main__":
    import sys
    if len(sys.argv) > 1 and sys.argv[1] == "prod":   # the GPU defaults: 20 steps, 7 samples, 5 warm-up steps
        tv.STEPS, tv.SAMPLES, tv.WARMUP = 20, 7, 5
    for *_, cand in evaluate(GapSpy, list(range(10)), "gap"):
        print("   decoded", cand.log)
