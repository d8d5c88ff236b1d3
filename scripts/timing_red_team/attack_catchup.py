"""Attack 2: lazy catch-up. Step j (= position CTX+2) does no work (zero cache rows, output = its input); step j+1
first redoes step j from the saved token (fixing the row it left), then its own. Only out[j] is wrong, the state
at the chain's end is right. Also 2b: blind skipping of one step in the last two samples (no side channel)."""
import torch
from common import evaluate, tv


class CatchUp(tv.Candidate):
    J = tv.CTX + 2
    def step(self, hidden, state, out=None):
        self.calls += 1
        out = self.ring if out is None else out
        pos = state[self.mla[0]]["c_kv"].shape[0]
        if pos == self.J:
            self.pending = hidden.clone()
            for i in self.mla:
                for k in ("c_kv", "k_rope"):
                    v = state[i][k]
                    state[i][k] = torch.cat([v, v.new_zeros(1, v.shape[1])], 0)
            self.saved = [{k: v.clone() for k, v in layer.items()} for layer in state]
            out.copy_(hidden)
            return out, state
        if pos == self.J + 1:   # catch up: redo step J from the state before it, then this step
            before = [{k: (v[:-1].clone() if k in ("c_kv", "k_rope") and i in self.mla else v.clone())
                       for k, v in layer.items()} for i, layer in enumerate(state)]
            _, state = self.ref.step(self.pending.clone(), before)
            self.real_steps += 1
        self.real_steps += 1
        result, state = self.ref.step(hidden.clone(), state)
        out.copy_(result)
        return out, state

class BlindLate(tv.Candidate):
    """skip step (n % STEPS) in samples 6 and 7 (counted by chain starts), no knowledge of the checks."""
    def __init__(self):
        super().__init__(real=self.decide)
        self.chains = -1
    def step(self, hidden, state, out=None):
        if state[self.mla[0]]["c_kv"].shape[0] == tv.CTX:
            self.chains += 1
        return super().step(hidden, state, out)
    def decide(self, pos, out):
        n = self.chains // 3
        return not (n >= 6 and pos - tv.CTX == n % tv.STEPS)

if __name__ == "__main__":
    list(evaluate(CatchUp, list(range(10)), "catchup"))
    list(evaluate(BlindLate, list(range(10)), "blind"))
