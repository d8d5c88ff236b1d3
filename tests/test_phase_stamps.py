"""The phase timeline's arithmetic on hand-made stamps: spans, waits and the critical block's events."""

import importlib.util
import math
from pathlib import Path

import torch

_path = Path(__file__).resolve().parent.parent / "scripts" / "kimi_phase_stamps.py"
_spec = importlib.util.spec_from_file_location("kimi_phase_stamps", _path)
stamps_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stamps_mod)

US = 1000   # stamps are in ns


def two_phase_stamps():
    """Three blocks, two phases. Rows: start, arrive0, release0, arrive1 (µs, per block)."""
    rows = [[0, 0, 1], [10, 12, 20], [21, 22, 23], [30, 31, 40]]
    t = torch.zeros(8, 4, dtype=torch.int64)
    t[:4, :3] = torch.tensor(rows) * US
    return t


def test_spans_and_waits_add_up_to_the_kernel_time():
    rows = stamps_mod.step_spans(two_phase_stamps(), blocks=3, phases=2)
    (span0, mean0, wait0), (span1, mean1, wait1) = rows
    assert (span0, wait0) == (20.0, 1.0)            # last arrival 20 - first start 0; first release 21
    assert (span1, wait1) == (19.0, 0.0)            # last arrival 40 - first release 21
    assert math.isclose(mean0, (10 + 12 + 19) / 3) and math.isclose(mean1, (9 + 9 + 17) / 3)
    assert span0 + wait0 + span1 == 40.0            # = the last block's end


def test_events_are_read_for_the_critical_block_and_averaged_over_blocks_that_have_them():
    events = torch.zeros(2, stamps_mod.N_EVENTS, 4, dtype=torch.int64)
    events[1, 0, :3] = torch.tensor([25, 26, 27]) * US      # phase 1, "staged", every block
    events[1, 3, 2] = 38 * US                               # phase 1, "done", only block 2
    row = stamps_mod.step_events(two_phase_stamps(), events, blocks=3, phases=2, which=range(4))[1]
    staged, first, computed, done, released, c_staged, c_first, c_computed, c_done, arrived = row
    assert math.isclose(staged, (4 + 4 + 4) / 3) and math.isnan(first) and math.isnan(computed)
    assert done == 15.0                                     # only block 2 stamped it: 38 - 23
    assert released == 2.0 and c_staged == 4.0 and c_done == 15.0 and arrived == 17.0   # block 2 is last
    assert math.isnan(c_first)
    assert stamps_mod.nan_median([float("nan"), 3.0, 1.0]) == 2.0


def test_chunk_events_come_after_the_phase_events_in_the_kernel_layout():
    events = torch.zeros(2, stamps_mod.N_EVENTS, 4, dtype=torch.int64)
    landed_c1 = len(stamps_mod.EVENTS) + len(stamps_mod.CHUNK_EVENTS)   # chunk 1, "landed"
    events[1, landed_c1, :3] = torch.tensor([24, 25, 30]) * US
    row = stamps_mod.step_events(two_phase_stamps(), events, blocks=3, phases=2,
                                 which=range(stamps_mod.N_EVENTS))[1]
    assert stamps_mod.N_EVENTS == 4 + 3 * 6
    assert math.isclose(row[landed_c1], (3 + 3 + 7) / 3)
    assert row[stamps_mod.N_EVENTS + 1 + landed_c1] == 7.0   # the critical block (2): 30 - 23
