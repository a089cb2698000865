#!/usr/bin/env bash
# A sliding window of calls shared with another client on the same API key
# (issue 19): `batchrun sim --limit 20/1s --dialect $DIALECT`, and beside
# batchrun a steady spender (a Python loop, not batchrun) sending
# $OTHER calls a second on the same key, whatever the answers. batchrun is
# told `--limit $TOLD` (20/1s; -c 10, $ITEMS items): one process, then two
# fleet processes on one Redis key (`--shard i/2`). The server's
# statements say how much of the window is spent; what batchrun's own
# calls do not explain was spent elsewhere.
#
# Prints one row per run: mode, the other client's rate, wall time, the
# ideal (the items at the rest of the window: 20 - $OTHER a second), their
# ratio, batchrun's 429s and the other client's.
#
#   examples/shared_key_bench.sh              # target/release/batchrun
#   OTHER="5 10 16" REPEAT=2 BIN=/path/to/older/batchrun examples/shared_key_bench.sh
#   TOLD=20/1s,sliding MODES=one examples/shared_key_bench.sh
#
# Needs redis-server on PATH for the fleet's rows; runs it on a free
# loopback port under a temporary directory.
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
ITEMS=${ITEMS:-100}
OTHER=${OTHER:-"4 10 16"}
REPEAT=${REPEAT:-1}
MODES=${MODES:-"one fleet"}
DIALECT=${DIALECT:-ietf}
# run_fleet_pair sends this key.
KEY=sk-bench-fleet-key

. "$(dirname "$0")/bench_common.sh"
need_bin
bench_tmp shared_key_bench
start_redis "$TMP"

for i in $(seq "$ITEMS"); do echo "{\"n\": $i}"; done >"$TMP/items.jsonl"

# The other client: $2 calls a second to $1 until $3 exists; prints its
# 429s to $4.
cat >"$TMP/other.py" <<'PY'
import os, sys, time, urllib.request, urllib.error
url, rate, stop, out, key = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
limited, t = 0, time.monotonic()
while not os.path.exists(stop):
    req = urllib.request.Request(url, headers={"x-api-key": key})
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except urllib.error.HTTPError as e:
        limited += e.code == 429
    except OSError:
        pass
    t += 1.0 / rate
    time.sleep(max(0.0, t - time.monotonic()))
open(out, "w").write(str(limited))
PY

printf '%-6s %5s %7s %7s %6s %5s %5s\n' mode other wall_s ideal_s ratio 429s other429
run=0
for _ in $(seq "$REPEAT"); do
    for other in $OTHER; do
        for mode in $MODES; do
            run=$((run + 1))
            start_sim_with --limit 20/1s --cooldown 0s --dialect "$DIALECT" --concurrency 1000 \
                --latency 5ms..20ms --credits 1000000000
            sim=$SIM_PID url=$URL
            dir="$TMP/run$run"
            mkdir -p "$dir"
            python3 "$TMP/other.py" "$url/v1/other?x=1" "$other" "$dir/stop" "$dir/other429" "$KEY" &
            spender=$!
            PIDS+=("$spender")
            # The spender's own window first.
            sleep 1.5
            args=(--url "$url/v1/echo?n={n}" --limit "${TOLD:-20/1s}" -c 10)
            if [ "$mode" = fleet ]; then
                run_fleet_pair "$dir" "shared$run" "${args[@]}"
            else
                cp "$TMP/items.jsonl" "$dir/items.jsonl"
                START=$(date +%s.%N)
                BATCHRUN_API_KEY=$KEY "$BIN" "$dir/items.jsonl" "${args[@]}" \
                    --json --state-dir "$dir/state" >"$dir/out1.json" 2>"$dir/err1" || true
            fi
            end=$(date +%s.%N)
            touch "$dir/stop"
            wait "$spender" 2>/dev/null || true
            kill "$sim" 2>/dev/null || true
            wait "$sim" 2>/dev/null || true
            limited=$(cat "$dir"/out*.json | python3 -c "
import json, sys
print(sum(json.loads(l).get('rate_limited', 0) for l in sys.stdin if l.startswith('{')))")
            python3 - "$mode" "$other" "$START" "$end" "$ITEMS" "$limited" "$(cat "$dir/other429")" <<'PY'
import sys
mode, other, t0, t1, items, limited, other429 = sys.argv[1:]
wall = float(t1) - float(t0)
ideal = int(items) / (20 - float(other))
print(f"{mode:<6} {other:>5} {wall:7.2f} {ideal:7.2f} {wall / ideal:5.2f}x {limited:>5} {other429:>5}")
PY
        done
    done
done
