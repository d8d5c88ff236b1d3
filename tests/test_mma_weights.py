"""The integer-MMA GEMV loop's data layouts (MMA_LOOP, traces/examples/kimi-mma-loop/mma-loop.patch: measured
slower than the DP2A loop and not in the seed; the binding keeps its layout, MK_MMA_WEIGHTS), emulated on the CPU.

mma_fragments (the binding) lays w_q out as mma.m16n8k32's A fragments; the kernel's stagings lay x out as two
signed byte planes in B-fragment order; gemv_chunk multiplies them with block s of a chunk in B columns
2 (s % 4), 2 (s % 4) + 1 and folds per lane; fold_chunk adds the four lanes of a row. This emulates each step
as the kernel's code does it, with the PTX fragment maps, and checks the sums against the exact dequantized GEMV.
"""

from __future__ import annotations

import numpy
import pytest
import torch

from megakernel_agent.tasks.kimi_linear.megakernel import mma_fragments
from megakernel_agent.tasks.kimi_linear.quant import pack_int4

SLABS, TILE, GROUP = 8, 256, 128   # one chunk: 8 slabs of 32 k, two quant groups


def x_planes(xi: numpy.ndarray) -> numpy.ndarray:
    """int16 values in [-2^14, 2^14] -> the stagings' bytes: per 32-element block, plane 0 the low bytes and
    plane 1 (x + 128) >> 8, element k at 32 plane + 8 ((k % 16) // 4) + 4 (k // 16) + k % 4."""
    blocks = xi.reshape(-1, 32).astype(numpy.int64)
    out = numpy.zeros((blocks.shape[0], 64), dtype=numpy.uint8)
    k = numpy.arange(32)
    at = 8 * ((k % 16) // 4) + 4 * (k // 16) + k % 4
    out[:, at] = blocks & 0xFF
    out[:, 32 + at] = ((blocks + 128) >> 8) & 0xFF
    return out


def planes_to_sums(planes: numpy.ndarray) -> numpy.ndarray:
    """Each block's sum of x (the stagings store it beside the scale), from its two planes."""
    return planes[:, :32].astype(numpy.int8).astype(numpy.int64).sum(1) + 256 * planes[:, 32:].astype(
        numpy.int8).astype(numpy.int64).sum(1)


def a_matrix(frag: numpy.ndarray) -> numpy.ndarray:
    """A (16 x 32) from the lanes' 16 bytes: register i of lane 4g + t holds row g + 8 (i & 1), k 4t + 16 (i >> 1)."""
    a = numpy.zeros((16, 32), dtype=numpy.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i in range(4):
            for j in range(4):
                a[g + 8 * (i & 1), 4 * t + j + 16 * (i >> 1)] = frag[lane, 4 * i + j]
    return a


def b_matrix(regs: numpy.ndarray) -> numpy.ndarray:
    """B (32 x 8) from the lanes' two registers of signed bytes: lane 4g + t holds column g, k 4t + j (+16)."""
    b = numpy.zeros((32, 8), dtype=numpy.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for r in range(2):
            b[4 * t + 16 * r: 4 * t + 16 * r + 4, g] = regs[lane, 4 * r: 4 * r + 4]
    return b


def lane_d(d: numpy.ndarray, lane: int) -> list[int]:
    """The accumulator registers of lane 4g + t: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)."""
    g, t = divmod(lane, 4)
    return [d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1]]


def emulate_chunk(frags: numpy.ndarray, planes: numpy.ndarray, xs: numpy.ndarray, scales: numpy.ndarray,
                  zeros: numpy.ndarray, slabs: int) -> numpy.ndarray:
    """The tile's 256 column sums of one chunk of `slabs` slabs, as gemv_chunk and fold_chunk compute them."""
    xsum = planes_to_sums(planes)
    out = numpy.zeros(TILE)
    for w in range(8):
        d = numpy.zeros((2, 2, 16, 8), dtype=numpy.int64)   # [set][low nibbles, whole bytes]
        for s in range(slabs):
            frag = frags[s, w]                                # (32 lanes, 16 bytes)
            regs = numpy.zeros((32, 8), dtype=numpy.int64)
            for lane in range(32):
                g, t = divmod(lane, 4)
                if g >> 1 == s % 4:
                    raw = planes[s, 32 * (g & 1) + 8 * t: 32 * (g & 1) + 8 * t + 8].astype(numpy.int8)
                    regs[lane] = raw
            b = b_matrix(regs)
            d[s // 4, 0] += a_matrix(frag & 0x0F) @ b
            d[s // 4, 1] += a_matrix(frag) @ b
        acc = numpy.zeros((32, 4))
        for lane in range(32):
            g, t = divmod(lane, 4)
            for st in range(2):
                s = 4 * st + t
                if s >= slabs:
                    continue
                lo, whole = lane_d(d[st, 0], lane), lane_d(d[st, 1], lane)
                slo = [lo[0] + 256 * lo[1], lo[2] + 256 * lo[3]]
                shi = [(whole[0] + 256 * whole[1] - slo[0]) >> 4, (whole[2] + 256 * whole[3] - slo[1]) >> 4]
                sums = [slo[0], slo[1], shi[0], shi[1]]
                grp = (32 * s) // GROUP
                for i in range(4):
                    col = 32 * w + 4 * g + i
                    acc[lane, i] += scales[grp, col] * xs[s] * (sums[i] - zeros[grp, col] * xsum[s])
        for g in range(8):
            out[32 * w + 4 * g: 32 * w + 4 * g + 4] = acc[4 * g: 4 * g + 4].sum(axis=0)
    return out


@pytest.mark.parametrize("slabs", [8, 5])
def test_mma_loop_on_the_bindings_fragments_gives_the_exact_gemv(slabs):
    rng = numpy.random.default_rng(11 + slabs)
    k = 32 * SLABS
    q = rng.integers(0, 16, size=(k, TILE))
    scales = rng.uniform(0.01, 0.1, size=(k // GROUP, TILE))
    zeros = rng.integers(0, 16, size=(k // GROUP, TILE)).astype(float)
    xi = rng.integers(-2 ** 14, 2 ** 14 + 1, size=k)
    xi[:4] = [2 ** 14, -2 ** 14, -1, 127]                      # the planes' edge values
    xs = 2.0 ** rng.integers(-20, -10, size=SLABS)
    tiled = pack_int4(torch.from_numpy(q))                      # (k / 2, 256): one tile
    frags = mma_fragments(tiled).numpy().reshape(SLABS, 8, 32, 16)
    planes = x_planes(xi)
    numpy.testing.assert_array_equal(planes_to_sums(planes), xi.reshape(-1, 32).sum(1))
    got = emulate_chunk(frags, planes, xs, scales, zeros, slabs)
    kk = 32 * slabs
    x = (xi.reshape(-1, 32) * xs[:, None]).reshape(-1)[:kk]
    want = ((q[:kk] - numpy.repeat(zeros, GROUP, axis=0)[:kk]) * numpy.repeat(scales, GROUP, axis=0)[:kk]).T @ x
    numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_mma_fragments_keep_every_byte_s_nibbles_and_refuse_partial_slabs():
    rng = numpy.random.default_rng(5)
    q = torch.from_numpy(rng.integers(0, 16, size=(64, TILE)))
    tiled = pack_int4(q)
    frags = mma_fragments(tiled)
    assert frags.shape == tiled.shape and not torch.equal(frags, tiled)
    nibbles = lambda t: torch.sort(torch.cat([t & 0xF, t >> 4]).flatten()).values   # noqa: E731
    assert torch.equal(nibbles(frags), nibbles(tiled))
    with pytest.raises(ValueError, match="16-row slabs"):
        mma_fragments(tiled[:24])
    with pytest.raises(ValueError, match="uint8 tiles"):
        mma_fragments(tiled.to(torch.int16))
