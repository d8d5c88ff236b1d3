"""Compute-only cost of the int4 GEMV inner loop: the seed's former fp16-FMA loop against mma.sync tensor cores.

Issue 28, step 1 (probe first). scripts/tc_gemv_probe.cu holds five loops and says how each works:
- the seed's fp16-FMA loop (the seed's until 2026-12-06; it now uses DP2A on int16 x, see chunk_probe.py);
- tensor cores on an MMA-native weight layout (tc_probe: the binding would write it);
- tensor cores on the seed's own ring layout (tile_probe: no new layout, one PRMT more per MMA; its row
  loads conflict 4-way in shared memory);
- the same on rows whose 16-byte column chunks are XOR-swizzled (tile_swz_probe: conflict-free);
- that loop with tc_probe's fold once per 8-chunk period instead of once per chunk (tile_defer_probe).
This driver builds their shared-memory images from one random W4A16 problem, checks each against an exact
reference, and times them. The tile loops' lanes are also emulated on the CPU (emulate_tile; the test
tests/test_tc_gemv_probe.py holds them to the reference, and counts their loads' bank groups). The grid
is the seed's (SMs x 2 blocks x 256 threads). Every block copies its image once, then runs chunk steps on
weights that stay in shared memory: no DRAM stream, no copies, no barriers. A chunk step is the seed's:
32 KB of packed weights per block (256 k x 256 columns), 4 KB per warp, so "µs per chunk step" is what
scripts/chunk_probe.py reports as "compute, 8 slabs" (1.54 µs for the seed itself).

µs per chunk step = (time of a 96-step launch - time of a 32-step launch) / 64, so launch cost and the
image copy cancel. Each sample is 10 launches of each length; the table shows the median over the
samples (and the fastest and slowest), and the grid's compute-only weight rate.

Numerics: 8 steps compute a GEMV of K = 2048 (16 quant groups of 128, bf16 scale and zero point per
group and column) by N = 256 per block, fp16 activations. The reference dequantizes the same int4
weights exactly, W = (q - z) * s in fp32, and sums in fp64. Every kernel runs 16 steps (two passes of
the 8-step period, so the tensor-core fold's reset is exercised too) and must match 2x the reference.

Usage: python3 scripts/tc_gemv_probe.py [--reps 30] [--sets 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cupy
import numpy

SOURCE = Path(__file__).with_suffix(".cu")

# The shapes of the .cu (its probe_layout is checked against these at load).
THREADS, BLOCKS_PER_SM, WARPS = 256, 2, 8
TILE, GROUP, CHUNK_K, PERIOD = 256, 128, 256, 8
UNIT_K = PERIOD * CHUNK_K
GROUPS = UNIT_K // GROUP
CHUNK_BYTES = CHUNK_K // 2 * TILE
MT, KB = 4, GROUP // 16                      # tc: m-tiles per warp, k-blocks per warp per chunk
LO_OFFSET, HI_OFFSET = 1024.0, 64.0          # tc: fp16 magic bias of MMA k-slots 0-7 and 8-15

# tc: (bit shift, k offset from 2t, row offset from g) of the 8 nibbles of a lane's A-fragment word,
# in the order the kernel's SHF + 4 LOP3 read them back (see mma_int4 in the .cu).
A_NIBBLES = ((0, 0, 0), (16, 1, 0), (4, 8, 0), (20, 9, 0), (8, 0, 8), (24, 1, 8), (12, 8, 8), (28, 9, 8))

# The entries of the .cu's probe_layout, in order.
LAYOUT_NAMES = (
    "THREADS", "BLOCKS_PER_SM", "CHUNK_BYTES", "PERIOD", "UNIT_K", "GROUP", "SEED_BYTES", "TC_BYTES", "TC_ZERO",
)

LONG_STEPS, SHORT_STEPS, CHECK_STEPS, LAUNCHES = 96, 32, 16, 10
TOLERANCE = 1e-2                             # max |y - ref| / max |ref|; bf16 outputs round at 2^-9


@dataclass(frozen=True)
class Problem:
    """`sets` independent GEMV problems of one block each; block b of the grid computes set b % sets."""

    q: numpy.ndarray        # (sets, 2 slots, CHUNK_K, TILE) uint8 in [0, 15]; chunk c uses slot c % 2
    scale: numpy.ndarray    # (sets, GROUPS, TILE) uint16: bf16 bits
    zero: numpy.ndarray     # (sets, GROUPS, TILE) uint16: bf16 bits of integers in [0, 15]
    x: numpy.ndarray        # (sets, UNIT_K) float16


@dataclass(frozen=True)
class Variant:
    """One kernel of the .cu, the name of its image size in probe_layout, and the builder of that image."""

    name: str
    kernel: str
    size_name: str
    build: Callable[[Problem], numpy.ndarray]


@dataclass(frozen=True)
class Result:
    """What one variant measured: timing over samples and numerics against the reference."""

    name: str
    step_us: float
    step_us_min: float
    step_us_max: float
    max_err: float          # max |y - ref| / max |ref|
    rel_l2: float           # ||y - ref|| / ||ref||
    regs: int
    local_bytes: int

    @property
    def ok(self) -> bool:
        """The check's verdict: the sums match the reference within TOLERANCE."""
        return self.max_err < TOLERANCE


# ================================ problem and reference ================================


def bf16_bits(v: numpy.ndarray) -> numpy.ndarray:
    """float32 -> bf16 bit patterns, rounded to nearest even."""
    u = numpy.ascontiguousarray(v, dtype=numpy.float32).view(numpy.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(numpy.uint16)


def bf16_value(bits: numpy.ndarray) -> numpy.ndarray:
    """bf16 bit patterns -> float32."""
    return (bits.astype(numpy.uint32) << 16).view(numpy.float32)


def make_problem(sets: int, seed: int = 0) -> Problem:
    """Random weights, scales of ~0.01, integer zero points, unit-scale activations."""
    rng = numpy.random.default_rng(seed)
    return Problem(
        q=rng.integers(0, 16, size=(sets, 2, CHUNK_K, TILE), dtype=numpy.uint8),
        scale=bf16_bits(rng.uniform(0.004, 0.02, size=(sets, GROUPS, TILE))),
        zero=bf16_bits(rng.integers(0, 16, size=(sets, GROUPS, TILE)).astype(numpy.float32)),
        x=rng.standard_normal((sets, UNIT_K)).astype(numpy.float16),
    )


def unit_q(p: Problem) -> numpy.ndarray:
    """(sets, UNIT_K, TILE) weights of the 8-step GEMV: chunk c is slot c % 2."""
    return numpy.concatenate([p.q[:, c % 2] for c in range(PERIOD)], axis=1)


def reference(p: Problem) -> numpy.ndarray:
    """(sets, TILE) y = x . W with W = (q - z) * s dequantized exactly in fp32, summed in fp64."""
    s = numpy.repeat(bf16_value(p.scale), GROUP, axis=1)
    z = numpy.repeat(bf16_value(p.zero), GROUP, axis=1)
    w = (unit_q(p).astype(numpy.float32) - z) * s
    return numpy.einsum("bk,bkn->bn", p.x.astype(numpy.float64), w.astype(numpy.float64))


# ================================ shared-memory images ================================


def image_bytes(parts: tuple[numpy.ndarray, ...]) -> numpy.ndarray:
    """(sets, bytes): the parts' bytes, each part flattened per set, in order."""
    return numpy.concatenate([numpy.ascontiguousarray(a).reshape(a.shape[0], -1).view(numpy.uint8) for a in parts],
                             axis=1)


def seed_image(p: Problem) -> numpy.ndarray:
    """(sets, bytes): slots as packed rows (k = 2r low nibble, 2r + 1 high), scales, zeros, x."""
    rows = p.q[:, :, 0::2, :] | (p.q[:, :, 1::2, :] << 4)
    return image_bytes((rows, p.scale, p.zero, p.x))


def swizzle_rows(rows: numpy.ndarray) -> numpy.ndarray:
    """Packed rows (..., row, TILE bytes) with row r's 16-byte column chunk c moved to position c ^ (r & 6)."""
    r = numpy.arange(rows.shape[-2])[:, None]
    chunks = rows.reshape(rows.shape[:-1] + (TILE // 16, 16))
    return chunks[..., r, numpy.arange(TILE // 16)[None, :] ^ (r & 6), :].reshape(rows.shape)


def seed_image_swizzled(p: Problem) -> numpy.ndarray:
    """seed_image with every slot's packed rows swizzled (swizzle_rows): the image tile_swz_probe reads."""
    rows = p.q[:, :, 0::2, :] | (p.q[:, :, 1::2, :] << 4)
    return image_bytes((swizzle_rows(rows), p.scale, p.zero, p.x))


def tc_weight_words(q: numpy.ndarray) -> numpy.ndarray:
    """(sets, slot, k half, m quad, kb, lane, mt) uint32: each lane's A-fragment word of each MMA."""
    h, mq, kb, lane, mt = numpy.ix_(range(2), range(WARPS // 2), range(KB), range(32), range(MT))
    g, t = lane >> 2, lane & 3
    k0 = GROUP * h + 16 * kb + 2 * t
    n0 = 16 * (MT * mq + mt) + g
    words = numpy.zeros(q.shape[:2] + numpy.broadcast_shapes(k0.shape, n0.shape), dtype=numpy.uint32)
    for shift, dk, dn in A_NIBBLES:
        words |= q[:, :, k0 + dk, n0 + dn].astype(numpy.uint32) << shift
    return words


def tc_fold_order(bits: numpy.ndarray) -> numpy.ndarray:
    """(sets, k half, m quad, mt pair, lane, mt in pair, 4) uint16 of (sets, GROUPS, TILE) scales or
    zeros: a lane's (row g, group of column 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) per m-tile, where
    column j of k half h holds group 2j + h."""
    h, mq, pair, lane, e, v = numpy.ix_(range(2), range(WARPS // 2), range(MT // 2), range(32), range(2), range(4))
    g, t = lane >> 2, lane & 3
    group = 2 * (2 * t + (v & 1)) + h
    row = 16 * (MT * mq + 2 * pair + e) + g + 8 * (v >> 1)
    return bits[:, group, row]


def tc_b_fragments(x: numpy.ndarray) -> numpy.ndarray:
    """(sets, group, kb pair, t, kb in pair, b reg, 2) float16: lane t's B registers {x[k0+2t], x[k0+2t+1]}
    and {x[k0+2t+8], x[k0+2t+9]} of k-block k0 (the active lanes of the group's column read these)."""
    group, pair, t, e, b, i = numpy.ix_(range(GROUPS), range(KB // 2), range(4), range(2), range(2), range(2))
    return x[:, GROUP * group + 16 * (2 * pair + e) + 2 * t + 8 * b + i]


def tc_sums(x: numpy.ndarray) -> numpy.ndarray:
    """(sets, k half, t, 4) float32: {S, O} of the groups of columns 2t and 2t+1, where S is the sum of x
    over the group and O = 1024 * (its x on MMA k-slots 0-7) + 64 * (on slots 8-15)."""
    xg = x.astype(numpy.float64).reshape(x.shape[0], GROUPS, KB, 16)
    s = xg.sum(axis=(2, 3))
    o = LO_OFFSET * xg[..., :8].sum(axis=(2, 3)) + HI_OFFSET * xg[..., 8:].sum(axis=(2, 3))
    h, t, j = numpy.ix_(range(2), range(4), range(2))
    group = 2 * (2 * t + j) + h
    return numpy.stack((s[:, group], o[:, group]), axis=-1).reshape(x.shape[0], 2, 4, 4).astype(numpy.float32)


def tc_image(p: Problem) -> numpy.ndarray:
    """(sets, bytes): slots, fold-order scales and zeros, B-fragment x, {S, O} sums, 64 pad + 256 zero bytes."""
    zeros = numpy.zeros((p.x.shape[0], 64 + 2 * GROUP), dtype=numpy.uint8)
    return image_bytes((tc_weight_words(p.q), tc_fold_order(p.scale), tc_fold_order(p.zero), tc_b_fragments(p.x),
                        tc_sums(p.x), zeros))


VARIANTS = (
    Variant("seed fp16-FMA loop", "seed_probe", "SEED_BYTES", seed_image),
    Variant("tensor cores (mma.sync)", "tc_probe", "TC_BYTES", tc_image),
    Variant("tensor cores, seed layout", "tile_probe", "SEED_BYTES", seed_image),
    Variant("tc, seed layout swizzled", "tile_swz_probe", "SEED_BYTES", seed_image_swizzled),
    Variant("tc, swizzled, period fold", "tile_defer_probe", "SEED_BYTES", seed_image_swizzled),
)


# ================================ the tile loops emulated on the CPU ================================
# What tile_probe's and tile_swz_probe's lanes compute, register by register, so their index arithmetic can be
# checked against the reference without a GPU (tests/test_tc_gemv_probe.py). The PTX m16n8k16 fragment
# layouts: lane (g, t) holds A rows g and g + 8 at k-slots 2t, 2t + 1 (a0, a1) and 2t + 8, 2t + 9 (a2, a3),
# B column g at the same k-slots (b0, b1), and D rows g, g + 8 at columns 2t, 2t + 1.

TT_COLS, TT_MT, TT_K = TILE // 2, TILE // 32, 64    # tile_probe: columns, m-tiles, k per warp per chunk
LANE_G, LANE_T = numpy.ix_(range(8), range(4))


def prmt(a: numpy.ndarray, b: numpy.ndarray, sel: int) -> numpy.ndarray:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of {b, a}."""
    pool = (b.astype(numpy.uint64) << 32) | a.astype(numpy.uint64)
    out = numpy.zeros(a.shape, dtype=numpy.uint64)
    for i in range(4):
        out |= ((pool >> numpy.uint64(8 * ((sel >> 4 * i) & 7))) & numpy.uint64(0xFF)) << numpy.uint64(8 * i)
    return out.astype(numpy.uint32)


def halves(w: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
    """The (low, high) fp16 values of 32-bit registers."""
    return ((w & 0xFFFF).astype(numpy.uint16).view(numpy.float16).astype(numpy.float64),
            (w >> 16).astype(numpy.uint16).view(numpy.float16).astype(numpy.float64))


def mma_int4_emulated(word: numpy.ndarray, b0: numpy.ndarray, b1: numpy.ndarray) -> numpy.ndarray:
    """(sets, 16, 8) D of the .cu's mma_int4 for (sets, 8 g, 4 t) lane words and B registers, C = 0."""
    u = word >> 8
    regs = ((word & 0x000F000F) | 0x64006400, (u & 0x000F000F) | 0x64006400,
            (word & 0x00F000F0) | 0x54005400, (u & 0x00F000F0) | 0x54005400)
    a = numpy.zeros(word.shape[:1] + (16, 16))
    for r, reg in enumerate(regs):
        lo, hi = halves(reg)
        row, slot = LANE_G + 8 * (r & 1), 2 * LANE_T + 8 * (r >> 1)
        a[:, row, slot], a[:, row, slot + 1] = lo, hi
    bm = numpy.zeros(word.shape[:1] + (16, 8))
    for r, reg in enumerate((b0, b1)):
        lo, hi = halves(reg)
        slot = 2 * LANE_T + 8 * r
        bm[:, slot, LANE_G], bm[:, slot + 1, LANE_G] = lo, hi
    return a @ bm


def lane_chunks(swizzled: bool) -> numpy.ndarray:
    """(8 g, 4 t): the 16-byte chunk of its column half where a tile loop's lane loads its packed rows (rows
    2t, 2t + 1 of a k-block; r & 6 = 2t, so the swizzled image holds the lane's columns 16g.. at g ^ 2t)."""
    return LANE_G ^ (2 * LANE_T) if swizzled else numpy.broadcast_to(LANE_G, (8, 4))


def emulate_tile(p: Problem, steps: int, swizzled: bool = False, deferred: bool = False) -> numpy.ndarray:
    """(sets, TILE) what tile_probe's (`swizzled`: tile_swz_probe's; `deferred` too: tile_defer_probe's) lanes
    hold after `steps` chunk steps, summed over lanes t and warps. Each lane reads its 16 bytes where the
    kernel does, from the image's rows; x goes in B column 0 (folded every chunk) or, deferred, in column j
    of the period's chunk j (folded once per period)."""
    rows = p.q[:, :, 0::2, :] | (p.q[:, :, 1::2, :] << 4)
    if swizzled:
        rows = swizzle_rows(rows)
    xbits = p.x.view(numpy.uint16).astype(numpy.uint32)
    xs = p.x.astype(numpy.float64).reshape(p.x.shape[0], -1, 2)
    y = numpy.zeros((p.x.shape[0], TILE))
    g, t = LANE_G, LANE_T
    d = numpy.zeros((WARPS, TT_MT, p.x.shape[0], 16, 8))

    def fold(warp: int, j0: int, cols: int) -> None:
        half, k0 = warp & 1, (warp >> 1) * TT_K
        for n in range(cols):
            lo = (j0 + n) * CHUNK_K + k0
            even, odd = xs[:, lo // 2:(lo + TT_K) // 2, 0].sum(axis=1), xs[:, lo // 2:(lo + TT_K) // 2, 1].sum(axis=1)
            s_sum, o_sum = even + odd, LO_OFFSET * even + HI_OFFSET * odd
            group = 2 * (j0 + n) + k0 // GROUP
            for i in range(TT_MT):
                for r in range(2):   # D row g (column 2i of the lane's 16) and row g + 8 (column 2i + 1)
                    col = half * TT_COLS + 16 * numpy.arange(8) + 2 * i + r
                    scale = bf16_value(p.scale[:, group, col]).astype(numpy.float64)
                    zero = bf16_value(p.zero[:, group, col]).astype(numpy.float64)
                    y[:, col] += scale * (d[warp, i][:, 8 * r:8 * r + 8, n] - (zero * s_sum[:, None] + o_sum[:, None]))
        d[warp] = 0.0

    for c in range(steps):
        j, slot = c % PERIOD, c % 2
        b_col = j if deferred else 0
        for warp in range(WARPS):
            half, k0 = warp & 1, (warp >> 1) * TT_K
            for kb in range(TT_K // 16):
                row = k0 // 2 + 8 * kb + 2 * t
                cols = half * TT_COLS + 16 * lane_chunks(swizzled)
                words = [[sum(rows[:, slot, row + e, cols + 4 * w + i].astype(numpy.uint32) << (8 * i)
                              for i in range(4)) for w in range(4)] for e in range(2)]
                k = j * CHUNK_K + k0 + 16 * kb + 4 * t
                xv = [numpy.where(g == b_col, xbits[:, k + 2 * e] | (xbits[:, k + 2 * e + 1] << 16), 0)
                      for e in range(2)]
                b0, b1 = prmt(xv[0], xv[1], 0x5410), prmt(xv[0], xv[1], 0x7632)
                for i in range(TT_MT):
                    word = prmt(words[0][i >> 1], words[1][i >> 1], 0x7632 if i & 1 else 0x5410)
                    d[warp, i] += mma_int4_emulated(word, b0, b1)
            if not deferred:
                fold(warp, j, 1)
            elif j == PERIOD - 1:
                fold(warp, 0, PERIOD)
    return y


# ================================ device side ================================


def load_module() -> tuple[cupy.RawModule, dict[str, int]]:
    """Compile the .cu, check that its shape numbers are the driver's, and return it with probe_layout."""
    mod = cupy.RawModule(code=SOURCE.read_text(), options=("-std=c++17",))
    ptr = mod.get_global("probe_layout")
    values = cupy.ndarray((len(LAYOUT_NAMES),), cupy.int32, ptr).get().tolist()
    device = dict(zip(LAYOUT_NAMES, values, strict=True))
    host = {"THREADS": THREADS, "BLOCKS_PER_SM": BLOCKS_PER_SM, "CHUNK_BYTES": CHUNK_BYTES, "PERIOD": PERIOD,
            "UNIT_K": UNIT_K, "GROUP": GROUP}
    wrong = {k: (v, device[k]) for k, v in host.items() if device[k] != v}
    if wrong:
        raise RuntimeError(f"layout mismatch (driver, kernel): {wrong}")
    return mod, device


def run(kern: cupy.RawKernel, grid: int, smem: int, images: cupy.ndarray, steps: int, out: cupy.ndarray) -> None:
    """One launch of a probe kernel over the grid; whole periods only (the deferred fold runs at a period's end)."""
    if steps % PERIOD:
        raise ValueError(f"{steps} chunk steps: the probes run whole periods of {PERIOD}")
    kern((grid,), (THREADS,), (images, numpy.int32(images.shape[0]), numpy.int32(steps), out), shared_mem=smem)


def step_times(kern: cupy.RawKernel, grid: int, smem: int, images: cupy.ndarray, reps: int) -> list[float]:
    """µs per chunk step, one value per sample: (LONG - SHORT launch time) / (LONG - SHORT steps)."""
    out = cupy.zeros((grid, WARPS, TILE), dtype=cupy.float32)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    def launch_us(steps: int) -> float:
        start.record()
        for _ in range(LAUNCHES):
            run(kern, grid, smem, images, steps, out)
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) * 1e3 / LAUNCHES

    launch_us(LONG_STEPS)   # warm-up
    return [(launch_us(LONG_STEPS) - launch_us(SHORT_STEPS)) / (LONG_STEPS - SHORT_STEPS) for _ in range(reps)]


def measure(mod: cupy.RawModule, layout: dict[str, int], v: Variant, p: Problem, ref: numpy.ndarray, grid: int,
            reps: int) -> Result:
    """Check one variant's sums after CHECK_STEPS steps, then time it."""
    image = v.build(p)
    smem = layout[v.size_name]
    if image.shape[1] != smem:
        raise RuntimeError(f"{v.name}: image of {image.shape[1]} B, kernel expects {smem} B")
    if v.kernel == "tc_probe" and image[:, layout["TC_ZERO"]:].any():
        raise RuntimeError("tc image: the zero B-fragment area is not zero")
    kern = mod.get_function(v.kernel)
    kern.max_dynamic_shared_size_bytes = smem
    kern.preferred_shared_memory_carveout = 100
    resident = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, THREADS, smem)
    if resident < BLOCKS_PER_SM:
        raise RuntimeError(f"{v.name}: {resident} block(s) per SM fit, the seed's grid needs {BLOCKS_PER_SM}")
    images = cupy.asarray(image.view(numpy.uint32).reshape(image.shape[0], -1, 4))
    out = cupy.zeros((grid, WARPS, TILE), dtype=cupy.float32)
    run(kern, grid, smem, images, CHECK_STEPS, out)
    y = out.get().astype(numpy.float64).sum(axis=1)
    want = ref[numpy.arange(grid) % ref.shape[0]] * (CHECK_STEPS // PERIOD)
    err = y - want
    samples = step_times(kern, grid, smem, images, reps)
    return Result(name=v.name, step_us=statistics.median(samples), step_us_min=min(samples),
                  step_us_max=max(samples), max_err=float(numpy.abs(err).max() / numpy.abs(want).max()),
                  rel_l2=float(numpy.linalg.norm(err) / numpy.linalg.norm(want)), regs=kern.num_regs,
                  local_bytes=kern.local_size_bytes)


# ================================ report ================================


def report(results: list[Result], grid: int) -> str:
    """A plain-text table: time per chunk step, speed-up over the seed loop, rate, numerics."""
    base = results[0].step_us
    head = (f"{'variant':<26}{'us/step':>9}{'[min-max]':>16}{'x seed':>8}{'TB/s':>7}"
            f"{'max err':>10}{'rel L2':>10}{'regs':>6}{'local':>7}  check")
    lines = [f"Compute-only chunk step: 32 KB packed int4 per block (4 KB per warp), {grid} blocks x {THREADS} "
             f"threads, medians of samples of {LAUNCHES} launches ({LONG_STEPS} - {SHORT_STEPS} steps)", head]
    for r in results:
        rate = grid * CHUNK_BYTES / r.step_us / 1e6
        lines.append(f"{r.name:<26}{r.step_us:>9.3f}{f'[{r.step_us_min:.3f}-{r.step_us_max:.3f}]':>16}"
                     f"{base / r.step_us:>8.2f}{rate:>7.2f}{r.max_err:>10.2e}{r.rel_l2:>10.2e}{r.regs:>6}"
                     f"{r.local_bytes:>7}  {'ok' if r.ok else 'FAILED'}")
    lines.append(f"max err = max|y - ref| / max|ref| (tolerance {TOLERANCE:g}); TB/s = the grid's packed-weight "
                 "consumption rate with no memory traffic (HBM copy rate is ~4.3)")
    return "\n".join(lines)


def main() -> int:
    """Check and time every variant; exit status 1 if any check fails."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--reps", type=int, default=30, help="timing samples per variant (median reported)")
    ap.add_argument("--sets", type=int, default=8, help="distinct random problems spread over the blocks")
    args = ap.parse_args()
    mod, layout = load_module()
    grid = cupy.cuda.Device().attributes["MultiProcessorCount"] * BLOCKS_PER_SM
    p = make_problem(args.sets)
    ref = reference(p)
    results = [measure(mod, layout, v, p, ref, grid, args.reps) for v in VARIANTS]
    print(report(results, grid))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
