#!/usr/bin/env bash
# One device call: diagnostics, GPU tests and benchmarks, as many steps as asked. Logs go to $OUT.
# Usage (device tool, repo root): bash scripts/gpu_suite.sh STEP...   steps: diag tests sandbox cheats checks kimi agent bench upstream calib session session_bg session_wait scripted reexec compare stamps phases host probe tcprobe chunkprobe tctile coldcode rolled tiediag stepwarm splitpairs stacked unitcost unitcall coldfetch stalls ringahead codedose routerpf mmarate cluster pdl attnkept qbulk smallloads session36 acccount guacc downsplit pollahead routerrows routerflags awaitearly awaitchecks foldsplit session39 session40 mmaloop outissue outearly attnlo outl2 mergeacc mlabare chainstamps stampcost stampafter modulebias stampfresh kdapairs kdapairschecks kdablocks awaitpoll defersecond smembase apartctx ringshift routeearly routeearlychecks attnread timeline moechain throughput recovery modelcheck validate
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"

render() {  # pretty-print an EvalResult JSON file
  python3 - "$1" <<'PY'
import sys
sys.path.insert(0, ".")
from rich.console import Console
from megakernel_agent.sandbox.report import print_eval
from megakernel_agent.traces.results import EvalResult
print_eval(EvalResult.model_validate_json(open(sys.argv[1]).read()), Console(width=170))
PY
}

patched() {  # patched PATCH NAME [-R]: a copy of the seed (or of $PATCH_BASE) with PATCH applied (or reverted), as NAME.cu in a
             # new temp folder; prints its path
  local t; t=$(mktemp -d)
  mkdir -p "$t/kernels/kimi_linear" && cp "${PATCH_BASE:-kernels/kimi_linear/seed.cu}" "$t/kernels/kimi_linear/seed.cu" &&
    (cd "$t" && git apply ${3:-} "$OLDPWD/$1") && cp "$t/kernels/kimi_linear/seed.cu" "$t/$2.cu" && echo "$t/$2.cu"
}

set_knobs() {  # set_knobs FILE KNOB=VALUE[,KNOB=VALUE...]: rewrite the @knob defaults of a kernel source in place
  local kv
  for kv in ${2//,/ }; do sed -i -E "s|^// @knob ${kv%%=*} [0-9]+ |// @knob ${kv%%=*} ${kv#*=} |" "$1"; done
}

knob_experiment() {  # knob_experiment PATCH NAME VARIANT...: the seed before PATCH against the patched seed at each
                     # VARIANT (KNOB=VALUE[,KNOB=VALUE...], the patch's knobs), interleaved `compare` at 2K and 16K, then
                     # the barrier stamps at 2K (PHASES_CTX: another context) of the seed before and of the last
                     # variant (NO_PHASES=1: none; ALL_PHASES=1: of every version), and with
                     # KIMI_TESTS=1 tests/test_gpu_kimi.py on the patched seed. The first variant's first knob tells
                     # whether PATCH has landed in the seed (then the patch reversed gives the seed before). With
                     # PATCH_BASE (a kernel file), that file is the seed before and the one patched.
  local pw=$1 name=$2 v b n spec; shift 2
  local knob=${1%%=*}
  v=$(mktemp -d)
  if grep -q "@knob $knob " kernels/kimi_linear/seed.cu; then
    b=$(patched "$pw" before -R) && n=kernels/kimi_linear/seed.cu || { echo "patch failed"; return 1; }
  else
    b=${PATCH_BASE:-kernels/kimi_linear/seed.cu} && n=$(patched "$pw" after) || { echo "patch failed"; return 1; }
  fi
  cp "$b" "$v/before.cu"
  local vs=("$v/before.cu")
  for spec in "$@"; do
    cp "$n" "$v/$spec.cu"
    set_knobs "$v/$spec.cu" "$spec"
    vs+=("$v/$spec.cu")
  done
  COLUMNS=200 timeout "${COMPARE_S:-400}" python3 run_agent.py compare "${vs[@]}" --ctx 2048 --ctx 16384 --rounds "${ROUNDS:-4}" \
    2>&1 | tee "$OUT/${name}_compare.log" | tail -40
  if [ -n "${KIMI_TESTS:-}" ]; then   # the Kimi GPU tests with the patched seed (its default knobs) as the seed
    local landed=1; grep -q "@knob $knob " kernels/kimi_linear/seed.cu || { landed=; git apply "$pw"; }
    timeout 600 python3 -m pytest -m gpu -q -rs tests/test_gpu_kimi.py 2>&1 | tee "$OUT/${name}_kimi_tests.log" | tail -6
    [ -n "$landed" ] || git apply -R "$pw"
  fi
  [ -n "${NO_PHASES:-}" ] && return 0
  local stamped=("${vs[0]}" "${vs[-1]}")
  [ -n "${ALL_PHASES:-}" ] && stamped=("${vs[@]}")
  for k in "${stamped[@]}"; do
    local tag; tag=$(basename "$k" .cu); tag=${tag//[=,]/-}   # the device tool brings back no name with = or ,
    timeout 150 python3 run_agent.py bench "$k" --ctx "${PHASES_CTX:-2048}" --phases 2>&1 | tee "$OUT/${name}_phases_$tag.log" |
      grep -E "timeline|L0 kda project|o_proj|attention|merge|g/u|total"
  done
}

knob_moe_blocks() {  # knob_moe_blocks PATCH NAME KNOB VALUE...: the patched seed at each VALUE of KNOB, one step's
                    # per-block stamps at 2K (events build) and L1's MoE blocks by group (BLOCK_ARGS: more options of
                    # kimi_block_stamps.py)
  local pw=$1 name=$2 knob=$3 v k; shift 3
  for v in "$@"; do
    k=$(patched "$pw" "seed-$name-$v") || { echo "patch failed"; continue; }
    set_knobs "$k" "$knob=$v"
    timeout 120 python3 scripts/kimi_phase_stamps.py "$k" --ctx 2048 --raw "$OUT/stamps-$name-$v" \
      > "$OUT/stamps-$name-$v-2048.log" 2>&1
    grep -E "g/u|kernel" "$OUT/stamps-$name-$v-2048.log" | head -6
    python3 scripts/kimi_block_stamps.py "$OUT/stamps-$name-$v/stamps_2048.npz" "L1 g/u+down" \
      --groups 0,36,39,60,132,192 --latest 8 ${BLOCK_ARGS:-} 2>&1 | tee "$OUT/$name-$v-blocks.txt" | tail -7
  done
}

seed_checks() {  # seed_checks NAME [PATCH]: the kernel's GPU tests (Kimi, phases, cheats; CHECK_TESTS: others, e.g.
                 # `tests` for the whole suite) and upstream check.py, on the seed or with PATCH applied (then reverted)
  local name=$1 pw=${2:-}
  if [ -n "$pw" ]; then git apply "$pw" || { echo "patch failed"; return 1; }; fi
  timeout 600 python3 -m pytest -m gpu -q -rs ${CHECK_TESTS:-tests/test_gpu_kimi.py tests/test_gpu_phases.py \
    tests/test_gpu_cheats.py} 2>&1 | tee "$OUT/${name}_gpu_tests.log" | tail -4
  bash "$0" upstream 2>&1 | tail -3
  if [ -n "$pw" ]; then git apply -R "$pw"; fi
}

for step in "$@"; do
  echo "=== $step ==="
  case $step in
    diag)
      timeout 300 python3 scripts/kimi_diag.py small 2>&1 | tee "$OUT/diag_small.log"
      timeout 300 python3 scripts/kimi_diag.py full 2>&1 | tee "$OUT/diag_full.log" ;;
    tests) timeout 1200 python3 -m pytest -m gpu -q -rs --durations=15 tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    sandbox) timeout 900 python3 -m pytest -m gpu -q -rs --durations=15 tests/test_gpu_sandbox.py tests/test_gpu_phases.py 2>&1 | tee "$OUT/gpu_sandbox.log" | tail -40 ;;
    cheats) timeout 900 python3 -m pytest -m gpu -q -rs --durations=15 tests/test_gpu_cheats.py 2>&1 | tee "$OUT/gpu_cheats.log" | tail -40 ;;
    checks)  # the correctness-only work, concurrently (no timings are taken here): Kimi GPU tests + upstream check.py
      bash "$0" kimi > "$OUT/kimi_tests.out" 2>&1 &
      bash "$0" upstream > "$OUT/upstream.out" 2>&1
      wait; tail -25 "$OUT/kimi_tests.out"; tail -12 "$OUT/upstream.out" ;;
    kimi) timeout 900 python3 -m pytest -m gpu -q -rs --durations=15 tests/test_gpu_kimi.py 2>&1 | tee "$OUT/gpu_kimi.log" | tail -40 ;;
    bench)
      for t in ${BENCH_TASKS:-w4a16_gemv kimi_linear}; do
        timeout 500 python3 run_agent.py bench --task "$t" --json > "$OUT/bench_$t.json" 2> "$OUT/bench_$t.err"
        render "$OUT/bench_$t.json"
      done ;;
    upstream)  # upstream's own check.py on an exported solution (upstream/ is fetched, ignored, never committed;
               # its reference.py is our stand-in, scripts/upstream_reference.py, unless upstream's own is there)
      [ -f upstream/reference.py ] || cp scripts/upstream_reference.py upstream/reference.py
      python3 run_agent.py export kernels/kimi_linear/seed.cu -o upstream/solution.py
      (cd upstream && timeout 600 python3 check.py 2>&1 | tee "$OUT/upstream_check.log") ;;
    session)  # a real tuner session on the full Kimi task; its trace and HTML report come back under $OUT/session
      d=runs/example-session; rm -rf "$d"
      timeout 540 python3 run_agent.py run --planner tuner --budget "${SESSION_BUDGET:-6m}" --out "$d" \
        ${SESSION_KERNEL:+--kernel "$SESSION_KERNEL"} 2>&1 | tail -30
      mkdir -p "$OUT/session"; cp "$d"/trace.jsonl "$d"/report.html "$OUT/session/" ;;
    session_bg)  # the same session, detached (setsid) so that it outlives this call; `session_wait` collects it
      rm -rf /tmp/mk-session; mkdir -p /tmp/mk-session
      setsid nohup python3 run_agent.py run --planner tuner --budget "${SESSION_BUDGET:-10m}" --out /tmp/mk-session/out \
        ${SESSION_KERNEL:+--kernel "$SESSION_KERNEL"} > /tmp/mk-session/log 2>&1 < /dev/null &
      echo "session started (pid $!)" ;;
    session_wait)
      while pgrep -f "run_agent.py run" > /dev/null; do sleep 5; done
      tail -40 /tmp/mk-session/log
      mkdir -p "$OUT/session"; cp /tmp/mk-session/log "$OUT/session/session.log"
      cp /tmp/mk-session/out/trace.jsonl /tmp/mk-session/out/best.cu "$OUT/session/" ;;
    scripted)  # the LLM planner driven by the scripted model that replays the seed's git history (traces/examples)
      d=runs/scripted-history; rm -rf "$d"; x=traces/examples/kimi-scripted-history
      timeout 580 python3 run_agent.py run --kernel "$x/start.cu" --scripted-model "$x/script.jsonl" --max-cost 50 \
        --budget "${SESSION_BUDGET:-7m}" --timeouts build=120,check=60,time=120 --out "$d" 2>&1 | tail -30
      mkdir -p "$OUT/scripted"; cp "$d"/trace.jsonl "$d"/report.md "$d"/report-*.png "$OUT/scripted/" 2>/dev/null ;;
    reexec) timeout 300 python3 run_agent.py replay runs/example-session/trace.jsonl --reexecute --kept-only 2>&1 | tail -30 ;;
    compare) timeout 300 python3 run_agent.py compare kernels/w4a16_gemv/seed.cu \
        kernels/w4a16_gemv/seed.cu:KSPLIT=32,THREADS=128 --task w4a16_gemv --rounds 3 --diff 2>&1 | tail -30 ;;
    agent) timeout 600 python3 -m pytest -m gpu -q -rs --durations=10 tests/test_gpu_agent.py 2>&1 | tee "$OUT/gpu_agent.log" | tail -30 ;;
    stamps) timeout 300 python3 scripts/kimi_phase_stamps.py ${STAMPS_KERNEL:-} 2>&1 | tee "$OUT/stamps.log" ;;
    phases) timeout 300 python3 scripts/kimi_phase_profile.py 2>&1 | tee "$OUT/phases.log" ;;
    host) timeout 300 python3 scripts/kimi_host_cost.py --apis 2>&1 | tee "$OUT/host.log" ;;
    probe) timeout 120 python3 scripts/stream_probe.py 2>&1 | tee "$OUT/probe.log" ;;
    alignprobe) timeout 120 python3 scripts/bulk_align_probe.py 2>&1 | tee "$OUT/bulk_align_probe.log" ;;   # 51st session
    tcprobe) timeout 120 python3 scripts/tc_gemv_probe.py 2>&1 | tee "$OUT/tc_probe.log" ;;   # issue 28, step 1
    chunkprobe)  # one ring chunk step of the seed's GEMV, and of the seed with its fp16 loop (the model's figures)
      k=$(patched traces/examples/kimi-dp2a/seed-fp16-loop.patch seed-fp16-loop) || { echo "patch failed"; continue; }
      for f in kernels/kimi_linear/seed.cu "$k"; do
        timeout 120 python3 scripts/chunk_probe.py "$f" 2>&1 | tee -a "$OUT/chunk_probe.log"
      done ;;
    tctile)  # issue 28, step 1 in the seed: the inner loop on tensor cores over the ring's own layout
      timeout 120 python3 scripts/tc_gemv_probe.py 2>&1 | tee "$OUT/tc_probe.log"
      k=$(patched traces/examples/kimi-tc-tile/seed-tc-tile.patch seed-tc-tile) || { echo "patch failed"; continue; }
      timeout 400 python3 run_agent.py compare kernels/kimi_linear/seed.cu "$k" --ctx 2048 --ctx 16384 --rounds 4 \
        2>&1 | tee "$OUT/tctile_compare.log" | tail -25
      timeout 200 python3 run_agent.py bench "$k" --ctx 2048 --phases 2>&1 | tee "$OUT/tctile_phases.log" | tail -40
      git apply traces/examples/kimi-tc-tile/seed-tc-tile.patch &&   # the device's copy of the tree: the patch as the seed
        { timeout 600 python3 -m pytest -m gpu -q -rs tests/test_gpu_kimi.py 2>&1 | tee "$OUT/tctile_kimi.log" | tail -8
          git apply -R traces/examples/kimi-tc-tile/seed-tc-tile.patch; } ;;
    attnkept)  # what the thirty-fifth session keeps (q's fragment layout, partials staged, the merge's early loads):
               # the seed before it (seed-change.patch reversed), the seed without the merge's early loads
               # (merge-early.patch reversed) and the seed, interleaved at 2K / 8K / 16K
      x=traces/examples/kimi-attn-out
      b=$(patched $x/seed-change.patch before -R) && e=$(patched $x/merge-early.patch no-early -R) ||
        { echo "patch failed"; continue; }
      COLUMNS=200 timeout 260 python3 run_agent.py compare "$b" "$e" kernels/kimi_linear/seed.cu \
        --ctx 2048 --ctx 8192 --ctx 16384 --rounds 4 2>&1 | tee "$OUT/attnkept_compare.log" | tail -14 ;;
    qbulk)  # q's fragments by three bulk copies into shared memory (q-bulk.patch, ATT_Q_BULK; prepared in the thirty-fifth
            # session): the seed against the patched seed, interleaved at 2K and 16K, the Kimi GPU tests on it, its stamps
      KIMI_TESTS=1 NO_PHASES=1 knob_experiment traces/examples/kimi-q-bulk/q-bulk.patch qbulk ATT_Q_BULK=1
      k=$(patched traces/examples/kimi-q-bulk/q-bulk.patch seed-q-bulk) || { echo "patch failed"; continue; }
      timeout 150 python3 scripts/kimi_phase_stamps.py "$k" --ctx 2048 16384 2>&1 | tee "$OUT/qbulk_stamps.log" |
        grep -E "kernel|L3 attention" ;;
    smallloads)  # fewer, wider requests at three sites (small-loads.patch, SMALL_LOADS; thirty-sixth session): the seed
                 # against the patched seed, interleaved at 2K and 16K, the Kimi GPU tests on it, both phase timelines
      KIMI_TESTS=1 knob_experiment traces/examples/kimi-small-loads/small-loads.patch smallloads SMALL_LOADS=1 ;;
    session36)  # the thirty-sixth session's versions in one interleaved run: the seed before the relaxed gate/up
                # publication (a9d32af), the seed (cf030ab) and the seed with defer-finish.patch (DEFER_FINISH 1)
      v=$(mktemp -d)
      s=$(patched traces/examples/kimi-acc-count/acc-count.patch cf030ab -R) &&   # the seed of cf030ab
        b=$(PATCH_BASE=$s patched traces/examples/kimi-relaxed-publish/seed-change.patch a9d32af -R) &&
        d=$(PATCH_BASE=$s patched traces/examples/kimi-defer-finish/defer-finish.patch defer) || { echo "patch failed"; continue; }
      cp "$b" "$v/a9d32af.cu" && cp "$s" "$v/cf030ab.cu" && cp "$d" "$v/defer.cu"
      COLUMNS=200 timeout 240 python3 run_agent.py compare "$v/a9d32af.cu" "$v/cf030ab.cu" "$v/defer.cu" \
        --ctx 2048 --ctx 16384 --rounds "${ROUNDS:-3}" 2>&1 | tee "$OUT/session36_compare.log" | tail -12 ;;
    acccount)  # tile finishes by a count in each accumulator word (acc-count.patch, ACC_COUNT; prepared in the
               # thirty-sixth session): the seed, the patch at 0 (control) and at 1, interleaved at 2K and 16K, the Kimi
               # GPU tests on it, the phase timelines of the seed and of ACC_COUNT 1
      KIMI_TESTS=1 knob_experiment traces/examples/kimi-acc-count/acc-count.patch acccount ACC_COUNT=0 ACC_COUNT=1 ;;
    guacc)  # gate/up partials as counted accumulator words (gu-acc.patch, GU_ACC; measured in the thirty-seventh session
            # with ACC_COUNT as one patch, at 11e4351 `guaccfull`): the seed, GU_ACC 0 (control), 2 and 1
      knob_experiment traces/examples/kimi-gu-acc/gu-acc.patch guacc GU_ACC=0 GU_ACC=2 GU_ACC=1 ;;
    downsplit)  # the down projections' K split after the counted finish (the schedule model, 37th session: KSPLIT_DOWN
                # 3 -> 4 -2.7 kernel us, 3 -> 2 -1.3): the seed and both moves, interleaved at 2K and 16K
      v=$(mktemp -d); for k in 3 2 4; do cp kernels/kimi_linear/seed.cu "$v/down$k.cu"; set_knobs "$v/down$k.cu" KSPLIT_DOWN=$k; done
      COLUMNS=200 timeout 300 python3 run_agent.py compare "$v/down3.cu" "$v/down2.cu" "$v/down4.cu" --ctx 2048 --ctx 16384 \
        --rounds "${ROUNDS:-3}" 2>&1 | tee "$OUT/downsplit_compare.log" | tail -12 ;;
    pollahead)  # down units start loading their gate/up partials before the last K slice's arrival (poll-ahead.patch,
                # POLL_AHEAD; prepared in the thirty-seventh session): the seed, the patch at 0 (control), 1 and 9
      knob_experiment traces/examples/kimi-poll-ahead/poll-ahead.patch pollahead POLL_AHEAD=0 POLL_AHEAD=1 POLL_AHEAD=9 ;;
    awaitearly)  # a down unit awaits and stages its input while its first chunk is in flight (await-early.patch,
                 # AWAIT_EARLY; 40th session): the seed, the patch at 0 (control) and 1, interleaved at 2K and 16K;
                 # the patched seed's per-block stamps at 2K (events build) and L1's MoE blocks
      x=traces/examples/kimi-await-early/await-early.patch
      NO_PHASES=1 knob_experiment $x awaitearly AWAIT_EARLY=0 AWAIT_EARLY=1
      k=$(patched $x seed-await-early) || { echo "patch failed"; continue; }
      timeout 120 python3 scripts/kimi_phase_stamps.py "$k" --ctx 2048 --raw "$OUT/stamps" > "$OUT/stamps-await-early-2048.log" 2>&1
      grep -E "g/u|kernel" "$OUT/stamps-await-early-2048.log" | head -6
      python3 scripts/kimi_block_stamps.py "$OUT/stamps/stamps_2048.npz" "L1 g/u+down" --groups 0,36,39,60 --latest 8 2>&1 |
        tee "$OUT/awaitearly-blocks.txt" | tail -14 ;;
    outissue)  # the output projection's input and first chunks (out-issue.patch, O_SLICE and OUT_ISSUE; 43rd session):
               # the seed, the patch at 0/0 (control), the staged K slice alone, and with the chunks issued one
               # barrier earlier or at the phase's start, interleaved at 2K and 16K; every version's timeline at 2K.
               # The patch is against 9c76858's seed (PATCH_BASE=that file); the seed has since taken O_SLICE 1
      ALL_PHASES=1 knob_experiment traces/examples/kimi-out-issue/out-issue.patch outissue O_SLICE=0,OUT_ISSUE=0 \
        O_SLICE=1,OUT_ISSUE=0 O_SLICE=1,OUT_ISSUE=1 O_SLICE=1,OUT_ISSUE=2 ;;
    outearly)  # the output projections' first chunks issued before their barrier (out-early.patch, OUT_KDA and
               # OUT_MLA; 43rd session): the seed, the patch at 0/0 (control), KDA's inside the delta rule, with MLA's
               # after the attention, and both one barrier early, interleaved at 2K and 16K; every timeline at 2K
      ALL_PHASES=1 knob_experiment traces/examples/kimi-out-issue/out-early.patch outearly OUT_KDA=0,OUT_MLA=0 \
        OUT_KDA=2,OUT_MLA=0 OUT_KDA=2,OUT_MLA=1 OUT_KDA=1,OUT_MLA=1 ;;
    attnlo)  # the attention's q and P as one bf16 each instead of high + low parts (attn-lo.patch, ATT_Q_LO and
             # ATT_P_LO; 43rd session): the seed, the patch at 1/1 (control), each low part dropped, both, interleaved
             # at 2K and 16K; then the seed and both dropped benched at 16K with stamps, their errors side by side.
             # The patch is against 85ce779's seed (PATCH_BASE=that file); the seed has since taken both at 0
      x=traces/examples/kimi-attn-lo/attn-lo.patch
      NO_PHASES=1 knob_experiment $x attnlo ATT_Q_LO=1,ATT_P_LO=1 ATT_Q_LO=0,ATT_P_LO=1 ATT_Q_LO=1,ATT_P_LO=0 \
        ATT_Q_LO=0,ATT_P_LO=0
      k=$(patched $x attn-lo-both) || { echo "patch failed"; continue; }
      set_knobs "$k" ATT_Q_LO=0,ATT_P_LO=0
      timeout 150 python3 run_agent.py bench "${PATCH_BASE:-kernels/kimi_linear/seed.cu}" --ctx 16384 --phases --json \
        > "$OUT/attnlo_seed.json" 2> "$OUT/attnlo_seed.err"
      timeout 150 python3 run_agent.py bench "$k" --ctx 16384 --phases --json > "$OUT/attnlo_both.json" 2> "$OUT/attnlo_both.err"
      python3 scripts/bench_errors.py "$OUT/attnlo_seed.json" "$OUT/attnlo_both.json" 2>&1 | tee "$OUT/attnlo_errors.txt" ;;
    outl2)  # the output projection's first chunks into L2 only at the barrier before it, into the ring at its start
            # (out-l2.patch, OUT_L2; 44th session: 0.967x, not kept): the seed, the patch at 0 (control), 1 and 2
            # (also the projections' chunks), interleaved at 2K and 16K; the timelines at 2K of the seed and of
            # OUT_L2 2; KIMI_TESTS=1: the Kimi GPU tests, patched. Against f251227's seed (PATCH_BASE=that file)
      knob_experiment traces/examples/kimi-out-issue/out-l2.patch outl2 OUT_L2=0 OUT_L2=1 OUT_L2=2 ;;
    mergeacc)  # the MLA merge's finish through counted fixed-point words and its W_uv row loaded at the unit's start
               # (merge-acc.patch, MERGE_ACC and MERGE_W_EARLY): the seed, the patch at 0/0 (control), each alone,
               # both, interleaved at 2K and 16K; the timelines at 2K of the seed and of both (the merge span);
               # KIMI_TESTS=1: the Kimi GPU tests, patched. Against f251227's seed (PATCH_BASE=that file); the seed
               # has since taken MERGE_ACC 1 as its ACC_COUNT path (3138dc0)
      knob_experiment traces/examples/kimi-merge-acc/merge-acc.patch mergeacc MERGE_ACC=0,MERGE_W_EARLY=0 \
        MERGE_ACC=1,MERGE_W_EARLY=0 MERGE_ACC=0,MERGE_W_EARLY=1 MERGE_ACC=1,MERGE_W_EARLY=1 ;;
    kdapairs)  # the KDA projections' K in slices of two whole chunks (kda-pairs.patch, KDA_PAIRS; 48th session): the
               # seed, the patch at 0 (control, the seed's cubin) and at 1, interleaved at 2K and 16K, then the 2K
               # timelines of the seed and KDA_PAIRS 1
      COMPARE_S=${COMPARE_S:-330} knob_experiment traces/examples/kimi-kda-pairs/kda-pairs.patch kdapairs KDA_PAIRS=0 KDA_PAIRS=1 ;;
    kdablocks)  # what closes the KDA projection phase (KDA_PAIRS left its spans unmoved; 48th session): one step's
                # per-block stamps (events build) at 2K, then L0's and L1's projection by SM-pair group (0-59 and
                # 132-191 share an SM with another unit, 60-131 alone, 192-263 none) and the router phase
      timeout 200 python3 scripts/kimi_phase_stamps.py --ctx 2048 --raw "$OUT/stamps" > "$OUT/stamps-2048.log" 2>&1
      tail -3 "$OUT/stamps-2048.log"
      for ph in "L0 kda project" "L1 kda project"; do
        python3 scripts/kimi_block_stamps.py "$OUT/stamps/stamps_2048.npz" "$ph" --groups 0,60,132,192 2>&1 |
          tee "$OUT/blocks-${ph// /-}.txt" | tail -8
      done
      python3 scripts/kimi_block_stamps.py "$OUT/stamps/stamps_2048.npz" "L1 router+windows" --groups 0,36,256 \
        > "$OUT/blocks-L1-router.txt" 2>&1 ;;
    awaitpoll)  # a down unit loads its gate/up partials without polling their arrival counters first (await-poll.patch,
                # AWAIT_POLL; 49th session): the seed, the patch at 1 (control: the seed's cubin) and 0, interleaved at
                # 2K and 16K; then each value's per-block stamps at 2K (events build; a down chunk's "issued" stamp is
                # the await's end) and L1's MoE blocks
      x=traces/examples/kimi-await-poll/await-poll.patch
      NO_PHASES=1 knob_experiment $x awaitpoll AWAIT_POLL=1 AWAIT_POLL=0
      BLOCK_ARGS=--issued knob_moe_blocks $x awaitpoll AWAIT_POLL 1 0 ;;
    defersecond)  # a down table's second chunk issued once its input is staged (defer-second.patch, DEFER_SECOND; 49th
                  # session; a test of "a load waits behind its SM's copies"): the seed, the patch at 0 (control) and 1,
                  # interleaved at 2K and 16K; then each value's per-block stamps at 2K and L1's MoE blocks
      x=traces/examples/kimi-defer-second/defer-second.patch
      NO_PHASES=1 knob_experiment $x defersecond DEFER_SECOND=0 DEFER_SECOND=1
      knob_moe_blocks $x defersecond DEFER_SECOND 0 1 ;;
    smembase)  # where the dynamic shared region starts past a 128-byte boundary (smem-base.patch, SMEM_BASE; 50th session:
               # the DEFER_SECOND control, whose RingSync grew 48 -> 56 B and so moved the region from byte 48 to 64,
               # ran 2.7 % faster than the seed): a probe of where the region lands behind a static struct, then the
               # seed against the patch at 48 (the seed's phase), 64 and 0, interleaved at 2K and 16K, the Kimi
               # GPU tests on the patched seed (its default, 0), and the stamps of the seed and of 0
      python3 - <<'PY' 2>&1 | tee "$OUT/smembase_probe.log"
import cupy as cp
src = r"""
struct Area { unsigned char bytes[STATIC_BYTES]; };
extern "C" __global__ void where(unsigned* out) {
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ __align__(16) Area area;
  area.bytes[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) { out[0] = (unsigned)__cvta_generic_to_shared(dyn); out[1] = (unsigned)__cvta_generic_to_shared(&area); out[2] = area.bytes[1]; }
}"""
for n in (48, 56, 128, 160, 176, 192):
    k = cp.RawKernel(src, "where", options=(f"-DSTATIC_BYTES={n}",))
    out = cp.zeros(3, cp.uint32)
    k((1,), (32,), (out,), shared_mem=1024)
    print(f"static {n:4d} B: static at {int(out[1])}, dynamic at {int(out[0])} ({int(out[0]) % 128} past 128)")
PY
      vs=(); for b in ${SMEM_VALUES:-48 64 0}; do vs+=("SMEM_BASE=$b"); done   # SMEM_VALUES: fewer, when time is short
      KIMI_TESTS=1 knob_experiment traces/examples/kimi-smem-base/smem-base.patch smembase "${vs[@]}" ;;
    apartctx)  # the attention partials' context floats on a 128-byte line (apart-ctx.patch, APART_CTX; 50th session, after
               # SMEM_BASE): the seed, the patch at 2 (control: the seed's .text) and 32, interleaved at 2K and 16K; then
               # every version's barrier stamps at 16K (the merge phase reads the most there)
      ALL_PHASES=1 PHASES_CTX=16384 knob_experiment traces/examples/kimi-apart-ctx/apart-ctx.patch apartctx APART_CTX=2 \
        APART_CTX=32 ;;
    keypad)  # the attention's cache-tile rows on 32-byte sectors (key-pad.patch, KEY_PAD; 51st session, after bulk_align_probe):
             # the seed, the patch at 8 (control: the seed's .text) and 16, interleaved at 2K and 16K; stamps at 16K
      ALL_PHASES=1 PHASES_CTX=16384 knob_experiment traces/examples/kimi-key-pad/key-pad.patch keypad KEY_PAD=8 KEY_PAD=16 ;;
    routeearly)  # no router phase on the KDA layers (route-early.patch, ROUTE_EARLY; 52nd session): the seed, the patch at 0
                 # (control) and 1, interleaved at 2K and 16K, the Kimi GPU tests on the patched seed (its default, 1),
                 # and the stamps of the seed and of ROUTE_EARLY 1 at 2K
      COMPARE_S=${COMPARE_S:-330} KIMI_TESTS=1 knob_experiment traces/examples/kimi-route-early/route-early.patch routeearly \
        ROUTE_EARLY=0 ROUTE_EARLY=1 ;;
    routeearlychecks)  # the patched seed (ROUTE_EARLY 1) through the Kimi GPU tests and upstream check.py (its export
                       # computes the folded router too)
      CHECK_TESTS=tests/test_gpu_kimi.py seed_checks routeearly traces/examples/kimi-route-early/route-early.patch ;;
    ringshift)  # which accesses pay for a shared region off its 128-byte boundary (ring-shift.patch, RING_SHIFT; 50th
                # session, a probe): the seed against the ring alone misaligned, everything but the ring misaligned,
                # and everything misaligned (the pre-SMEM_BASE layout), interleaved at 2K and 16K
      NO_PHASES=1 knob_experiment traces/examples/kimi-ring-shift/ring-shift.patch ringshift RING_SHIFT=0 RING_SHIFT=48 \
        SMEM_BASE=48,RING_SHIFT=80 SMEM_BASE=48 ;;
    kdapairschecks)  # with kda-pairs.patch as the seed: the kernel's GPU tests and upstream check.py
      seed_checks kdapairs traces/examples/kimi-kda-pairs/kda-pairs.patch ;;
    mlabare)  # the MLA q / kv_a projections as bare partials, summed by the absorb phase (mla-bare.patch, MLA_BARE;
              # 45th session), in one call, most needed first: the seed, the patch at 0 (control) and at 1,
              # interleaved at 2K and 16K; with the patch as the seed, the kernel's GPU tests and upstream check.py;
              # the timeline at 2K of MLA_BARE 1; the errors at 16K (bench_errors.py) of the seed, MLA_BARE 1 (the
              # same sums in the same order: the seed's errors expected) and f251227's seed (runs/seed-f251227.cu,
              # carried: the merge's fp32 sum); last, the rest of the GPU suite with the patch (MLABARE_SUITE_S)
      x=traces/examples/kimi-mla-bare/mla-bare.patch
      COMPARE_S=${COMPARE_S:-170} NO_PHASES=1 knob_experiment $x mlabare MLA_BARE=0 MLA_BARE=1
      k=$(patched $x mla-bare) || { echo "patch failed"; continue; }
      git apply $x || { echo "patch failed"; continue; }
      k3=(tests/test_gpu_kimi.py tests/test_gpu_phases.py tests/test_gpu_cheats.py)
      timeout 200 python3 -m pytest -m gpu -q -rs "${k3[@]}" 2>&1 | tee "$OUT/mlabare_gpu_kimi.log" | tail -4
      bash "$0" upstream 2>&1 | tail -3
      git apply -R $x
      timeout 70 python3 run_agent.py bench "$k" --ctx 2048 --phases 2>&1 | tee "$OUT/mlabare_phases_bare1.log" |
        grep -E "timeline|project|absorb|attention|merge|total"
      e=()
      for v in kernels/kimi_linear/seed.cu "$k" runs/seed-f251227.cu; do
        [ -f "$v" ] || continue
        t=$(basename "$(dirname "$v")")-$(basename "$v" .cu)
        timeout 60 python3 run_agent.py bench "$v" --ctx 16384 --json > "$OUT/errors-$t.json" 2> "$OUT/errors-$t.err" &&
          e+=("$OUT/errors-$t.json")
      done
      python3 scripts/bench_errors.py "${e[@]}" 2>&1 | tee "$OUT/mlabare_errors.txt"
      git apply $x
      timeout "${MLABARE_SUITE_S:-240}" python3 -m pytest -m gpu -q -rs tests "${k3[@]/#/--ignore=}" 2>&1 |
        tee "$OUT/mlabare_gpu_rest.log" | tail -4
      git apply -R $x ;;
    chainstamps)  # the stamped timeline of a timed chain beside the isolated profile (scripts/kimi_chain_stamps.py;
                  # 45th session): the seed and the seed with mla-bare.patch (MLA_BARE 1), at 2K, then at 16K
      k=$(patched traces/examples/kimi-mla-bare/mla-bare.patch mla-bare) || { echo "patch failed"; continue; }
      for c in 2048 16384; do
        timeout 240 python3 scripts/kimi_chain_stamps.py kernels/kimi_linear/seed.cu "$k" --ctx $c 2>&1 |
          tee "$OUT/chainstamps-$c.log" | tail -12
      done ;;
    stampcost)  # whether the barrier stamps move a comparison (kimi_chain_stamps.py --rounds; 46th session): the seed
                # and the seed with mla-bare.patch, plain and stamped builds chained over interleaved rounds, 2K and 16K
      k=$(patched traces/examples/kimi-mla-bare/mla-bare.patch mla-bare) || { echo "patch failed"; continue; }
      for c in 2048 16384; do
        timeout 280 python3 scripts/kimi_chain_stamps.py kernels/kimi_linear/seed.cu "$k" --ctx $c --rounds ${ROUNDS:-15} 2>&1 |
          tee "$OUT/stampcost-$c.log" | tail -9
      done ;;
    stampafter)  # the arrival stamp stored after the arrival atomic (stamp-after.patch; prepared in the 46th session,
                 # not measured): stampcost's runs on the patched seed, whose plain build is byte-identical to the seed's
      s=$(patched traces/examples/kimi-chain-stamps/stamp-after.patch seed-stamp-after) || { echo "patch failed"; continue; }
      k=$(PATCH_BASE=$s patched traces/examples/kimi-mla-bare/mla-bare.patch mla-bare) || { echo "patch failed"; continue; }
      for c in 2048 16384; do
        timeout 280 python3 scripts/kimi_chain_stamps.py "$s" "$k" --ctx $c --rounds ${ROUNDS:-12} 2>&1 |
          tee "$OUT/stampafter-$c.log" | tail -9
      done ;;
    modulebias)  # identical cubins loaded as separate modules, timed interleaved (kimi_module_bias.py; 47th session):
                 # the per-load bias that the sandbox's controls showed as 0.994x-1.008x, fixed / rotated / reloaded
      for c in 16384 2048; do
        timeout 280 python3 scripts/kimi_module_bias.py --ctx $c --copies ${COPIES:-8} --rounds ${ROUNDS:-16} 2>&1 |
          tee "$OUT/modulebias-$c.log" | grep -v "^\s*$" | grep -v "━"
      done ;;
    stampfresh)  # stampcost's rounds with a fresh load of every build each round (--fresh-loads; 47th session): the
                 # stamps' cost and the MLA_BARE difference without one fixed code placement per build
      k=$(patched traces/examples/kimi-mla-bare/mla-bare.patch mla-bare) || { echo "patch failed"; continue; }
      for c in 2048 16384; do
        timeout 280 python3 scripts/kimi_chain_stamps.py kernels/kimi_linear/seed.cu "$k" --ctx $c --rounds ${ROUNDS:-12} \
          --fresh-loads 2>&1 | tee "$OUT/stampfresh-$c.log" | tail -9
      done ;;
    attnread)  # the attention's double read of the cache at 16K (attn-read-probe.patch, ATT_READ_PROBE; 44th
               # session): barrier and event stamps at 8K and 16K of the seed and of the probe, whose head group 1
               # units fetch no tiles (wrong results: timing only, no check)
      k=$(patched traces/examples/kimi-attn-read/attn-read-probe.patch attn-read-probe) || { echo "patch failed"; continue; }
      set_knobs "$k" ATT_READ_PROBE=1
      for v in kernels/kimi_linear/seed.cu "$k"; do
        t=$(basename "$v" .cu)
        timeout 200 python3 scripts/kimi_phase_stamps.py "$v" --ctx 8192 16384 > "$OUT/attnread-stamps-$t.log" 2>&1
        echo "== $t"; grep -E "phase timeline|L3 attention" "$OUT/attnread-stamps-$t.log" | head -12
      done ;;
    mmaloop)  # issue 28 step 1: the int4 GEMV on tensor cores (mma-loop.patch, MMA_LOOP; 42nd session): the chunk
              # probe of both loops, the seed against MMA_LOOP 1 interleaved at 2K and 16K, the Kimi GPU tests and
              # upstream check.py with MMA_LOOP 1 as the seed's default (the seed restored after), its stamps at 2K
      x=traces/examples/kimi-mma-loop/mma-loop.patch
      v=$(mktemp -d); cp kernels/kimi_linear/seed.cu "$v/seed.cu"
      k=$(patched $x mma1) || { echo "patch failed"; continue; }
      set_knobs "$k" MMA_LOOP=1
      for f in "$v/seed.cu" "$k"; do
        timeout 120 python3 scripts/chunk_probe.py "$f" 2>&1 | tee -a "$OUT/mmaloop_chunk_probe.log" | grep -E "compute|One"
      done
      COLUMNS=200 timeout "${COMPARE_S:-300}" python3 run_agent.py compare "$v/seed.cu" "$k" --ctx 2048 \
        --ctx 16384 --rounds "${ROUNDS:-3}" 2>&1 | tee "$OUT/mmaloop_compare.log" | tail -25
      cp "$k" kernels/kimi_linear/seed.cu
      timeout 400 python3 -m pytest -m gpu -q -rs tests/test_gpu_kimi.py 2>&1 | tee "$OUT/mmaloop_kimi_tests.log" | tail -8
      bash "$0" upstream 2>&1 | tail -3
      cp "$v/seed.cu" kernels/kimi_linear/seed.cu
      timeout 150 python3 run_agent.py bench "$k" --ctx 2048 --phases 2>&1 | tee "$OUT/mmaloop_phases_mma1.log" |
        grep -E "timeline|kda project|g/u|o_proj|total" | head -14 ;;
    awaitchecks)  # await-early.patch as the seed: the Kimi, phases and cheats GPU tests and upstream check.py (what
                  # landing it needs besides the awaitearly compare), then the seed restored
      seed_checks awaitchecks traces/examples/kimi-await-early/await-early.patch ;;
    routerflags)  # router-flags.patch (40th session): ROUTER_SPLIT and no grid barrier between the router and the MoE
                  # phase (ROUTER_FLAGS: every block polls the logits): the seed, the patch at 0/0 (control), split
                  # alone, both; the timelines at 2K of the seed and of both; the kernel's GPU tests and upstream
                  # check.py with the patch as the seed
      x=traces/examples/kimi-router-split/router-flags.patch
      knob_experiment $x routerflags ROUTER_FLAGS=0,ROUTER_SPLIT=0 ROUTER_FLAGS=0,ROUTER_SPLIT=1 ROUTER_FLAGS=1,ROUTER_SPLIT=1
      seed_checks routerflags $x ;;
    routerrows)  # the router blocks' rows copied into their idle ring at the barrier before the router phase
                 # (router-rows.patch, ROUTER_SMEM; 38th session): the seed, the patch at 0 (control) and 1,
                 # interleaved at 2K and 16K; the patched seed's timeline at 2K; the kernel's GPU tests (Kimi,
                 # phases, cheats) and upstream check.py with the patch as the seed
      x=traces/examples/kimi-router-rows/router-rows.patch
      NO_PHASES=1 knob_experiment $x routerrows ROUTER_SMEM=0 ROUTER_SMEM=1
      k=$(patched $x seed-router-rows) || { echo "patch failed"; continue; }
      timeout 150 python3 run_agent.py bench "$k" --ctx 2048 --phases 2>&1 | tee "$OUT/routerrows_phases.log" |
        grep -E "timeline|router|g/u|total"
      seed_checks routerrows $x ;;
    foldsplit)  # the GEMV fold split across the lane pair (fold-split.patch, FOLD_SPLIT, HI_BY_SUB; 39th session): the
                # seed before it (the patch reverted), both 0 (control), FOLD_SPLIT alone and both, interleaved at 2K and
                # 16K; the Kimi GPU tests; the seed's timeline at 2K
      x=traces/examples/kimi-fold-split/fold-split.patch
      KIMI_TESTS=1 NO_PHASES=1 knob_experiment $x foldsplit FOLD_SPLIT=0,HI_BY_SUB=0 FOLD_SPLIT=1,HI_BY_SUB=0 \
        FOLD_SPLIT=1,HI_BY_SUB=1
      timeout 150 python3 run_agent.py bench kernels/kimi_linear/seed.cu --ctx 2048 --phases 2>&1 |   # landed: the seed
        tee "$OUT/foldsplit_phases.log" |
        grep -E "µs/tok|timeline|project|o_proj|g/u|total" ;;
    session40)  # the router-flags experiment first; then the seed's GPU tests (Kimi, phases, cheats), upstream check.py
                # and bench at 2K / 8K / 16K
      bash "$0" routerflags
      seed_checks session40
      BENCH_TASKS=kimi_linear bash "$0" bench ;;
    session39)  # the seed with the fold split landed: its GPU tests (Kimi, phases, cheats; CHECK_TESTS=tests: the
                # whole suite) and upstream check.py; the seed before it (fold-split.patch reverted) interleaved against
                # it; bench at 2K / 8K / 16K; the chunk probe of both seeds
      seed_checks session39
      b=$(patched traces/examples/kimi-fold-split/fold-split.patch seed-before-fold -R) || { echo "patch failed"; continue; }
      COLUMNS=200 timeout 200 python3 run_agent.py compare kernels/kimi_linear/seed.cu "$b" --ctx 2048 --ctx 16384 \
        --rounds "${ROUNDS:-3}" 2>&1 | tee "$OUT/session39_compare.log" | tail -8
      BENCH_TASKS=kimi_linear bash "$0" bench
      for f in kernels/kimi_linear/seed.cu "$b"; do
        timeout 120 python3 scripts/chunk_probe.py "$f" 2>&1 | tee -a "$OUT/chunk_probe.log" | tail -12
      done ;;
    timeline)  # the seed's phase timelines at 2K and 16K as `bench --json` (the schedule model's --timeline input)
      timeout 200 python3 run_agent.py bench --ctx 2048 --ctx 16384 --phases --json > "$OUT/bench-phases-h200.json" \
        2> "$OUT/bench-phases.err"; tail -3 "$OUT/bench-phases.err" ;;
    moechain)  # which blocks and events close the MoE phase: one step's per-block stamps (events build) at 2K,
               # then the L1 MoE phase's latest blocks and block groups (the seed's knobs: 0-35 a shared and a routed
               # gate/up unit and a down unit, 36-38 two routed and a down, 39-59 two routed, 60- one routed and a down)
      timeout 200 python3 scripts/kimi_phase_stamps.py --ctx 2048 --raw "$OUT/stamps" > "$OUT/stamps-2048.log" 2>&1
      tail -3 "$OUT/stamps-2048.log"
      python3 scripts/kimi_block_stamps.py "$OUT/stamps/stamps_2048.npz" "L1 g/u+down" --groups 0,36,39,60 2>&1 | tee "$OUT/moechain.txt" ;;
    coldcode)  # is a once-per-step phase slower the first time its code runs? absorb q, attention, merge, router twice
      k=$(patched traces/examples/kimi-cold-code/seed-twice.patch seed-twice) || { echo "patch failed"; continue; }
      timeout 300 python3 scripts/kimi_phase_stamps.py "$k" --ctx 2048 16384 2>&1 | tee "$OUT/coldcode.log" | head -70 ;;
    rolled)  # where the landed rolled cache-tile copy gained: phase timelines of the seed before it and of the seed
      u=$(patched traces/examples/kimi-cold-code/seed-rolled-tile-copy.patch seed-unrolled -R) || { echo "patch failed"; continue; }
      for k in "$u" kernels/kimi_linear/seed.cu; do
        timeout 200 python3 run_agent.py bench "$k" --ctx 2048 --ctx 16384 --phases 2>&1 | tee -a "$OUT/rolled_phases.log" | tail -60
      done ;;
    tiediag)  # the timed sample refused in the twenty-sixth session (p92's knobs; the seed's output is the same):
              # does any valid expert set match it once the checker's caps are raised?
      timeout 300 python3 scripts/timed_sample_diag.py 1531211386 16384 2 --knob KSPLIT_KDA=2 --knob KSPLIT_SHARED=12 \
        --search 300 2>&1 | tee "$OUT/tiediag.log" | tail -25 ;;
    routerpf)  # the router's rows prefetched into L2 at the barrier before the router phase
      k=$(patched traces/examples/kimi-router-prefetch/seed-router-prefetch.patch seed-router-prefetch) ||
        { echo "patch failed"; continue; }
      timeout 400 python3 run_agent.py compare kernels/kimi_linear/seed.cu "$k" --ctx 2048 --ctx 16384 --rounds 6 \
        2>&1 | tee "$OUT/routerpf_compare.log" | tail -20
      timeout 200 python3 run_agent.py bench "$k" --ctx 2048 --phases 2>&1 | tee "$OUT/routerpf_phases.log" | tail -30 ;;
    stepwarm)  # L2 warm-ups: the step's first phase issues its chunks before staging (all variants); the next step's
               # first chunks into L2 as the step ends (PREFETCH_STEP 1: each block its own, 2: an SM's last block); the
               # attention's cache rows into L2 at the barrier before the MLA layer (PREFETCH_CACHE)
      knob_experiment traces/examples/kimi-step-prefetch/seed-step-prefetch.patch stepwarm ${STEPWARM_VARIANTS:-\
        PREFETCH_STEP=0,PREFETCH_CACHE=0 PREFETCH_STEP=2,PREFETCH_CACHE=0 PREFETCH_STEP=0,PREFETCH_CACHE=1 \
        PREFETCH_STEP=2,PREFETCH_CACHE=1} ;;
    splitpairs)  # the last routed experts' gate/up as one-matrix units (SPLIT_PAIRS; 0 computes exactly what the seed does)
      knob_experiment traces/examples/kimi-split-pairs/seed-split-pairs.patch splitpairs ${SPLIT_VARIANTS:-\
        SPLIT_PAIRS=0 SPLIT_PAIRS=1 SPLIT_PAIRS=2 SPLIT_PAIRS=3} ;;
    stacked)  # both prepared experiments in one call: the seed, C0 alone, the step warm-ups, split pairs, and both
              # patches stacked at their defaults, interleaved at 2K and 16K; then the Kimi GPU tests with both applied
      d=$(mktemp -d) && sw=traces/examples/kimi-step-prefetch/seed-step-prefetch.patch &&
        sp=traces/examples/kimi-split-pairs/seed-split-pairs.patch && cp kernels/kimi_linear/seed.cu "$d/seed.cu" &&
        cp "$(patched $sw w)" "$d/c0-only.cu" && set_knobs "$d/c0-only.cu" PREFETCH_STEP=0,PREFETCH_CACHE=0 &&
        cp "$(patched $sw w)" "$d/stepwarm-2-1.cu" && cp "$(patched $sp s)" "$d/split-2.cu" &&
        git apply $sw && git apply $sp && cp kernels/kimi_linear/seed.cu "$d/both.cu" || { echo "patch failed"; continue; }
      COLUMNS=200 timeout "${COMPARE_S:-440}" python3 run_agent.py compare "$d"/{seed,c0-only,stepwarm-2-1,split-2,both}.cu \
        --ctx 2048 --ctx 16384 --rounds "${ROUNDS:-4}" 2>&1 | tee "$OUT/stacked_compare.log" | tail -40
      timeout 300 python3 -m pytest -m gpu -q -rs tests/test_gpu_kimi.py 2>&1 | tee "$OUT/stacked_kimi_tests.log" | tail -6
      git apply -R $sp && git apply -R $sw ;;
    unitcost)  # why one-matrix units cost (split pairs here, u3 in the fourteenth session): the seed against SPLIT_PAIRS 0
               # (the patch's plumbing alone) and 2, interleaved at 2K; then the in-phase events and one step's
               # per-block stamps (--raw) of the seed and of SPLIT_PAIRS 2
      d=$(mktemp -d) && sp=traces/examples/kimi-split-pairs/seed-split-pairs.patch && cp kernels/kimi_linear/seed.cu "$d/seed.cu" &&
        cp "$(patched $sp s)" "$d/split-2.cu" && cp "$d/split-2.cu" "$d/split-0.cu" && set_knobs "$d/split-0.cu" SPLIT_PAIRS=0 ||
        { echo "patch failed"; continue; }
      COLUMNS=200 timeout 240 python3 run_agent.py compare "$d"/{seed,split-0,split-2}.cu --ctx 2048 --rounds "${ROUNDS:-5}" \
        2>&1 | tee "$OUT/unitcost_compare.log" | tail -12
      for k in seed split-2; do
        timeout 200 python3 scripts/kimi_phase_stamps.py "$d/$k.cu" --ctx 2048 --raw "$OUT/unitcost-raw-$k" 2>&1 |
          tee "$OUT/unitcost_stamps_$k.log" | grep -E "g/u"
      done ;;
    unitcall)  # the walk to a unit's head chunk out of line and warm (UNIT_CALL 1), its control (2: never warmed by
               # issue_first), found ahead of the ring wait (UNIT_AHEAD 1), both, and split pairs with UNIT_CALL 1,
               # interleaved at 2K and 16K; then one step's per-block stamps at 2K of the seed, UNIT_CALL 1 and 2 (the
               # group table of L1's MoE phase); then the Kimi GPU tests with the patch (its defaults) as the seed
      d=$(mktemp -d) && uc=traces/examples/kimi-unit-call/seed-unit-call.patch &&
        sp=traces/examples/kimi-split-pairs/seed-split-pairs.patch && cp kernels/kimi_linear/seed.cu "$d/seed.cu" &&
        for v in 1,0 2,0 0,1 1,1; do
          cp "$(patched $uc u)" "$d/call-${v%,*}-ahead-${v#*,}.cu" && set_knobs "$d/call-${v%,*}-ahead-${v#*,}.cu" \
            "UNIT_CALL=${v%,*},UNIT_AHEAD=${v#*,}" || break; done &&
        git apply $sp && git apply $uc && cp kernels/kimi_linear/seed.cu "$d/split-2-call-1.cu" &&
        set_knobs "$d/split-2-call-1.cu" UNIT_CALL=1,UNIT_AHEAD=0 && git apply -R $uc && git apply -R $sp &&
        [ -f "$d/call-1-ahead-1.cu" ] || { echo "patch failed"; continue; }
      COLUMNS=200 timeout "${COMPARE_S:-300}" python3 run_agent.py compare "$d"/{seed,call-1-ahead-0,call-2-ahead-0,call-0-ahead-1,call-1-ahead-1,split-2-call-1}.cu \
        --ctx 2048 --ctx 16384 --rounds "${ROUNDS:-4}" 2>&1 | tee "$OUT/unitcall_compare.log" | tail -18
      for k in seed call-1-ahead-0 call-2-ahead-0; do
        timeout 100 python3 scripts/kimi_phase_stamps.py "$d/$k.cu" --ctx 2048 --steps 5 --raw "$OUT/raw-$k" \
          > "$OUT/unitcall_stamps_$k.log" 2>&1 && python3 scripts/kimi_block_stamps.py "$OUT/raw-$k/stamps_2048.npz" \
          "L1 g/u+down" --groups 0,36,60,120 --latest 1 2>&1 | tee "$OUT/unitcall_groups_$k.log" | tail -5
      done
      git apply $uc && timeout 300 python3 -m pytest -m gpu -q -rs tests/test_gpu_kimi.py 2>&1 |
        tee "$OUT/unitcall_kimi_tests.log" | tail -4
      git apply -R $uc ;;
    coldfetch) timeout 120 python3 scripts/cold_code_probe.py 2>&1 | tee "$OUT/cold_code_probe.log" ;;   # cold code under load
    stalls)   # warp stall reasons of one seed step (or STALLS_KERNEL's) by source function (ncu, caches and clocks as they are)
      NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
      if [ -z "$NCU" ]; then echo "stalls: no ncu on this machine"; else
        timeout 300 "$NCU" --cache-control none --clock-control none -k regex:kimi_decode --launch-skip 6 \
          --launch-count 1 --section WarpStateStats --section SourceCounters -f -o "$OUT/stalls" \
          python3 scripts/kimi_stall_profile.py ${STALLS_KERNEL:-} > "$OUT/stalls.log" 2>&1
        "$NCU" -i "$OUT/stalls.ncu-rep" --page raw --csv > "$OUT/stalls_raw.csv" 2>> "$OUT/stalls.log"
        "$NCU" -i "$OUT/stalls.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/stalls_cuda_sass.csv" \
          2>> "$OUT/stalls.log"
        python3 scripts/kimi_stall_table.py "$OUT/stalls_cuda_sass.csv" ${STALLS_KERNEL:-} 2>&1 | tee "$OUT/stalls_table.log"
      fi ;;
    codedose)  # what cold code at a phase start costs in the step: 4 KB of filler run by warp 0 at every release, one
               # copy (CODE_DOSE 1), 16 in turn (2, cold), or one copy twice (3: the second run warm); interleaved at 2K
               # and 16K with barrier timelines of the seed and of CODE_DOSE 2 (NO_PHASES=1: none); then the stall
               # table of CODE_DOSE 2 (NO_STALLS=1: none)
      cd_patch=traces/examples/kimi-code-dose/seed-code-dose.patch
      knob_experiment $cd_patch codedose CODE_DOSE=1 CODE_DOSE=3 CODE_DOSE=2
      [ -n "${NO_STALLS:-}" ] && continue
      cold=$(patched $cd_patch cold) && set_knobs "$cold" CODE_DOSE=2 && STALLS_KERNEL=$cold bash "$0" stalls ;;
    ringahead)  # fewer weight bytes in flight per block (PRE_CHUNKS 1: one chunk before the barrier; RING_AHEAD 1: one
                # chunk ahead while computing), interleaved at 2K and 16K with barrier timelines; one step's chunk
                # events at 2K of the seed and of both; then the Kimi GPU tests with both at 1 as the seed
      ra=traces/examples/kimi-ring-ahead/seed-ring-ahead.patch
      NO_PHASES= knob_experiment $ra ringahead PRE_CHUNKS=1 RING_AHEAD=1 PRE_CHUNKS=1,RING_AHEAD=1
      both=$(patched $ra both) && set_knobs "$both" PRE_CHUNKS=1,RING_AHEAD=1 || { echo "patch failed"; continue; }
      for k in kernels/kimi_linear/seed.cu "$both"; do
        log="$OUT/ringahead_stamps_$(basename "$k" .cu).log"
        timeout 100 python3 scripts/kimi_phase_stamps.py "$k" --ctx 2048 --steps 5 > "$log" 2>&1
        grep -E "project|g/u|o_proj|total" "$log" | head -14
      done
      keep=$(mktemp) && cp kernels/kimi_linear/seed.cu "$keep" && cp "$both" kernels/kimi_linear/seed.cu &&
        timeout 300 python3 -m pytest -m gpu -q -rs tests/test_gpu_kimi.py 2>&1 | tee "$OUT/ringahead_kimi_tests.log" | tail -4
      cp "$keep" kernels/kimi_linear/seed.cu ;;
    mmarate) timeout 120 python3 scripts/mma_rate_probe.py 2>&1 | tee "$OUT/mma_rate.log" ;;   # mma.sync vs wgmma rates
    cluster) timeout 300 python3 scripts/cluster_probe.py 2>&1 | tee "$OUT/cluster_probe.log" ;;   # issue 28, step 3
    pdl) timeout 300 python3 scripts/pdl_probe.py 2>&1 | tee "$OUT/pdl_probe.log" ;;   # issue 28: the step boundary
    validate)  # end of a session: timings alone first, then the correctness work side by side (waits on PIDs)
      BENCH_TASKS=kimi_linear bash "$0" bench
      bash "$0" host > /dev/null 2>&1; tail -18 "$OUT/host.log"
      bash "$0" stamps > /dev/null 2>&1; head -58 "$OUT/stamps.log"   # the timeline at both contexts
      bash "$0" kimi > "$OUT/kimi_tests.out" 2>&1 & p1=$!
      bash "$0" upstream > "$OUT/upstream.out" 2>&1 & p2=$!
      bash "$0" agent > "$OUT/agent_tests.out" 2>&1 & p3=$!
      bash "$0" cheats > "$OUT/cheats_tests.out" 2>&1 & p5=$!
      wait $p1 $p2 $p3 $p5
      bash "$0" sandbox > "$OUT/sandbox_tests.out" 2>&1   # alone: test_gpu_phases asserts on timings
      tail -3 "$OUT/kimi_tests.out"; tail -9 "$OUT/upstream.out"; tail -3 "$OUT/agent_tests.out"
      tail -3 "$OUT/sandbox_tests.out"; tail -3 "$OUT/cheats_tests.out"
      rm -f "$OUT"/*.out "$OUT"/*.err ;;   # at most 8 files come back from the device
    throughput)  # issue 27: tuner candidates per minute on the Kimi seed at --inflight 1 then 2 (and more), one budget each
      for k in ${INFLIGHT_LIST:-1 2}; do
        d=/tmp/mk-rate-$k; rm -rf "$d"
        timeout 290 python3 run_agent.py run --planner tuner --budget "${SESSION_BUDGET:-2m}" --inflight "$k" \
          ${SESSION_GPUS:+--gpus "$SESSION_GPUS"} --out "$d" > "/tmp/mk-rate-$k.log" 2>&1
        tail -4 "/tmp/mk-rate-$k.log"; cp "$d/trace.jsonl" "$OUT/rate_inflight$k.jsonl"
      done
      python3 scripts/session_rate.py "$OUT"/rate_inflight*.jsonl 2>&1 | tee "$OUT/rate.txt" ;;
    modelcheck)  # issue 28 step 6: the schedule model's predictions against knob moves profiled and timed here
      timeout 580 python3 scripts/model_check.py 2>&1 | tee "$OUT/model_check.log" | tail -30 ;;
    recovery)  # issue 27: what a wrong candidate costs the next one, inside a session (scripted model: wrong, then honest)
      d=/tmp/mk-recovery; rm -rf "$d"; mkdir -p "$d"
      cat > "$d/script.jsonl" <<'JSONL'
{"model": "claude-sonnet-4-5", "description": "a wrong candidate, then honest ones: the cost of recovering from it"}
{"content": [{"type": "tool_use", "name": "propose", "input": {"parent": "best", "name": "wrong", "hypothesis": "deliberately wrong: the last residual add scaled by 1.5", "edits": [{"search": "ld_bf16(cx.resid + n) + bf16r(a)", "replace": "ld_bf16(cx.resid + n) + 1.5f * bf16r(a)"}]}}], "stop_reason": "tool_use"}
{"content": [{"type": "tool_use", "name": "propose", "input": {"parent": "seed", "name": "pf0", "hypothesis": "PREFETCH off", "knobs": {"PREFETCH": 0}}}], "stop_reason": "tool_use"}
{"content": [{"type": "tool_use", "name": "propose", "input": {"parent": "seed", "name": "ko16", "hypothesis": "KSPLIT_O 16", "knobs": {"KSPLIT_O": 16}}}], "stop_reason": "tool_use"}
{"content": [{"type": "tool_use", "name": "finish", "input": {"reason": "recovery measured"}}], "stop_reason": "tool_use"}
JSONL
      timeout 400 python3 run_agent.py run --scripted-model "$d/script.jsonl" --budget 5m --out "$d/out" 2>&1 | tail -6
      cp "$d/out/trace.jsonl" "$OUT/recovery.jsonl"
      python3 scripts/recovery_time.py "$OUT/recovery.jsonl" 2>&1 | tee "$OUT/recovery.txt" ;;
    calib) timeout 300 python3 -m megakernel_agent.tasks.kimi_linear.calibrate --seeds 8 --ctx 2048 2>&1 | tee "$OUT/calibrate.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
