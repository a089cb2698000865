#!/usr/bin/env bash
# A fleet told only a rate against a limit whose shape it was not told
# (issue 19): two processes on one Redis key (`--shard i/2`, `-c 5` each),
# each told `--limit $TOLD` (30/1s by default: the rate only; 90/1s: three
# times a secret limit), against `batchrun sim` keeping each shape of
# 30/1s and stating nothing (`--secret-limit`, `--cooldown 1s`, latency
# 5-30 ms).
#
# Prints one row per shape: wall time, the ideal time (what the shape lets
# through at once, then its rate), their ratio and the 429s of both
# processes.
#
#   examples/fleet_shapes_bench.sh                  # target/release/batchrun
#   TOLD=90/1s examples/fleet_shapes_bench.sh       # a secret limit at a third
#   SHAPES="bucket5 bucket0" REPEAT=3 BIN=/path/to/older/batchrun examples/fleet_shapes_bench.sh
#   SHAPES="bucket2 bucket1" examples/fleet_shapes_bench.sh     # small bursts
#   TOLD=shape examples/fleet_shapes_bench.sh       # told each shape's own limit
#
# Needs redis-server on PATH; runs it on a free loopback port under a
# temporary directory.
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
ITEMS=${ITEMS:-150}
TOLD=${TOLD:-30/1s}
CONC=${CONC:-5}
SHAPES=${SHAPES:-"sliding fixed bucket5 bucket0"}
REPEAT=${REPEAT:-1}

. "$(dirname "$0")/bench_common.sh"
need_bin
bench_tmp fleet_shapes_bench
start_redis "$TMP"

for i in $(seq "$ITEMS"); do echo "{\"n\": $i}"; done >"$TMP/items.jsonl"

printf '%-9s %-14s %7s %7s %6s %5s\n' shape told wall_s ideal_s ratio 429s
run=0
for shape in $SHAPES; do
    case $shape in
        sliding) spec=30/1s,sliding; at_once=30 ;;
        fixed) spec=30/1s,fixed; at_once=30 ;;
        bucket5) spec=30/1s,burst=5; at_once=6 ;;
        bucket2) spec=30/1s,burst=2; at_once=3 ;;
        bucket1) spec=30/1s,burst=1; at_once=2 ;;
        bucket0) spec=30/1s,burst=0; at_once=1 ;;
        *) echo "unknown shape $shape" >&2; exit 2 ;;
    esac
    # TOLD=shape: told the shape's own spec (its shape and burst).
    told=$TOLD
    [ "$TOLD" = shape ] && told=$spec
    ideal=$(python3 -c "print(f'{($ITEMS - $at_once) / 30:.2f}')")
    for _ in $(seq "$REPEAT"); do
        run=$((run + 1))
        start_sim_with --limit "$spec" --secret-limit --cooldown 1s \
            --concurrency 1000 --latency 5ms..30ms --credits 1000000000
        sim=$SIM_PID url=$URL
        dir="$TMP/run$run"
        run_fleet_pair "$dir" "shapes$run" --url "$url/v1/echo?n={n}" \
            --limit "$told" -c "$CONC"
        start=$START
        end=$(date +%s.%N)
        kill "$sim" 2>/dev/null || true
        wait "$sim" 2>/dev/null || true
        limited=$(cat "$dir"/out*.json | python3 -c "
import json, sys
print(sum(json.loads(l).get('rate_limited', 0) for l in sys.stdin if l.startswith('{')))")
        python3 - "$shape" "$told" "$start" "$end" "$ideal" "$limited" <<'EOF'
import sys
shape, told, t0, t1, ideal, limited = sys.argv[1:]
wall = float(t1) - float(t0)
print(f"{shape:<9} {told:<14} {wall:7.2f} {float(ideal):7.2f} {wall / float(ideal):5.2f}x {limited:>5}")
EOF
        [ -n "${VERBOSE:-}" ] && grep -h 'batchrun:' "$dir"/err1 "$dir"/err2 | grep -v 'job \|done\|/150' || true
    done
done
