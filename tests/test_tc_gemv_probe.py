"""The tensor-core GEMV probe's CPU side: the emulated tile_probe computes the reference GEMV, and the emulator
reads an MMA word the way tc_probe's image builder (whose kernel matched the reference on the H200) writes it."""

import importlib.util
import sys
from pathlib import Path

import numpy
import pytest
import torch

from megakernel_agent.tasks.kimi_linear.megakernel import tile_major

pytest.importorskip("cupy")   # the driver imports CuPy at the top; no GPU is used here

PATH = Path(__file__).resolve().parent.parent / "scripts" / "tc_gemv_probe.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("tc_gemv_probe", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize(("swizzled", "deferred"), [(False, False), (True, False), (True, True)])
def test_emulated_tile_loops_compute_the_reference_gemv(probe, swizzled, deferred):
    p = probe.make_problem(2, seed=3)
    y = probe.emulate_tile(p, probe.CHECK_STEPS, swizzled, deferred)
    want = probe.reference(p) * (probe.CHECK_STEPS // probe.PERIOD)
    assert numpy.abs(y - want).max() <= 1e-9 * numpy.abs(want).max()


def test_swizzled_rows_put_each_phase_of_a_tile_load_in_eight_bank_groups(probe):
    """A 16-byte shared load is served 8 lanes at a time; lanes that hit one 16-byte bank group at different
    addresses take a pass each. The tile loop's lanes read packed rows 2t of a k-block, 256 B apart. The
    probe's swizzled image is the binding's swizzled w_q layout."""
    def groups_per_phase(swizzled):
        offset = 2 * probe.LANE_T * probe.TILE + 16 * probe.lane_chunks(swizzled)   # (g, t), lane = 4g + t
        group = (offset // 16 % 8).reshape(-1)                                       # in lane order
        return [len(set(group[8 * q:8 * q + 8])) for q in range(4)]

    assert groups_per_phase(False) == [2, 2, 2, 2]   # four lanes per group: 4 passes
    assert groups_per_phase(True) == [8, 8, 8, 8]
    rows = numpy.random.default_rng(6).integers(0, 256, size=(2, 40, probe.TILE), dtype=numpy.uint8)
    binding = tile_major(torch.from_numpy(rows), probe.TILE, swizzled=True)   # one column tile per matrix
    assert numpy.array_equal(probe.swizzle_rows(rows), binding.reshape(rows.shape).numpy())   # the same layout


def test_emulated_tile_probe_notices_a_wrong_column_pairing(probe, monkeypatch):
    """The check above can fail: pairing the wrong two columns of a word into an m-tile breaks the sums."""
    p = probe.make_problem(1, seed=4)
    right = probe.prmt
    monkeypatch.setattr(probe, "prmt", lambda a, b, sel: right(a, b, 0x5410 if sel == 0x7632 else sel))
    y = probe.emulate_tile(p, probe.PERIOD)
    want = probe.reference(p)
    assert numpy.abs(y - want).max() > 0.1 * numpy.abs(want).max()


def test_emulated_mma_reads_words_as_tc_probe_writes_them(probe):
    rng = numpy.random.default_rng(5)
    q = rng.integers(0, 16, size=(1, 8, 4, 8), dtype=numpy.uint32)   # (set, g, t, nibble in A_NIBBLES order)
    word = numpy.zeros((1, 8, 4), dtype=numpy.uint32)
    a = numpy.zeros((1, 16, 16))
    for n, (shift, dk, dn) in enumerate(probe.A_NIBBLES):
        word |= q[..., n] << shift
        offset = probe.LO_OFFSET if dk < 8 else probe.HI_OFFSET
        a[:, probe.LANE_G + dn, 2 * probe.LANE_T + dk] = q[..., n] + offset
    b = rng.standard_normal((1, 16, 8)).astype(numpy.float16)
    bits = b.view(numpy.uint16).astype(numpy.uint32)
    g, t = probe.LANE_G, probe.LANE_T
    b0 = bits[:, 2 * t, g] | (bits[:, 2 * t + 1, g] << 16)
    b1 = bits[:, 2 * t + 8, g] | (bits[:, 2 * t + 9, g] << 16)
    d = probe.mma_int4_emulated(word, b0, b1)
    assert numpy.array_equal(d, a @ b.astype(numpy.float64))
