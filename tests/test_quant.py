import numpy
import pytest
import torch

from megakernel_agent.tasks.kimi_linear.megakernel import pair_nibbles, tile_major
from megakernel_agent.tasks.kimi_linear.quant import dequantize, dequantize_experts, pack_int4, quantize, unpack_int4


def test_pack_unpack_round_trip_and_nibble_order():
    q = torch.randint(0, 16, (256, 48), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.shape == (128, 48)
    assert torch.equal(unpack_int4(packed), q)
    # even k in the low nibble, odd k in the high nibble (upstream layout)
    assert torch.equal(packed[5] & 0xF, q[10])
    assert torch.equal(packed[5] >> 4, q[11])


def test_quantize_dequant_error_is_within_half_a_step():
    w = torch.randn(512, 64) * 0.02
    wq, s, z = quantize(w, 128)
    assert wq.dtype == torch.uint8 and s.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    assert s.shape == (4, 64) and z.shape == (4, 64)
    assert torch.all((z >= 0) & (z <= 15)) and torch.equal(z, z.round())
    deq = dequantize(wq, s, z, 128).float()
    step = s.float().repeat_interleave(128, 0)
    # half a quantization step, plus the rounding of s (bf16) times |q - z| <= 15, plus bf16 output rounding
    bound = 0.5 * step + 15 * step * 2**-8 + deq.abs() * 2**-8
    assert torch.all((deq - w).abs() <= bound + 1e-7)
    assert (deq - w).pow(2).mean().sqrt() < 0.35 * step.mean()


def test_expert_batch_dequant_matches_single():
    e, k, n = 3, 256, 32
    wq = torch.randint(0, 256, (e, k // 2, n), dtype=torch.uint8)
    s = torch.rand(e, k // 128, n).to(torch.bfloat16)
    z = torch.randint(0, 16, (e, k // 128, n)).to(torch.bfloat16)
    batch = dequantize_experts(wq, s, z, 128)
    for i in range(e):
        assert torch.equal(batch[i], dequantize(wq[i], s[i], z[i], 128))


def test_tile_major_makes_each_column_tile_contiguous_and_pads_with_zeros():
    t = torch.randint(1, 256, (3, 5, 600), dtype=torch.int32).to(torch.uint8)   # 2 whole tiles + 88 columns
    out = tile_major(t, 256)
    assert out.shape == (3, 3, 5, 256) and out.is_contiguous()
    for e, r, col in [(0, 0, 0), (1, 4, 255), (2, 2, 256), (0, 3, 599), (2, 4, 511)]:
        assert out[e, col // 256, r, col % 256] == t[e, r, col]
    assert torch.equal(out[:, :2].transpose(1, 2).reshape(3, 5, 512), t[..., :512])
    assert not out[:, 2, :, 88:].any() and torch.equal(out[:, 2, :, :88], t[..., 512:])


def test_swizzled_tile_major_moves_each_16_byte_chunk_by_its_row():
    t = torch.randint(0, 256, (2, 9, 600), dtype=torch.int32).to(torch.uint8)
    plain, out = tile_major(t, 256), tile_major(t, 256, swizzled=True)
    assert out.shape == plain.shape and out.is_contiguous()
    for e, r, col in [(0, 0, 0), (1, 2, 17), (0, 3, 255), (1, 6, 300), (0, 7, 599), (1, 8, 143)]:
        pos = 16 * ((col % 256 // 16) ^ (r & 6)) + col % 16
        assert out[e, col // 256, r, pos] == t[e, r, col]
    assert torch.equal(out[:, :, [0, 1, 8]], plain[:, :, [0, 1, 8]])   # rows with r & 6 == 0 stay

    def chunks_by_half(x):   # each 128-byte half's eight 16-byte chunks, in sorted order
        return x.view(2, 3, 9, 2, 8, 16).sort(dim=-2).values

    assert not torch.equal(out, plain) and torch.equal(chunks_by_half(out), chunks_by_half(plain))
    with pytest.raises(ValueError, match="1-byte"):
        tile_major(t.to(torch.bfloat16), 256, swizzled=True)


def dp2a(x_pair: numpy.ndarray, word: numpy.ndarray, high: bool) -> numpy.ndarray:
    """PTX dp2a.lo / .hi with signed 16-bit a and unsigned 8-bit b: x0 * byte(0|2) + x1 * byte(1|3)."""
    first = 2 if high else 0
    b0, b1 = (word >> (8 * first)) & 0xFF, (word >> (8 * first + 8)) & 0xFF
    return x_pair[..., 0] * b0 + x_pair[..., 1] * b1


def test_paired_nibbles_give_each_column_its_two_weights_as_the_kernel_s_dp2a_reads_them():
    """gemv_chunk's per-word arithmetic on pair_nibbles' layout: an AND with 0x0F0F0F0F and .lo/.hi DP2A give
    columns c, c+1; .lo/.hi DP2A of the whole word less those give 16x columns c+2, c+3, against the exact sum
    over k = 2r, 2r+1."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (2 * 6, 256), generator=gen, dtype=torch.uint8)   # (k, columns)
    packed = pack_int4(q)                                                       # (r, columns)
    paired = pair_nibbles(packed)
    assert paired.shape == packed.shape and not torch.equal(paired, packed)
    assert torch.equal(torch.sort(torch.cat([paired & 0xF, paired >> 4]).flatten()).values,
                       torch.sort(torch.cat([packed & 0xF, packed >> 4]).flatten()).values)
    words = paired.numpy().view("<u4").astype(numpy.int64)                     # (r, 64): columns 4w..4w+3
    x = numpy.random.default_rng(4).integers(-32767, 32768, size=(6, 2), dtype=numpy.int64)   # (x[2r], x[2r+1])
    xr = x[:, None, :]
    lo = words & 0x0F0F0F0F
    a_lo, a_hi = dp2a(xr, lo, False), dp2a(xr, lo, True)
    got = numpy.stack([a_lo, a_hi, (dp2a(xr, words, False) - a_lo) // 16, (dp2a(xr, words, True) - a_hi) // 16],
                      axis=-1).reshape(6, 256)
    qn = q.numpy().astype(numpy.int64)
    want = x[:, 0:1] * qn[0::2] + x[:, 1:2] * qn[1::2]
    assert numpy.array_equal(got, want)


def test_paired_nibbles_match_the_absorb_rows_nibble_shifts():
    """AbsorbRow (seed.cu) reads column c+i's weight for k = 2r at bit 16 (i & 1) + 4 ((i >> 1) & 1), k = 2r+1
    eight bits above."""
    q = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(5), dtype=torch.uint8)
    words = pair_nibbles(pack_int4(q)).numpy().view("<u4")[0]
    for col in range(8):
        shift = 16 * (col & 1) + 4 * ((col >> 1) & 1)
        word = int(words[col // 4])
        assert (word >> shift) & 0xF == q[0, col] and (word >> (shift + 8)) & 0xF == q[1, col]


def test_pair_nibbles_refuses_what_is_not_whole_uint8_words():
    with pytest.raises(ValueError, match="4-byte words"):
        pair_nibbles(torch.zeros(2, 6, dtype=torch.uint8))
    with pytest.raises(ValueError, match="4-byte words"):
        pair_nibbles(torch.zeros(2, 8, dtype=torch.int16))
