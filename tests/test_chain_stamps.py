"""The chained timeline's reading of stamp rows (scripts/kimi_chain_stamps.py), on synthetic stamps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from megakernel_agent.sandbox.phases import PhaseStampError

PATH = Path(__file__).resolve().parent.parent / "scripts" / "kimi_chain_stamps.py"
_spec = importlib.util.spec_from_file_location("kimi_chain_stamps", PATH)
chain_stamps = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = chain_stamps   # dataclasses look their module up by name
_spec.loader.exec_module(chain_stamps)

# one step of two phases on four blocks, ns from the step's base: start, barrier arrival, release, end
STEP = [[0, 100, 200, 300], [5000, 5200, 5100, 6000], [7000, 7100, 7000, 7050], [20000, 21000, 19000, 20500]]


def rows(steps: int, period_ns: int = 100_000) -> torch.Tensor:
    base = 1_700_000_000_000_000_000   # %globaltimer counts ns since the epoch
    return torch.tensor([[[base + s * period_ns + v for v in row] for row in STEP] for s in range(steps)],
                        dtype=torch.int64)


def test_kernels_boundaries_and_phases_of_a_chain():
    chain = chain_stamps.chained_timeline(rows(3), 2048, ["first", "second"], [1000, 2000])
    assert chain.kernels_us == pytest.approx([21.0, 21.0, 21.0])
    assert chain.boundaries_us == pytest.approx([79.0, 79.0])   # the next step's first start - this one's last end
    first, second = chain.timeline.rows
    assert (first.span_us, first.wait_us, second.span_us) == pytest.approx((6.0, 1.0, 14.0))
    assert first.mean_us == pytest.approx((5000 + 5100 + 4900 + 5700) / 4 / 1000)
    assert chain.timeline.kernel_us == pytest.approx(21.0)   # spans and waits add up to the stamped kernel
    assert chain.timeline.steps == 3


def test_rows_that_do_not_fit_the_phases_are_refused():
    with pytest.raises(ValueError, match="2 rows a phase"):
        chain_stamps.chained_timeline(rows(3), 2048, ["only"], [1000])
    with pytest.raises(ValueError, match="2\\+ steps"):
        chain_stamps.chained_timeline(rows(1), 2048, ["first", "second"], [1000, 2000])


def test_a_block_that_did_not_stamp_is_refused():
    r = rows(2)
    r[1, 0, 2] = 0   # block 2 of the second step has no start stamp
    with pytest.raises(PhaseStampError, match="no start stamp"):
        chain_stamps.chained_timeline(r, 2048, ["first", "second"], [1000, 2000])


def test_rows_a_block_left_from_the_step_before_are_refused():
    r = rows(3)
    r[2, :, 1] = r[1, :, 1]   # block 1 did not stamp the third step: its rows are still the second's
    with pytest.raises(PhaseStampError, match="stale"):
        chain_stamps.chained_timeline(r, 2048, ["first", "second"], [1000, 2000])


def test_build_table_sets_each_build_against_the_first_kernels_same_build_round_by_round():
    times = {"seed": {"stamped": [200.0, 190.0, 195.0], "plain": [192.0, 194.0, 193.0]},
             "patch": {"stamped": [198.0, 188.0, 193.5], "plain": [192.5, 194.0, 193.0]}}
    table = chain_stamps.build_table(times)
    cells = [list(col.cells) for col in table.columns]
    rows_ = list(zip(*cells, strict=True))
    assert rows_[0][:3] == ("seed", "stamped", "195.0") and rows_[0][4] == ""
    assert rows_[2][:2] == ("patch", "stamped") and rows_[2][4] == "-2.00"   # rounds: -2, -2, -1.5
    assert rows_[3][:2] == ("patch", "plain") and rows_[3][4] == "+0.00"     # rounds: +0.5, 0, 0
    assert rows_[3][3] == "192.5-194.0"
