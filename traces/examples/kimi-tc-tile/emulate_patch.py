"""CPU check of seed-tc-tile.patch's gemv_chunk: a lane-level port of it (PTX fragment layouts, PRMT and the
magic-number LOP3s as scripts/tc_gemv_probe.py emulates them) over the ring slot as issue_chunk fills it from the
binding's swizzled w_q (the patch declares MK_SWIZZLED_WEIGHTS), run over every (tile, K slice) unit of a matrix
and compared with the exact GEMV of each unit's K slice. The shapes cover partial chunks, slab pairs that
straddle two quant groups (down and output projections) and a narrow tile.
Usage, from the repository root: python traces/examples/kimi-tc-tile/emulate_patch.py"""

import importlib.util
import sys
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("tc_gemv_probe", ROOT / "scripts" / "tc_gemv_probe.py")
probe = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = probe
_spec.loader.exec_module(probe)

TILE, SLAB, GROUP_ROWS, QGROUP, WARPS = 256, 16, 64, 128, 8
CHUNK_SLABS, RED_ROWS, TC_COLS, TC_MT = WARPS, WARPS // 2, 128, 8
RING_GROUPS = 3                                    # CHUNK_GROUPS: the quant groups a chunk can touch
G, T = probe.LANE_G, probe.LANE_T


def bf16(bits: numpy.ndarray) -> numpy.ndarray:
    """bf16 bit patterns -> float64."""
    return probe.bf16_value(numpy.asarray(bits, dtype=numpy.uint16)).astype(numpy.float64)


def row_words(wslot: numpy.ndarray, row: numpy.ndarray, cols: numpy.ndarray) -> list[numpy.ndarray]:
    """The four 32-bit words of each lane's 16-byte load at packed row `row`, columns `cols`..+16."""
    return [sum(wslot[row, cols + 4 * w + i].astype(numpy.uint32) << (8 * i) for i in range(4)) for w in range(4)]


def warp_part(wslot, sslot, zslot, n_cols, col0, slab_begin, slab_end, x, warp) -> numpy.ndarray | None:
    """(8 lanes g, 16 columns) what the lanes t = 0 of `warp` add to their slab pair's row, or None when the
    warp has no slab or no column below N (it then stores zeros on a unit's first chunk)."""
    half, sa = warp & 1, slab_begin + 2 * (warp >> 1)
    nslabs = min(2, slab_end - sa)
    if nslabs <= 0 or col0 + half * TC_COLS >= n_cols:
        return None
    ga, gb = sa * SLAB // GROUP_ROWS, (sa + 1) * SLAB // GROUP_ROWS
    split = nslabs == 2 and gb != ga
    xbits = x.view(numpy.uint16).astype(numpy.uint32)
    d = numpy.zeros((TC_MT, 16, 8))
    for kb in range(2 * nslabs):
        row = (sa - slab_begin) * SLAB + 2 * T + 8 * kb
        cols = half * TC_COLS + 16 * (G ^ (2 * T))   # the lane's columns 16g.. sit at chunk g ^ (r & 6) = g ^ 2t
        w0, w1 = row_words(wslot, row, cols), row_words(wslot, row + 1, cols)
        k = sa * 2 * SLAB + 16 * kb + 4 * T
        active = G == (1 if kb >= 2 and split else 0)
        xv = [numpy.where(active, xbits[k + 2 * e] | (xbits[k + 2 * e + 1] << 16), 0) for e in range(2)]
        b0, b1 = probe.prmt(xv[0], xv[1], 0x5410), probe.prmt(xv[0], xv[1], 0x7632)
        for i in range(TC_MT):
            word = probe.prmt(w0[i >> 1], w1[i >> 1], 0x7632 if i & 1 else 0x5410)
            d[i] += probe.mma_int4_emulated(word[None], b0[None], b1[None])[0]
    lanes = numpy.arange(32)[:, None]
    k = numpy.minimum(sa * 2 * SLAB + 2 * lanes + numpy.arange(2), len(x) - 1)
    xx = numpy.where(lanes < 16 * nslabs, x.astype(numpy.float64)[k], 0.0)
    sums = [xx[:16].sum(axis=0), xx[16:].sum(axis=0)]          # {even, odd} of slab a, slab b
    if not split:
        sums = [sums[0] + sums[1]]
    gi = ga - slab_begin * SLAB // GROUP_ROWS
    out = numpy.zeros((8, 16))
    for grp, (even, odd) in enumerate(sums):
        s_sum, o_sum = even + odd, 1024.0 * even + 64.0 * odd
        for g in range(8):
            cols = half * TC_COLS + 16 * g + numpy.arange(16)
            acc = numpy.empty(16)
            acc[0::2], acc[1::2] = d[:, g, grp], d[:, g + 8, grp]
            out[g] += bf16(sslot[gi + grp, cols]) * (acc - (bf16(zslot[gi + grp, cols]) * s_sum + o_sum))
    return out


def gemv_chunk(wslot, sslot, zslot, n_cols, col0, slab_begin, slab_end, x, red, first) -> None:
    """The patch's gemv_chunk for every warp of the block: red (RED_ROWS, TILE) += (or = when `first`)."""
    for warp in range(WARPS):
        part = warp_part(wslot, sslot, zslot, n_cols, col0, slab_begin, slab_end, x, warp)
        if part is None and not first:
            continue
        for g in range(8):
            cols = (warp & 1) * TC_COLS + 16 * g + numpy.arange(16)
            v = numpy.zeros(16) if part is None else part[g]
            red[warp >> 1, cols] = v if first else red[warp >> 1, cols] + v


def check(k_dim: int, n_cols: int, ksplit: int, seed: int) -> float:
    """Max relative error over every unit of a random (k_dim, n_cols) int4 matrix cut into `ksplit` K slices."""
    rng = numpy.random.default_rng(seed)
    tiles = (n_cols + TILE - 1) // TILE
    q = rng.integers(0, 16, size=(k_dim, tiles * TILE)).astype(numpy.uint8)
    scale = probe.bf16_bits(rng.uniform(0.004, 0.02, size=(k_dim // QGROUP, tiles * TILE)))
    zero = probe.bf16_bits(rng.integers(0, 16, size=(k_dim // QGROUP, tiles * TILE)).astype(numpy.float32))
    for a in (q, scale, zero):
        a[:, n_cols:] = 0                          # the binding zero-pads the last tile
    x = rng.standard_normal(k_dim).astype(numpy.float16)
    packed = q[0::2] | (q[1::2] << 4)
    tiled = probe.swizzle_rows(packed.reshape(k_dim // 2, tiles, TILE).transpose(1, 0, 2))   # the binding's w_q
    w = (q - numpy.repeat(bf16(zero), QGROUP, axis=0)) * numpy.repeat(bf16(scale), QGROUP, axis=0)
    slabs, worst = k_dim // 2 // SLAB, 0.0
    for tile in range(tiles):
        span = slice(tile * TILE, (tile + 1) * TILE)
        for split in range(ksplit):
            s0, s1 = split * slabs // ksplit, (split + 1) * slabs // ksplit
            red = numpy.full((RED_ROWS, TILE), numpy.nan)
            for cs in range(s0, s1, CHUNK_SLABS):
                ce = min(cs + CHUNK_SLABS, s1)
                row0, rows = cs * SLAB, (ce - cs) * SLAB
                g0 = row0 // GROUP_ROWS
                ng = (row0 + rows - 1) // GROUP_ROWS - g0 + 1
                wslot = numpy.zeros((CHUNK_SLABS * SLAB, TILE), numpy.uint8)
                wslot[:rows] = tiled[tile, row0:row0 + rows]
                sslot = numpy.zeros((RING_GROUPS, TILE), numpy.uint16)
                zslot = numpy.zeros((RING_GROUPS, TILE), numpy.uint16)
                sslot[:ng], zslot[:ng] = scale[g0:g0 + ng, span], zero[g0:g0 + ng, span]
                gemv_chunk(wslot, sslot, zslot, n_cols, tile * TILE, cs, ce, x, red, cs == s0)
            n = min(TILE, n_cols - tile * TILE)
            got = red.sum(axis=0)[:n]
            want = (x[s0 * 2 * SLAB:s1 * 2 * SLAB].astype(numpy.float64) @ w[s0 * 2 * SLAB:s1 * 2 * SLAB, span])[:n]
            if numpy.isnan(got).any():
                raise AssertionError(f"unwritten sums: K={k_dim} N={n_cols} tile {tile} slice {split}")
            worst = max(worst, float(numpy.abs(got - want).max() / numpy.abs(want).max()))
    return worst


SHAPES = (
    (2304, 576, 9, "MLA kv_a, KSPLIT_MLA 9"),
    (1024, 2304, 3, "down, KSPLIT_DOWN 3"),
    (4096, 2304, 28, "output projection, KSPLIT_O 28"),
    (2304, 4096, 3, "KDA q, KSPLIT_KDA 3"),
    (2304, 1024, 9, "gate/up, KSPLIT_GU 9"),
    (1024, 2304, 4, "down, KSPLIT_DOWN 4"),
    (256, 100, 1, "narrow tile"),
)

if __name__ == "__main__":
    for k_dim, n_cols, ksplit, name in SHAPES:
        print(f"{name:32s} K={k_dim:5d} N={n_cols:5d} K slices {ksplit:2d}: max rel err "
              f"{check(k_dim, n_cols, ksplit, 1):.2e}")
