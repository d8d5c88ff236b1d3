"""The schedule model on MoE plans the seed does not have (twenty-third session; BENCHMARKS.md reads the output).

Variants: the routed gate/up with KSPLIT_GU 8 in 9-slab chunks (a unit is one chunk per matrix), and the shared
expert's gate/up moved into the router phase (its blocks 0-35 prefetch it at the output projection's barrier;
a router phase then lasts the longer of the simulated shared units and its stamped span). The plan edits are
made here, around the model's own plan, so the model itself stays the seed's.
Run from the repository root: python traces/examples/kimi-cluster-probe/moe_variant_model.py
"""
import dataclasses

from seed_model_setup import cfg, fixed, knobs, simulate, wp

warps = knobs["THREADS"] // 32


def variant_plan(gu_split: int, gu_chunk: int, shared_out: bool) -> list[wp.Phase]:
    """The seed's plan with routed gate/up units of `gu_split` K slices in `gu_chunk`-slab chunks, and the shared
    expert's gate/up in the router phase if `shared_out`."""
    plan = wp.step_plan(cfg, knobs)
    out = []
    for ph in plan:
        layer = int(ph.name.split()[0][1:])
        if "router" in ph.name and shared_out:
            d, f = cfg.hidden, cfg.moe_inter
            slot = cfg.n_active
            ks = knobs["KSPLIT_SHARED"]
            units = [wp.Unit(chunks=wp.unit_chunks(d, split, ks, cfg.group, warps, paired=True),
                             finish=wp.Finish.PARTIAL, tile=(f"L{layer} gu", slot, tile), parts=ks, job=0)
                     for tile in range(wp.tiles_of(f)) for split in range(ks)]
            blocks = frozenset(range(len(units)))
            out.append(wp.Phase(name=ph.name, tables=(wp.JobTable(units=tuple(units), staging=wp.Staging.RMSNORM,
                                                                  prefetches=(wp.Prefetch(blocks, 1),)),)))
        elif "g/u+down" in ph.name:
            gate_up, down = ph.tables
            d, f = cfg.hidden, cfg.moe_inter
            slots = list(range(cfg.n_active)) if shared_out else [cfg.n_active] + list(range(cfg.n_active))
            gu = []
            for job, slot in enumerate(slots):
                ks = gu_split if slot < cfg.n_active else knobs["KSPLIT_SHARED"]
                chunk = gu_chunk if slot < cfg.n_active else warps
                gu += [wp.Unit(chunks=wp.unit_chunks(d, split, ks, cfg.group, chunk, paired=True),
                               finish=wp.Finish.PARTIAL, tile=(f"L{layer} gu", slot, tile), parts=ks, job=job)
                       for tile in range(wp.tiles_of(f)) for split in range(ks)]
            pre = () if shared_out else gate_up.prefetches
            out.append(wp.Phase(name=ph.name, tables=(wp.JobTable(units=tuple(gu), staging=wp.Staging.ROUTE,
                                                                  prefetches=pre), down)))
        else:
            out.append(ph)
    return out


def run(plan: list[wp.Phase], label: str) -> None:
    """Print the modelled kernel µs and the router and MoE spans of `plan`, averaged over the release draws."""
    est = simulate(plan)
    total = 0.0
    rows = []
    for e in est.phases:
        span = e.span_us
        if "router" in e.name and e.simulated:
            span = max(span, fixed[e.name])
        total += span + e.wait_us
        if "router" in e.name or "g/u" in e.name:
            rows.append(f"{e.name} {span:.1f}")
    print(f"{label:55} kernel {total:6.1f}  " + "  ".join(rows))


run(wp.step_plan(cfg, knobs), "seed plan")
run(variant_plan(9, warps, False), "variant: seed's gate/up rebuilt (check)")
run(variant_plan(8, warps, False), "KSPLIT_GU 8, 8-slab chunks (the measured knob)")
run(variant_plan(8, 9, False), "KSPLIT_GU 8, 9-slab chunks, shared in the MoE phase")
run(variant_plan(9, warps, True), "KSPLIT_GU 9, shared expert in the router phase")
run(variant_plan(8, 9, True), "KSPLIT_GU 8, 9-slab chunks, shared in the router phase")


def slow_ninth(plan: list[wp.Phase]) -> list[wp.Phase]:
    """The 9-slab gate/up steps charged ~2.3 µs (the 9th slab on one warp after its first: a full step plus one
    slab's latency), emulated as 12 slabs of issue work; bytes unchanged."""
    out = []
    for ph in plan:
        if "g/u+down" not in ph.name:
            out.append(ph)
            continue
        gu, down = ph.tables
        units = tuple(dataclasses.replace(u, chunks=tuple(wp.Chunk(c.bytes, 12 if c.slabs == 9 else c.slabs)
                                                          for c in u.chunks)) for u in gu.units)
        out.append(wp.Phase(name=ph.name, tables=(dataclasses.replace(gu, units=units), down)))
    return out


run(slow_ninth(variant_plan(8, 9, False)), "KSPLIT_GU 8, 9-slab chunks at ~2.3 µs a step")
