"""The stall table's CSV reading and line-to-function mapping (scripts/kimi_stall_table.py), on a small profile."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

PATH = Path(__file__).resolve().parent.parent / "scripts" / "kimi_stall_table.py"
_spec = importlib.util.spec_from_file_location("kimi_stall_table", PATH)
stall_table = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = stall_table   # dataclasses look their module up by name
_spec.loader.exec_module(stall_table)

SOURCE = """#include <cuda_fp16.h>
// __device__ void not_a_definition(int) in a comment
__device__ __forceinline__ float helper(float x) {
  return x * 2.0f;
}

__device__ void declared_only(int n);
extern "C" __global__ void __launch_bounds__(256, 2)
kernel_entry(float* out) {
  out[0] = helper(1.0f);
}
"""

HEADER = ('"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)","stall_no_inst",'
          '"stall_long_sb","stall_barrier","stall_wait","stall_selected","Instructions Executed"')


def _profile(tmp_path: Path) -> Path:
    rows = [
        '"File Path","/usr/include/cuda_fp16.h"', '"Function Name","kernel_entry"', HEADER,
        '"100","<Unable to open source file>","-","-","1","0","0","0","0","1","8"',
        '"","","0x10","HADD2 R0, R1, R2","1","0","0","0","0","1","8"',
        '"File Path","/tmp/x/abc.cubin.cu"', '"Function Name","kernel_entry"', HEADER,
        '"4","<Unable to open source file>","-","-","9","7","0","0","0","2","16"',
        '"","","0x20","FMUL R0, R0, 2","9","7","0","0","0","2","16"',
        '"","","...","...","-","-","-","-","-","-","-"',
        '"10","<Unable to open source file>","-","-","5","1","0","3","0","1","8"',
        '"","","0x30","STG.E [R2], R0","5","1","0","3","0","1","8"',
        '"","","0x20","FMUL R0, R0, 2","9","7","0","0","0","2","16"',
    ]
    path = tmp_path / "stalls.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_function_starts_skip_comments_and_declarations_and_find_names_after_launch_bounds():
    assert stall_table.function_starts(SOURCE) == [(3, "helper"), (8, "kernel_entry")]


def test_rows_count_each_address_once_and_map_to_functions_or_headers(tmp_path):
    rows = stall_table.read_rows(_profile(tmp_path))
    assert [r.address for r in rows] == ["0x10", "0x20", "0x30"]
    per, by_runs = stall_table.tabulate(rows, SOURCE, warps=8)
    assert per["helper:3"]["no_inst"] == 7 and per["helper:3"]["instructions"] == 1
    assert per["kernel_entry:8"]["barrier"] == 3
    assert per["cuda_fp16.h"]["samples"] == 1
    assert by_runs["<= 4"]["no_inst"] == 7 and by_runs["<= 1"] == {"instructions": 2, "no_inst": 1}


def test_runs_buckets():
    assert [stall_table.runs_bucket(r) for r in (0, 0.5, 3, 10, 100)] == ["never", "<= 1", "<= 4", "<= 16", "> 16"]


def test_a_gzipped_profile_reads_the_same(tmp_path):
    plain = _profile(tmp_path)
    packed = tmp_path / "stalls.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert stall_table.read_rows(packed) == stall_table.read_rows(plain)
