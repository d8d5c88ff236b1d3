import random
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "tests"))
import test_timing_verification as tv


class MP:
    """pytest's monkeypatch, as much of it as tv.run uses."""

    def __init__(self):
        self.undo = []

    def setattr(self, obj, name, value):
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def restore(self):
        for obj, name, value in reversed(self.undo):
            setattr(obj, name, value)
        self.undo = []


def evaluate(make, seeds, label=""):
    kept = 0
    for seed in seeds:
        mp = MP()
        cand = make()
        try:
            real, _, checks = tv.run(mp, cand, rng=random.Random(seed))
        finally:
            mp.restore()
        ok = all(c.passed for c in checks) and len(checks) == tv.SAMPLES
        kept += ok
        print(label, "seed", seed, "PASSED" if ok else "refused", "real", real,
              "checked", [c.checked_steps for c in checks],
              "" if ok else checks[-1].message[:120], flush=True)
        yield seed, ok, real, checks, cand
    print(label, "passed", kept, "of", len(seeds))
