import pytest
import torch

from megakernel_agent.tasks.kimi_linear.megakernel import tile_major
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
