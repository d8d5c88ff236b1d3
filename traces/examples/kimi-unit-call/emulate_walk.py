"""UNIT_AHEAD's chunk order against the seed's, on the CPU: both walks of seed-unit-call.patch's run_jobs,
emulated on random job tables, must hand every block the same chunks in the same order.

A job is (units, paired, chunk steps per matrix); unit u runs on block u mod grid, as in the kernel. The seed
walks to a unit's head when a chunk step needs it (next_chunk); UNIT_AHEAD finds the head of the block's next
unit before the ring wait and hands it out at the unit's end (chunk_after). Usage: python3 emulate_walk.py
"""

from __future__ import annotations

import random

Chunk = tuple[int, tuple[int, int] | None]   # (unit, (matrix, step)); no position past the table's end


def head(total: int, u: int) -> Chunk:
    return (u, None) if u >= total else (u, (0, 0))


def job_of(jobs: list[tuple[int, int, int]], u: int) -> tuple[int, int]:
    for units, paired, steps in jobs:
        if u < units:
            return paired, steps
        u -= units
    raise ValueError(u)


def step_in_unit(jobs, c: Chunk) -> tuple[bool, Chunk]:
    """As the patch's step_in_unit: a pair alternates its matrices, then the unit steps on."""
    u, (m, st) = c
    paired, steps = job_of(jobs, u)
    if m < paired:
        return True, (u, (1, st))
    return st + 1 < steps, (u, (0, st + 1))


def next_chunk(jobs, total: int, grid: int, c: Chunk) -> Chunk:
    ok, n = step_in_unit(jobs, c)
    return n if ok else head(total, c[0] + grid)


def chunk_after(jobs, c: Chunk, after: Chunk) -> Chunk:
    ok, n = step_in_unit(jobs, c)
    return n if ok else after


def run(jobs, grid: int, block: int, ahead: bool) -> list[Chunk]:
    """The chunks run_jobs computes on `block`, in order, with the seed's walk or UNIT_AHEAD's."""
    total = sum(j[0] for j in jobs)
    c = head(total, block)
    nu = head(total, c[0] + grid) if ahead else c
    nx = c if c[0] >= total else chunk_after(jobs, c, nu) if ahead else next_chunk(jobs, total, grid, c)
    advance = ahead and nx[0] != c[0]
    out = []
    while c[0] < total:
        if advance:
            nu, advance = head(total, nu[0] + grid), False
        out.append(c)
        nn = nx if nx[0] >= total else chunk_after(jobs, nx, nu) if ahead else next_chunk(jobs, total, grid, nx)
        advance = ahead and nx[0] < total and nn[0] != nx[0]
        c, nx = nx, nn
    return out


def main() -> None:
    rng = random.Random(1)
    for _ in range(3000):
        jobs = [(rng.randint(1, 40), rng.randint(0, 1), rng.randint(1, 4)) for _ in range(rng.randint(1, 10))]
        grid = rng.randint(1, 50)
        for block in range(grid):
            if run(jobs, grid, block, False) != run(jobs, grid, block, True):
                raise SystemExit(f"orders differ: jobs {jobs}, grid {grid}, block {block}")
    print("the same chunk order on every block of 3,000 random job tables")


if __name__ == "__main__":
    main()
