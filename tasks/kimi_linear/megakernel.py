"""Host binding of the Kimi megakernel: a drop-in `Model` whose `step` is one cooperative launch.

The model has the reference's module tree (strict state-dict loads). On the first step the int4
weights are copied into the kernel's tile-major layout (abi.py; about the weights' size again in
device memory) and their pointers packed into the kernel's parameter struct; `load_state_dict` and
`.to()` make the next step repeat this, and so does `weights_changed()` after an in-place edit of a
weight buffer (the kernel reads the copies, never the module's buffers). Per step only the state
pointers, the cache length and the output buffer change, edited in place in the same struct. KDA
states are updated in place, the MLA cache lives in a preallocated capacity buffer (row `ctx_len`
is written by the kernel) and the returned state holds views of it. A state the caller hands in
is always read from its own tensors, so a new or externally modified state is honoured.

The returned hidden vector lives in a ring of two buffers: it stays valid until the step after
next (clone it to keep it longer).

Imports only torch/ctypes and modules that import nothing else from this project (export embeds
this file after them and drops the relative imports).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace

import torch

from ..cuda_runtime import (
    LAUNCH_CONTRACT_MACRO,
    CompiledKernel,
    CooperativeLauncher,
    KernelContractError,
    compile_kernel,
    stream_getter,
)
from .abi import (
    DECLARATIONS,
    ENTRY,
    NUM_PROJ,
    ROUTE_FOLD_SYMBOL,
    WEIGHT_MMA_SYMBOL,
    WEIGHT_NIBBLES_SYMBOL,
    WEIGHT_SWIZZLE_MASK,
    WEIGHT_SWIZZLE_SYMBOL,
    WEIGHT_TILE,
    c_header,
    params_type,
)
from .modules import KimiBlocks, rope_inv_freq
from .quant import dequantize

RMS_EPS = 1.0e-6
SAME_CONTEXT = "all MLA layers must hold the same number of cached tokens"


def kernel_defines(cfg) -> dict[str, str]:
    """Task dimensions for `-D`: the kernel takes every shape from here."""
    mla_mask = sum(1 << i for i, kind in enumerate(cfg.pattern) if kind == "M")
    return {
        "HIDDEN": str(cfg.hidden),
        "KDA_H": str(cfg.kda_heads),
        "KDA_D": str(cfg.kda_head_dim),
        "CONV_K": str(cfg.short_conv),
        "MLA_H": str(cfg.mla_heads),
        "KV_LORA": str(cfg.kv_lora),
        "QK_NOPE": str(cfg.qk_nope),
        "QK_ROPE": str(cfg.qk_rope),
        "V_HEAD": str(cfg.v_head),
        "N_EXPERTS": str(cfg.n_experts),
        "N_ACTIVE": str(cfg.n_active),
        "N_SHARED": str(cfg.n_shared),
        "MOE_INTER": str(cfg.moe_inter),
        "QGROUP": str(cfg.group),
        "NUM_LAYERS": str(len(cfg.pattern)),
        "MLA_LAYER_MASK": str(mla_mask),
        "ROUTED_SCALING": f"{cfg.routed_scaling!r}f",
        "MLA_SCALE": f"{(cfg.qk_nope + cfg.qk_rope) ** -0.5!r}f",
        "RMS_EPS": f"{RMS_EPS!r}f",
    }


def kernel_prelude(cfg) -> str:
    """Text prepended to every candidate: CUDA headers, the ABI structs and the launch macro."""
    return "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n" + c_header(len(cfg.pattern)) + LAUNCH_CONTRACT_MACRO


def route_fold(router_w: torch.Tensor, moe_norm: torch.Tensor, o_proj) -> torch.Tensor:
    """A layer's router folded through its MoE norm and attention output projection (abi.py: route_fold), in fp64
    and then bf16: [router_w * moe_norm | (router_w * moe_norm) W_o^T], one row per expert."""
    norm_rows = router_w.double() * moe_norm.double()[None, :]
    w_o = dequantize(o_proj.w_q, o_proj.scales, o_proj.zeros, o_proj.group).double()
    return torch.cat([norm_rows, norm_rows @ w_o.T], dim=1).to(torch.bfloat16).contiguous()


@dataclass(frozen=True)
class CacheBuffers:
    """One MLA layer's capacity buffers and their device pointers (read once, used every step)."""

    c_kv: torch.Tensor
    k_rope: torch.Tensor
    c_kv_ptr: int
    k_rope_ptr: int
    rows: int


class _KdaSlot:
    """One KDA layer's entry in the parameter block and the state tensors (and pointers) now in it."""

    __slots__ = ("layer", "params", "S", "cq", "ck", "cv", "ptrs")

    def __init__(self, layer: int, params) -> None:
        self.layer, self.params = layer, params
        self.S = self.cq = self.ck = self.cv = self.ptrs = None


class _MlaSlot:
    """One MLA layer's entry in the parameter block, its capacity buffers, and the cache views the
    last step returned: a state that hands those views back is recognised without re-reading shapes."""

    __slots__ = ("layer", "params", "cap", "c_kv", "k_rope", "rows", "c_kv_numel", "k_rope_numel")

    def __init__(self, layer: int) -> None:
        self.layer, self.params, self.cap = layer, None, None
        self.c_kv = self.k_rope = None
        self.rows = self.c_kv_numel = self.k_rope_numel = 0


class MegakernelModel(KimiBlocks):
    """`step(hidden, state) -> (hidden, state)` with exactly one kernel launch."""

    def __init__(self, cfg, kernel: CompiledKernel | None = None, source: str | None = None,
                 knob_defines: dict[str, str] | None = None):
        """Give a compiled `kernel`, or a `source` (plus knob values) compiled on the first step's device."""
        super().__init__(cfg)
        self._kernel = kernel
        self._source, self._knob_defines = source, dict(knob_defines or {})
        self._launcher: CooperativeLauncher | None = None
        self._params = None
        self._ring: list[torch.Tensor] = []
        self._ring_ptrs: list[int] = []
        self._ring_next = [0]   # a list, so that the hot path never goes through nn.Module.__setattr__
        self._mla_slots = [_MlaSlot(i) for i, kind in enumerate(cfg.pattern) if kind == "M"]
        self._kda_slots: list[_KdaSlot] = []
        self._num_layers = len(cfg.pattern)
        self._kv_stride, self._rope_stride = (cfg.kv_lora, 1), (cfg.qk_rope, 1)
        self._tiled: list[torch.Tensor] = []   # the kernel's tile-major weight copies (owned here)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.weights_changed())

    def attach(self, kernel: CompiledKernel) -> MegakernelModel:
        """Use `kernel` from the next step on (its weight copies are laid out afresh, the old ones freed)."""
        self._kernel = kernel
        self.weights_changed()
        return self

    def _apply(self, fn, *args, **kwargs):
        self.weights_changed()  # weights moved
        return super()._apply(fn, *args, **kwargs)

    def weights_changed(self) -> None:
        """Re-lay the weights out for the kernel on the next step (call after editing one in place)."""
        self._launcher = None
        self._tiled = []

    # ---- one-time packing -------------------------------------------------------------------

    def _pack(self, device: torch.device) -> None:
        if self._kernel is None and self._source is not None:
            with torch.cuda.device(device):
                self._kernel = build_megakernel(self._source, self.cfg, self._knob_defines)
        if self._kernel is None:
            raise RuntimeError("no kernel attached: call attach(kernel) or construct with source=...")
        size = self._kernel.read_u64("kimi_abi_size")
        ptype = params_type(len(self.cfg.pattern))
        if size != ctypes.sizeof(ptype):
            raise KernelContractError(f"kernel ABI size {size} != host KimiParams size {ctypes.sizeof(ptype)}")
        p = ptype()
        declarations = ((WEIGHT_SWIZZLE_SYMBOL, "MK_SWIZZLED_WEIGHTS"), (WEIGHT_NIBBLES_SYMBOL, "MK_PAIRED_NIBBLES"),
                        (WEIGHT_MMA_SYMBOL, "MK_MMA_WEIGHTS"), (ROUTE_FOLD_SYMBOL, "MK_ROUTE_FOLD"))
        for symbol, macro in declarations:
            value = self._kernel.declared.get(symbol, 0)
            if value not in (0, 1):
                raise KernelContractError(f"the kernel's {symbol} is {value}: 0 or 1 ({macro})")
        layout = WqLayout(swizzled=self._kernel.declared.get(WEIGHT_SWIZZLE_SYMBOL, 0) == 1,
                          paired=self._kernel.declared.get(WEIGHT_NIBBLES_SYMBOL, 0) == 1,
                          mma=self._kernel.declared.get(WEIGHT_MMA_SYMBOL, 0) == 1)
        fold = self._kernel.declared.get(ROUTE_FOLD_SYMBOL, 0) == 1
        for i, blk in enumerate(self.blocks):
            lp = p.layer[i]
            lp.attn_norm = blk.attn_norm.data_ptr()
            lp.moe_norm = blk.moe_norm.data_ptr()
            projs = (
                [blk.attn.q_proj, blk.attn.k_proj, blk.attn.v_proj, blk.attn.g_proj, blk.attn.o_proj]
                if blk.kind == "K"
                else [blk.attn.q_proj, blk.attn.kv_a, blk.attn.kv_b, blk.attn.o_proj]
            )
            row_read = blk.attn.kv_b if blk.kind != "K" else None   # the absorbs read MLA's kv_b row by row
            for j, lin in enumerate(projs[:NUM_PROJ]):
                self._set_qw(lp.proj[j], lin, replace(layout, mma=False) if lin is row_read else layout)
            if blk.kind == "K":
                lp.beta_w = blk.attn.beta_proj.weight.data_ptr()
                lp.conv_w = blk.attn.conv_w.data_ptr()
            lp.router_w = blk.moe.router.weight.data_ptr()
            if fold:
                folded = route_fold(blk.moe.router.weight, blk.moe_norm, projs[-1])
                self._tiled.append(folded)
                lp.route_fold = folded.data_ptr()
            for j, ex in enumerate((blk.moe.gate, blk.moe.up, blk.moe.down)):
                self._set_qw(lp.expert[j], ex, layout)
            for j, ex in enumerate((blk.moe.s_gate, blk.moe.s_up, blk.moe.s_down)):
                self._set_qw(lp.shared[j], ex, layout)
        c = self._kernel.contract
        self._scratch = torch.full((c.scratch_bytes,), 0xFF, dtype=torch.uint8, device=device)  # NaN floats
        self._counters = torch.zeros((max(c.counter_words, 1),), dtype=torch.int32, device=device)
        self._rope = rope_inv_freq(self.cfg.qk_rope, self.cfg.rope_theta, device)
        self._ring = [torch.empty(self.cfg.hidden, dtype=torch.bfloat16, device=device) for _ in range(2)]
        self._ring_ptrs = [t.data_ptr() for t in self._ring]
        p.rope_inv_freq = self._rope.data_ptr()
        p.scratch = self._scratch.data_ptr()
        p.counters = self._counters.data_ptr()
        self._params = p
        self._kda_slots = [_KdaSlot(i, p.layer[i]) for i, kind in enumerate(self.cfg.pattern) if kind == "K"]
        for slot in self._mla_slots:   # a re-pack keeps the capacity buffers (and returned views) in place
            slot.params = p.layer[slot.layer]
            if slot.cap is not None:
                slot.params.c_kv, slot.params.k_rope = slot.cap.c_kv_ptr, slot.cap.k_rope_ptr
        self._stream = stream_getter(device)
        self._launcher = CooperativeLauncher(self._kernel, p)

    def _set_qw(self, dst, mod, layout: WqLayout) -> None:
        """Point `dst` at tile-major copies of one quantized weight's w_q (in the `layout` the kernel declared),
        scales and zeros."""
        if layout.mma:
            w_q = mma_fragments(tile_major(mod.w_q))
        else:
            w_q = tile_major(mod.w_q, swizzled=layout.swizzled)
            w_q = pair_nibbles(w_q) if layout.paired else w_q
        tiled = [w_q, tile_major(mod.scales), tile_major(mod.zeros)]
        self._tiled += tiled
        dst.wq, dst.sc, dst.zr = (t.data_ptr() for t in tiled)

    # ---- per step -----------------------------------------------------------------------------

    def _adopt_cache(self, slot: _MlaSlot, c_kv: torch.Tensor, k_rope: torch.Tensor, device) -> int:
        """Place the caller's cache rows in the layer's capacity buffers (copying only when they are not
        already ours, growing the buffers when a row would not fit) and return their row count."""
        lora, rope = self.cfg.kv_lora, self.cfg.qk_rope
        if (c_kv.dim() != 2 or k_rope.dim() != 2 or c_kv.shape[1] != lora or k_rope.shape[1] != rope
                or k_rope.shape[0] != c_kv.shape[0]):
            raise ValueError(f"state[{slot.layer}]: c_kv must be (rows, {lora}) and k_rope (rows, {rope}) "
                             f"with the same rows, got {tuple(c_kv.shape)} and {tuple(k_rope.shape)}")
        n = c_kv.shape[0]
        cap = slot.cap
        ours = (
            cap is not None
            and c_kv.data_ptr() == cap.c_kv_ptr
            and k_rope.data_ptr() == cap.k_rope_ptr
            and c_kv.stride() == self._kv_stride
            and k_rope.stride() == self._rope_stride
            and n < cap.rows
        )
        if not ours:
            if cap is None or n + 1 > cap.rows:
                rows = max(2 * cap.rows if cap is not None else 0, ((n + 1 + 4095) // 4096) * 4096)
                ckv_buf = torch.empty((rows, lora), dtype=torch.bfloat16, device=device)
                krope_buf = torch.empty((rows, rope), dtype=torch.bfloat16, device=device)
                cap = CacheBuffers(ckv_buf, krope_buf, ckv_buf.data_ptr(), krope_buf.data_ptr(), rows)
            for buf, src in ((cap.c_kv, c_kv), (cap.k_rope, k_rope)):
                if src.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr():
                    src = src.clone()   # rows taken from elsewhere in our own buffer: copy_ must not overlap
                buf[:n].copy_(src)
            slot.cap = cap
            slot.params.c_kv, slot.params.k_rope = cap.c_kv_ptr, cap.k_rope_ptr
        return n

    def _publish_caches(self, state: list[dict], rows: int) -> None:
        """Put views of every MLA layer's first `rows` cache rows into `state` and remember them for the
        next step's fast path (unless the next row would not fit: then the general path grows the buffers)."""
        kv_stride, rope_stride = self._kv_stride, self._rope_stride
        kv_shape, rope_shape = (rows, kv_stride[0]), (rows, rope_stride[0])
        for slot in self._mla_slots:
            cap = slot.cap
            c_kv = cap.c_kv.as_strided(kv_shape, kv_stride)   # as_strided: the cheapest view op
            k_rope = cap.k_rope.as_strided(rope_shape, rope_stride)
            st = state[slot.layer]
            st["c_kv"], st["k_rope"] = c_kv, k_rope
            if rows < cap.rows:
                slot.c_kv, slot.k_rope, slot.rows = c_kv, k_rope, rows
                slot.c_kv_numel, slot.k_rope_numel = rows * kv_shape[1], rows * rope_shape[1]
            else:
                slot.c_kv = slot.k_rope = None

    def _validate(self, t: torch.Tensor, layer: int, key: str) -> None:
        h, dk, c = self.cfg.kda_heads, self.cfg.kda_head_dim, self.cfg.kda_heads * self.cfg.kda_head_dim
        dtype, shape = (torch.float32, (h, dk, dk)) if key == "S" else (torch.bfloat16, (self.cfg.short_conv - 1, c))
        if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous() or not t.is_cuda:
            raise ValueError(f"state[{layer}][{key!r}] must be a contiguous CUDA {dtype} tensor of shape {shape}, "
                             f"got {t.dtype} {tuple(t.shape)}")

    def poison(self, state: list[dict]) -> None:
        """Fill what the next step must write (output buffer, cache rows from ctx_len on) with NaN."""
        if self._launcher is None:
            self._pack(self.blocks[0].attn_norm.device)
        self._ring[self._ring_next[0]].fill_(float("nan"))
        counts = set()
        for slot in self._mla_slots:
            st = state[slot.layer]
            n = self._adopt_cache(slot, st["c_kv"], st["k_rope"], self._ring[0].device)
            slot.cap.c_kv[n:].fill_(float("nan"))
            slot.cap.k_rope[n:].fill_(float("nan"))
            counts.add(n)
        if len(counts) > 1:
            raise ValueError(SAME_CONTEXT)
        if counts:
            self._publish_caches(state, counts.pop())

    def _checked_hidden(self, hidden: torch.Tensor) -> tuple[torch.Tensor, int]:
        """A caller's input vector, checked, and copied when it is not 16-byte aligned (the kernel reads
        it with 16-byte loads); returned with its pointer."""
        if hidden.dtype != torch.bfloat16 or hidden.numel() != self.cfg.hidden or not hidden.is_contiguous():
            raise ValueError(f"hidden must be a contiguous bf16 vector of {self.cfg.hidden}, got {tuple(hidden.shape)}")
        if hidden.data_ptr() % 16:
            hidden = hidden.clone()
        return hidden, hidden.data_ptr()

    def _adopt_kda_state(self, slot: _KdaSlot, S, cq, ck, cv) -> None:
        """Check a layer's KDA state tensors the first time these objects are seen, then remember them."""
        for key, t in zip(("S", "cq", "ck", "cv"), (S, cq, ck, cv), strict=True):   # new objects: check once
            self._validate(t, slot.layer, key)
        slot.S, slot.cq, slot.ck, slot.cv = S, cq, ck, cv

    def step(self, hidden: torch.Tensor, state: list[dict], out: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, list[dict]]:
        """One decode step, one launch. No autograd is involved (weights are only read by the kernel). The
        output goes to `out` when given (16-byte aligned; the sandbox keeps every output of a timed chain),
        else to the ring.

        The hot path is written for host time (the ~10 µs budget): every check a state needs is made, but
        tensors seen before are recognised by identity and only their pointers (and, for the cache views
        we returned, their sizes) are re-read, so a re-pointed or resized tensor is still noticed."""
        if self._launcher is None:
            self._pack(hidden.device)
        ring = self._ring
        if hidden is ring[0] or hidden is ring[1]:   # the previous step's output: ours, checked, aligned
            hidden_ptr = self._ring_ptrs[hidden is ring[1]]
        else:
            hidden, hidden_ptr = self._checked_hidden(hidden)
        if len(state) != self._num_layers:
            raise ValueError(f"state has {len(state)} layers, the model has {self._num_layers}")
        for kda in self._kda_slots:
            st = state[kda.layer]
            S, cq, ck, cv = st["S"], st["cq"], st["ck"], st["cv"]
            if S is not kda.S or cq is not kda.cq or ck is not kda.ck or cv is not kda.cv:
                self._adopt_kda_state(kda, S, cq, ck, cv)
            ptrs = (S.data_ptr(), cq.data_ptr(), ck.data_ptr(), cv.data_ptr())
            if ptrs != kda.ptrs:
                lp = kda.params
                lp.S = ptrs[0]
                conv = lp.conv_state
                conv[0], conv[1], conv[2] = ptrs[1:]
                kda.ptrs = ptrs
        ctx = -1
        for mla in self._mla_slots:
            st = state[mla.layer]
            c_kv, k_rope = st["c_kv"], st["k_rope"]
            cap = mla.cap
            if (c_kv is mla.c_kv and k_rope is mla.k_rope and c_kv.data_ptr() == cap.c_kv_ptr
                    and k_rope.data_ptr() == cap.k_rope_ptr and c_kv.numel() == mla.c_kv_numel
                    and k_rope.numel() == mla.k_rope_numel):
                n = mla.rows
            else:
                n = self._adopt_cache(mla, c_kv, k_rope, hidden.device)
            if ctx != n and ctx >= 0:
                raise ValueError(SAME_CONTEXT)
            ctx = n
        p = self._params
        if out is None:
            slot = self._ring_next[0]
            self._ring_next[0] = slot ^ 1
            out, p.hidden_out = ring[slot], self._ring_ptrs[slot]
        else:
            p.hidden_out = self._checked_out(out)
            if p.hidden_out == hidden_ptr:
                raise ValueError("out must not be the input vector")
        p.hidden_in = hidden_ptr
        p.ctx_len = ctx if ctx > 0 else 0
        self._launcher.launch(self._stream())
        if ctx >= 0:
            self._publish_caches(state, ctx + 1)
        return out, state

    def _checked_out(self, out: torch.Tensor) -> int:
        """The pointer of a caller's output buffer: a contiguous, 16-byte aligned bf16 vector on our device."""
        if (out.dtype != torch.bfloat16 or out.numel() != self.cfg.hidden or not out.is_contiguous()
                or out.device != self._ring[0].device or out.data_ptr() % 16):
            raise ValueError(f"out must be a contiguous, 16-byte aligned bf16 vector of {self.cfg.hidden} on "
                             f"{self._ring[0].device}")
        return out.data_ptr()


@dataclass(frozen=True)
class WqLayout:
    """How the kernel asked for w_q's tiles: rows swizzled (MK_SWIZZLED_WEIGHTS), nibbles paired (MK_PAIRED_NIBBLES),
    or in integer-MMA fragment order (MK_MMA_WEIGHTS, which then overrides the other two)."""

    swizzled: bool = False
    paired: bool = False
    mma: bool = False


def pair_nibbles(t: torch.Tensor) -> torch.Tensor:
    """(..., cols) packed uint8, cols % 4 == 0 -> the same with each 4-byte word's nibbles paired (abi.py): bytes
    (c,2r | c+2,2r) (c,2r+1 | c+2,2r+1) (c+1,2r | c+3,2r) (c+1,2r+1 | c+3,2r+1) from (c+i: 2r | 2r+1)."""
    if t.dtype != torch.uint8 or t.shape[-1] % 4:
        raise ValueError(f"paired nibbles need uint8 rows of whole 4-byte words, got {t.dtype} {tuple(t.shape)}")
    w = t.view(*t.shape[:-1], -1, 4)
    lo, hi = w & 0xF, w >> 4
    paired = torch.stack((lo[..., 0] | lo[..., 2] << 4, hi[..., 0] | hi[..., 2] << 4,
                          lo[..., 1] | lo[..., 3] << 4, hi[..., 1] | hi[..., 3] << 4), dim=-1)
    return paired.view(t.shape).contiguous()


def mma_fragments(tiled: torch.Tensor) -> torch.Tensor:
    """Tile-major packed w_q (..., rows, WEIGHT_TILE) uint8, rows % 16 == 0 -> the same bytes in MMA fragment order
    (abi.py, MK_MMA_WEIGHTS): per 16-row slab, [warp w][lane 4g + t][register i][byte j] holds column
    32w + 4g + (i & 1) (low nibble) and that column + 2 (high) at k = 4t + j + 16 (i >> 1) of the slab."""
    if tiled.dtype != torch.uint8 or tiled.shape[-1] != WEIGHT_TILE or tiled.shape[-2] % 16:
        raise ValueError(f"MMA fragments need uint8 tiles of {WEIGHT_TILE} columns and whole 16-row slabs, got "
                         f"{tiled.dtype} {tuple(tiled.shape)}")
    *lead, rows, cols = tiled.shape
    slabs = tiled.reshape(*lead, rows // 16, 16, cols)
    q = torch.stack((slabs & 0xF, slabs >> 4), dim=-2).reshape(*lead, rows // 16, 32, cols)   # k = 2r + nibble
    w, g, t, i, j = torch.meshgrid(*(torch.arange(n, device=tiled.device) for n in (cols // 32, 8, 4, 4, 4)),
                                   indexing="ij")
    k = (4 * t + j + 16 * (i >> 1)).flatten()
    col = (32 * w + 4 * g + (i & 1)).flatten()
    out = q[..., k, col] | (q[..., k, col + 2] << 4)
    return out.reshape(tiled.shape).contiguous()


def tile_major(t: torch.Tensor, tile: int = WEIGHT_TILE, swizzled: bool = False) -> torch.Tensor:
    """(..., rows, cols) -> (..., ceil(cols/tile), rows, tile), zero-padded to whole tiles: a column
    tile's rows become contiguous (the kernel fetches a chunk of them with one bulk copy). `swizzled`
    (1-byte elements): row r's 16-byte chunk c moves to position c ^ (r & WEIGHT_SWIZZLE_MASK)."""
    if swizzled and (t.element_size() != 1 or tile % 128):
        raise ValueError(f"swizzled rows need 1-byte elements and whole 128-byte row groups, got "
                         f"{t.dtype} and tile {tile}")
    *lead, rows, cols = t.shape
    tiles = -(-cols // tile)
    padded = t.new_zeros(*lead, rows, tiles * tile)
    padded[..., :cols] = t
    out = padded.view(*lead, rows, tiles, tile).transpose(-3, -2).contiguous()
    if not swizzled:
        return out
    r = torch.arange(rows, device=t.device)[:, None]
    source = torch.arange(tile // 16, device=t.device)[None, :] ^ (r & WEIGHT_SWIZZLE_MASK)   # position p <- chunk
    chunks = out.view(*out.shape[:-1], tile // 16, 16)
    return torch.gather(chunks, -2, source[..., None].expand_as(chunks)).view(out.shape)


def build_megakernel(source: str, cfg, extra_defines: dict[str, str] | None = None, arch: str | None = None):
    """Compile `source` for `cfg` (prelude + `-D` dims and knob values) and return the loaded kernel."""
    defines = {**kernel_defines(cfg), **(extra_defines or {})}
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    options = ("-std=c++17", f"-arch={arch}", *(f"-D{k}={v}" for k, v in defines.items()))
    return compile_kernel(kernel_prelude(cfg) + source, ENTRY, options, DECLARATIONS)
