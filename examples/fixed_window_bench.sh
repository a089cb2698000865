#!/usr/bin/env bash
# A told fixed window whose server states its resets (issue 19): `batchrun
# sim --limit 20/30s,fixed --dialect ietf` (windows from the sim's start),
# the job started $PHASE seconds into a window, told `--limit
# 20/30s,fixed`: one process, then two fleet processes on one Redis key
# (`--shard i/2`). Aligned to the stated reset, the second window's quota
# goes at its boundary; kept as a sliding window, a window after the
# first calls' answers.
#
# With UNIT=tokens the window counts tokens instead (`--limit
# 1000/30s,fixed,tokens`, each item a prompt of 50 tokens, told `--cost
# 'chars(prompt)/4'`): the same 20 calls a window.
#
# Prints one row per run: mode, wall time, the ideal (the three windows'
# boundaries the job needs, from its start), their ratio and the 429s.
#
#   examples/fixed_window_bench.sh              # target/release/batchrun
#   REPEAT=2 BIN=/path/to/older/batchrun examples/fixed_window_bench.sh
#   UNIT=tokens examples/fixed_window_bench.sh
#
# Needs redis-server on PATH; runs it on a free loopback port under a
# temporary directory.
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
ITEMS=${ITEMS:-50}
PHASE=${PHASE:-15}
REPEAT=${REPEAT:-1}
MODES=${MODES:-"one fleet"}
UNIT=${UNIT:-calls}
case "$UNIT" in
calls) SPEC=20/30s,fixed WEIGH=() ;;
tokens) SPEC=1000/30s,fixed,tokens WEIGH=(--cost 'chars(prompt)/4' --json-body) ;;
*) echo "UNIT is calls or tokens" >&2 && exit 2 ;;
esac

. "$(dirname "$0")/bench_common.sh"
need_bin
bench_tmp fixed_window_bench
start_redis "$TMP"

prompt=$(printf 'x%.0s' $(seq 200))
for i in $(seq "$ITEMS"); do echo "{\"n\": $i, \"prompt\": \"$prompt\"}"; done >"$TMP/items.jsonl"
# 20 at once, 20 at the next boundary, the rest at the one after.
ideal=$(python3 -c "print(30 * (($ITEMS - 1) // 20) - $PHASE)")

printf '%-6s %7s %7s %6s %5s\n' mode wall_s ideal_s ratio 429s
run=0
for _ in $(seq "$REPEAT"); do
    for mode in $MODES; do
        run=$((run + 1))
        start_sim_with --limit "$SPEC" --dialect ietf --concurrency 1000 \
            --latency 5ms..30ms --credits 1000000000
        sim=$SIM_PID url=$URL
        sleep "$PHASE"
        dir="$TMP/run$run"
        args=(--url "$url/v1/echo?n={n}" --limit "$SPEC" -c 5 "${WEIGH[@]}")
        if [ "$mode" = fleet ]; then
            run_fleet_pair "$dir" "fixed$run" "${args[@]}"
        else
            mkdir -p "$dir"
            cp "$TMP/items.jsonl" "$dir/items.jsonl"
            START=$(date +%s.%N)
            BATCHRUN_API_KEY=sk-bench-fixed-key "$BIN" "$dir/items.jsonl" "${args[@]}" \
                --json --state-dir "$dir/state" >"$dir/out1.json" 2>"$dir/err1" || true
        fi
        start=$START
        end=$(date +%s.%N)
        kill "$sim" 2>/dev/null || true
        wait "$sim" 2>/dev/null || true
        limited=$(cat "$dir"/out*.json | python3 -c "
import json, sys
print(sum(json.loads(l).get('rate_limited', 0) for l in sys.stdin if l.startswith('{')))")
        python3 - "$mode" "$start" "$end" "$ideal" "$limited" <<'PY'
import sys
mode, t0, t1, ideal, limited = sys.argv[1:]
wall = float(t1) - float(t0)
print(f"{mode:<6} {wall:7.2f} {float(ideal):7.2f} {wall / float(ideal):5.2f}x {limited:>5}")
PY
    done
done
