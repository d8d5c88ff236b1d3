"""W4A16 weight format, bit-compatible with KernelBench-Mega: int4 packed along `in`, group-wise asymmetric.

w_q (in/2, out) uint8: packed row r holds k=2r in the low nibble and k=2r+1 in the high nibble.
scales, zeros (in/group, out) bf16.  W[k, n] = (q[k, n] - zeros[k/group, n]) * scales[k/group, n].
"""

from __future__ import annotations

import torch


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(K, N) integers in [0, 15] -> (K/2, N) uint8, even k in the low nibble."""
    if q.shape[0] % 2:
        raise ValueError(f"K={q.shape[0]} must be even to pack two nibbles per byte")
    q = q.to(torch.uint8)
    return ((q[0::2] & 0xF) | ((q[1::2] & 0xF) << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(K/2, ..., N) uint8 -> (K, ..., N) uint8 with values in [0, 15]; inverse of pack_int4."""
    lo = packed & 0xF
    hi = (packed >> 4) & 0xF
    return torch.stack((lo, hi), dim=1).reshape(packed.shape[0] * 2, *packed.shape[1:])


def quantize(w: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min/max asymmetric int4 quantization of an (in, out) weight, per `group` rows of `in`."""
    k, n = w.shape
    if k % group:
        raise ValueError(f"in={k} is not a multiple of group={group}")
    wg = w.float().reshape(k // group, group, n)
    wmin = wg.amin(dim=1, keepdim=True)
    wmax = wg.amax(dim=1, keepdim=True)
    scales = (wmax - wmin).clamp_min(1e-8) / 15.0
    zeros = (-wmin / scales).round().clamp(0, 15)
    q = ((wg / scales) + zeros).round().clamp(0, 15).reshape(k, n)
    return pack_int4(q), scales.squeeze(1).to(torch.bfloat16), zeros.squeeze(1).to(torch.bfloat16)


def dequantize(w_q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int = 128) -> torch.Tensor:
    """(in/2, out) packed weight -> (in, out) bf16, rounding exactly as the upstream reference does."""
    q = unpack_int4(w_q).to(torch.bfloat16)
    s = scales.repeat_interleave(group, dim=0)
    z = zeros.repeat_interleave(group, dim=0)
    return (q - z) * s


def dequantize_experts(w_q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int = 128) -> torch.Tensor:
    """Batched dequant of (E, in/2, out) expert weights -> (E, in, out) bf16."""
    lo = w_q & 0xF
    hi = (w_q >> 4) & 0xF
    q = torch.stack((lo, hi), dim=2).reshape(w_q.shape[0], w_q.shape[1] * 2, w_q.shape[2]).to(torch.bfloat16)
    s = scales.repeat_interleave(group, dim=1)
    z = zeros.repeat_interleave(group, dim=1)
    return (q - z) * s
