"""The KDA layers' two grid barriers replaced by flags, in the schedule model (issue 28, step 3's other half;
twenty-third session, BENCHMARKS.md reads the output). Plans the seed does not have, edited here around the
model's own plan:
  A  the delta rule as a simulated phase of its own: the calibration against its stamped span (3.1 µs);
  B  the delta units in the projection's phase, each starting when its head's q, k, v, g tiles have arrived;
  C  B, and the output projection's units in the same phase, each starting when the delta rule of the heads its
     K slice reads is done (their first chunks are then issued when a block reaches them, not at a barrier).
A delta unit is modelled as a unit with no weights: its S load is the empty chunk's latency, then one publish.
Run from the repository root: python traces/examples/kimi-cluster-probe/kda_flags_model.py
"""
from seed_model_setup import cfg, knobs, simulate, wp

SLICES = cfg.kda_head_dim // 16   # the seed's delta units: (head, 16-column slice)


def delta_table(layer: int, rounds: int) -> wp.JobTable:
    """The delta rule's (head, 16-column slice) units; each needs its head's q, k, v, g tiles, then `rounds` L2
    round trips besides its S load."""
    heads_per_tile = wp.TILE // cfg.kda_head_dim
    units = []
    for h in range(cfg.kda_heads):
        needs = tuple((f"L{layer} {m}", 0, h // heads_per_tile) for m in "qkvg")
        units += [wp.Unit(chunks=(wp.Chunk(0, 0),), finish=wp.Finish.PARTIAL, tile=(f"L{layer} delta", 0, h),
                          parts=SLICES, needs=needs, need_rounds=rounds) for _ in range(SLICES)]
    return wp.JobTable(units=tuple(units), staging=None)


def out_proj_on_flags(table: wp.JobTable) -> wp.JobTable:
    """The output projection's units, each waiting for the delta rule of the heads its K slice reads."""
    slabs = cfg.kda_dim // 2 // wp.SLAB_ROWS
    ks = knobs["KSPLIT_O"]
    units = []
    for i, u in enumerate(table.units):   # unit = tile * ksplit + split
        layer, split = u.tile[0].split()[0], i % ks
        k0, k1 = split * slabs // ks * 2 * wp.SLAB_ROWS, (split + 1) * slabs // ks * 2 * wp.SLAB_ROWS
        heads = range(k0 // cfg.kda_head_dim, (k1 - 1) // cfg.kda_head_dim + 1)
        units.append(wp.Unit(chunks=u.chunks, finish=u.finish, tile=u.tile, parts=u.parts, sum_rounds=u.sum_rounds,
                             needs=tuple((f"{layer} delta", 0, h) for h in heads), need_rounds=0, job=u.job))
    return wp.JobTable(units=tuple(units), staging=None)


def plan(merged: bool, rounds: int, o_proj_too: bool = False) -> list[wp.Phase]:
    """The seed's plan with the delta rule simulated (A), merged into the projection's phase (B), and the output
    projection merged too (C)."""
    out = []
    for ph in wp.step_plan(cfg, knobs):
        layer = int(ph.name.split()[0][1:])
        if ph.name.endswith("kda project"):
            out.append(wp.Phase(name=ph.name, tables=ph.tables + ((delta_table(layer, rounds),) if merged else ())))
        elif ph.name.endswith("kda delta"):
            if not merged:
                out.append(wp.Phase(name=ph.name, tables=(delta_table(layer, rounds),)))
        elif ph.name.endswith("kda o_proj") and o_proj_too:
            last = out.pop()
            out.append(wp.Phase(name=last.name, tables=last.tables + (out_proj_on_flags(ph.tables[0]),)))
        else:
            out.append(ph)
    return out


def run(p: list[wp.Phase], label: str) -> None:
    """Print the modelled kernel µs and layer 1's KDA phases (span / mean block), averaged over release draws."""
    est = simulate(p)
    rows = "  ".join(f"{e.name} {e.span_us:.1f}/{e.mean_us:.1f}" for e in est.phases
                     if "kda" in e.name and "L1" in e.name)
    print(f"{label:44} kernel {est.kernel_us:6.1f}  {rows}")


run(wp.step_plan(cfg, knobs), "seed plan (delta stamped: 3.1 span, 2.5 mean)")
for r in (0, 1):
    run(plan(False, r), f"A: delta simulated, {r} extra rounds")
    run(plan(True, r), f"B: delta on flags in the projection phase, {r}")
    run(plan(True, r, True), f"C: B, and the output projection on flags, {r}")
