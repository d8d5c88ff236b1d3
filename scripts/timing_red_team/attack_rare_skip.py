"""Hostile attempt (52nd session): skip the work of one timed step in STEPS, keyed on the position alone."""
from common import evaluate, tv

if __name__ == "__main__":
    list(evaluate(lambda: tv.Candidate(real=lambda pos, out: pos % tv.STEPS != tv.STEPS - 1), list(range(10)), "skip"))
