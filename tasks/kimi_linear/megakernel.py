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
from dataclasses import dataclass

import torch

from ..cuda_runtime import LAUNCH_CONTRACT_MACRO, CompiledKernel, CooperativeLauncher, compile_kernel, stream_getter
from .abi import ENTRY, NUM_PROJ, WEIGHT_TILE, c_header, params_type
from .modules import KimiBlocks, rope_inv_freq

RMS_EPS = 1.0e-6


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


@dataclass(frozen=True)
class CacheBuffers:
    """One MLA layer's capacity buffers and their device pointers (read once, used every step)."""

    c_kv: torch.Tensor
    k_rope: torch.Tensor
    c_kv_ptr: int
    k_rope_ptr: int


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
        self._caches: dict[int, CacheBuffers] = {}
        self._mla_layers = [i for i, kind in enumerate(cfg.pattern) if kind == "M"]
        self._kda_layers = [i for i, kind in enumerate(cfg.pattern) if kind == "K"]
        self._tiled: list[torch.Tensor] = []   # the kernel's tile-major weight copies (owned here)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.weights_changed())

    def attach(self, kernel: CompiledKernel) -> MegakernelModel:
        self._kernel = kernel
        self._launcher = None
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
            raise RuntimeError(f"kernel ABI size {size} != host KimiParams size {ctypes.sizeof(ptype)}")
        p = ptype()
        for i, blk in enumerate(self.blocks):
            lp = p.layer[i]
            lp.attn_norm = blk.attn_norm.data_ptr()
            lp.moe_norm = blk.moe_norm.data_ptr()
            projs = (
                [blk.attn.q_proj, blk.attn.k_proj, blk.attn.v_proj, blk.attn.g_proj, blk.attn.o_proj]
                if blk.kind == "K"
                else [blk.attn.q_proj, blk.attn.kv_a, blk.attn.kv_b, blk.attn.o_proj]
            )
            for j, lin in enumerate(projs[:NUM_PROJ]):
                self._set_qw(lp.proj[j], lin)
            if blk.kind == "K":
                lp.beta_w = blk.attn.beta_proj.weight.data_ptr()
                lp.conv_w = blk.attn.conv_w.data_ptr()
            lp.router_w = blk.moe.router.weight.data_ptr()
            for j, ex in enumerate((blk.moe.gate, blk.moe.up, blk.moe.down)):
                self._set_qw(lp.expert[j], ex)
            for j, ex in enumerate((blk.moe.s_gate, blk.moe.s_up, blk.moe.s_down)):
                self._set_qw(lp.shared[j], ex)
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
        self._layer_params = [p.layer[i] for i in range(len(self.cfg.pattern))]
        self._validated = {}
        self._kda_ptrs = {}   # per KDA layer: the state pointers now in the struct
        for layer, cap in self._caches.items():   # a re-pack keeps the capacity buffers in place
            p.layer[layer].c_kv, p.layer[layer].k_rope = cap.c_kv_ptr, cap.k_rope_ptr
        self._stream = stream_getter(device)
        self._launcher = CooperativeLauncher(self._kernel, p)

    def _set_qw(self, dst, mod) -> None:
        """Point `dst` at tile-major copies of one quantized weight's w_q, scales and zeros."""
        tiled = [tile_major(t) for t in (mod.w_q, mod.scales, mod.zeros)]
        self._tiled += tiled
        dst.wq, dst.sc, dst.zr = (t.data_ptr() for t in tiled)

    # ---- per step -----------------------------------------------------------------------------

    def _cache_for(self, layer: int, st: dict, device) -> tuple[CacheBuffers, int]:
        """Capacity buffers holding the caller's cache rows, and their row count; copies only when
        the caller's rows are not ours."""
        c_kv, k_rope = st["c_kv"], st["k_rope"]
        n = c_kv.shape[0]
        if k_rope.shape[0] != n:
            raise ValueError(f"layer {layer}: c_kv has {n} rows but k_rope has {k_rope.shape[0]}")
        cap = self._caches.get(layer)
        ours = (
            cap is not None
            and c_kv.data_ptr() == cap.c_kv_ptr
            and k_rope.data_ptr() == cap.k_rope_ptr
            and n < cap.c_kv.shape[0]
        )
        if not ours:
            rows = cap.c_kv.shape[0] if cap is not None else 0
            if n + 1 > rows:
                rows = max(2 * rows, ((n + 1 + 4095) // 4096) * 4096)
                ckv_buf = torch.empty((rows, self.cfg.kv_lora), dtype=torch.bfloat16, device=device)
                krope_buf = torch.empty((rows, self.cfg.qk_rope), dtype=torch.bfloat16, device=device)
                cap = CacheBuffers(ckv_buf, krope_buf, ckv_buf.data_ptr(), krope_buf.data_ptr())
            cap.c_kv[:n].copy_(c_kv)
            cap.k_rope[:n].copy_(k_rope)
            self._caches[layer] = cap
            lp = self._layer_params[layer]
            lp.c_kv, lp.k_rope = cap.c_kv_ptr, cap.k_rope_ptr
        return cap, n

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
        for layer in self._mla_layers:
            cap, n = self._cache_for(layer, state[layer], self._ring[0].device)
            cap.c_kv[n:].fill_(float("nan"))
            cap.k_rope[n:].fill_(float("nan"))
            state[layer]["c_kv"], state[layer]["k_rope"] = cap.c_kv[:n], cap.k_rope[:n]

    def step(self, hidden: torch.Tensor, state: list[dict]) -> tuple[torch.Tensor, list[dict]]:
        """One decode step, one launch. No autograd is involved (weights are only read by the kernel)."""
        if self._launcher is None:
            self._pack(hidden.device)
        p = self._params
        ring = self._ring
        if hidden is ring[0] or hidden is ring[1]:   # the previous step's output: ours, checked, aligned
            hidden_ptr = self._ring_ptrs[hidden is ring[1]]
        else:
            if hidden.dtype != torch.bfloat16 or hidden.numel() != self.cfg.hidden or not hidden.is_contiguous():
                raise ValueError(f"hidden must be a contiguous bf16 vector of {self.cfg.hidden}, "
                                 f"got {tuple(hidden.shape)}")
            if hidden.data_ptr() % 16:   # the kernel reads the input with 16-byte loads
                hidden = hidden.clone()
            hidden_ptr = hidden.data_ptr()
        if len(state) != len(self.cfg.pattern):
            raise ValueError(f"state has {len(state)} layers, the model has {len(self.cfg.pattern)}")
        for i in self._kda_layers:
            st = state[i]
            S, cq, ck, cv = st["S"], st["cq"], st["ck"], st["cv"]
            seen = self._validated.get(i)
            if seen is None or seen[0] is not S or seen[1] is not cq or seen[2] is not ck or seen[3] is not cv:
                for key, t in zip(("S", "cq", "ck", "cv"), (S, cq, ck, cv), strict=True):   # new objects: check once
                    self._validate(t, i, key)
                self._validated[i] = (S, cq, ck, cv)
            # pointers are read every step (a checked object may have been re-pointed), written on change
            ptrs = (S.data_ptr(), cq.data_ptr(), ck.data_ptr(), cv.data_ptr())
            if ptrs != self._kda_ptrs.get(i):
                lp = self._layer_params[i]
                lp.S = ptrs[0]
                conv = lp.conv_state
                conv[0], conv[1], conv[2] = ptrs[1:]
                self._kda_ptrs[i] = ptrs
        ctx = None
        for i in self._mla_layers:
            _, n = self._cache_for(i, state[i], hidden.device)
            if ctx is not None and n != ctx:
                raise ValueError("all MLA layers must hold the same number of cached tokens")
            ctx = n
        slot = self._ring_next[0]
        out = ring[slot]
        self._ring_next[0] = slot ^ 1
        p.hidden_in = hidden_ptr
        p.hidden_out = self._ring_ptrs[slot]
        p.ctx_len = ctx or 0
        self._launcher.launch(self._stream())
        lora, rope = self.cfg.kv_lora, self.cfg.qk_rope
        for i in self._mla_layers:   # views of the first ctx + 1 rows (as_strided: the cheapest view op)
            cap = self._caches[i]
            state[i]["c_kv"] = cap.c_kv.as_strided((ctx + 1, lora), (lora, 1))
            state[i]["k_rope"] = cap.k_rope.as_strided((ctx + 1, rope), (rope, 1))
        return out, state


def tile_major(t: torch.Tensor, tile: int = WEIGHT_TILE) -> torch.Tensor:
    """(..., rows, cols) -> (..., ceil(cols/tile), rows, tile), zero-padded to whole tiles: a column
    tile's rows become contiguous (the kernel fetches a chunk of them with one bulk copy)."""
    *lead, rows, cols = t.shape
    tiles = -(-cols // tile)
    padded = t.new_zeros(*lead, rows, tiles * tile)
    padded[..., :cols] = t
    return padded.view(*lead, rows, tiles, tile).transpose(-3, -2).contiguous()


def build_megakernel(source: str, cfg, extra_defines: dict[str, str] | None = None, arch: str | None = None):
    """Compile `source` for `cfg` (prelude + `-D` dims and knob values) and return the loaded kernel."""
    defines = {**kernel_defines(cfg), **(extra_defines or {})}
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    options = ("-std=c++17", f"-arch={arch}", *(f"-D{k}={v}" for k, v in defines.items()))
    return compile_kernel(kernel_prelude(cfg) + source, ENTRY, options)
