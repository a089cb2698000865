#!/usr/bin/env bash
# A fleet following policies the server states but it was not told (issue
# 19): two processes on one Redis key, each told only `--limit 100/1s`,
# against `batchrun sim` keeping 100/1s and a second policy that it states
# in the chosen dialect: a window of 30 calls per 2 s ("window"), or a
# budget of 600 tokens a second ("tokens", the calls weighed by `--cost`).
# One process alone (no Redis) runs the same job for comparison. For the
# token budget, a third row runs the fleet with another client on the same
# API key (one process, no Redis, `-c 2`, its own copy of the items)
# spending the same budget: the fleet hears of it only through what the
# responses say is left.
#
# Prints one row per (policy, dialect, how): wall time, the ideal time
# (the first window at once, then the policy's pace), their ratio, the
# 429s and the most the sim counted in any window of the stated policy.
#
#   examples/fleet_stated_bench.sh                 # target/release/batchrun
#   DIALECTS="ietf" ITEMS=300 examples/fleet_stated_bench.sh
#   POLICIES=tokens BIN=/path/to/older/batchrun examples/fleet_stated_bench.sh
#
# Needs redis-server on PATH; runs it on a free loopback port under a
# temporary directory.
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
ITEMS=${ITEMS:-150}
DIALECTS=${DIALECTS:-"ietf ietf-old"}
CONC=${CONC:-5}
POLICIES=${POLICIES:-"window tokens"}

. "$(dirname "$0")/bench_common.sh"
need_bin
bench_tmp fleet_stated_bench
start_redis "$TMP"

for i in $(seq "$ITEMS"); do
    echo "{\"n\": $i, \"max_tokens\": $((10 + i % 5 * 8)), \"prompt\": \"$(printf 'word %.0s' $(seq $((i % 7 * 4 + 1))))\"}"
done >"$TMP/items.jsonl"

# $1 the stated policy's --limit, $2 the dialect: starts a sim; sets URL
# and SIM_PID.
start_sim() {
    start_sim_with --limit 100/1s --limit "$1" --dialect "$2" \
        --concurrency 100 --latency 5ms..30ms --credits 1000000000
}

printf '%-8s %-9s %-6s %7s %7s %6s %5s %9s\n' policy dialect how wall_s ideal_s ratio 429s most
run=0
for policy in $POLICIES; do
    case $policy in
        window) limit=30/2s; extra=(); dialects=$DIALECTS ;;
        # Only the IETF fields state a token policy's window; OpenAI's and
        # Anthropic's state none, and a quota without one is per minute.
        tokens) limit=600/1s,tokens; extra=(--cost "max_tokens + chars(prompt)/4" --json-body)
            dialects=ietf ;;
    esac
    hows="fleet alone"
    [ "$policy" = tokens ] && hows="fleet alone fleet+other"
    for dialect in $dialects; do
        for how in $hows; do
            run=$((run + 1))
            start_sim "$limit" "$dialect"
            url=$URL
            dir="$TMP/run$run"
            mkdir -p "$dir"
            start=$(date +%s.%N)
            if [ "$how" != alone ]; then
                other=""
                if [ "$how" = fleet+other ]; then
                    cp "$TMP/items.jsonl" "$dir/other.jsonl"
                    BATCHRUN_API_KEY=k "$BIN" "$dir/other.jsonl" --url "$url/v1/echo" \
                        --limit 100/1s -c 2 "${extra[@]}" --json \
                        --state-dir "$dir/other-state" >"$dir/out3.json" 2>"$dir/err3" &
                    other=$!
                fi
                run_fleet_pair "$dir" "bench$run" --url "$url/v1/echo" \
                    --limit 100/1s -c "$CONC" "${extra[@]}"
                if [ -n "$other" ]; then wait "$other" || true; fi
            else
                cp "$TMP/items.jsonl" "$dir/items.jsonl"
                BATCHRUN_API_KEY=k "$BIN" "$dir/items.jsonl" --url "$url/v1/echo" \
                    --limit 100/1s -c $((CONC * 2)) "${extra[@]}" --json \
                    --state-dir "$dir/state" >"$dir/out1.json" 2>"$dir/err1" || true
            fi
            end=$(date +%s.%N)
            limited=$(cat "$dir"/out*.json | python3 -c "
import json, sys
print(sum(json.loads(l).get('rate_limited', 0) for l in sys.stdin if l.startswith('{')))")
            curl -s "$url/admin/stats" >"$dir/stats.json"
            most=$(python3 -c "
import json
print(json.load(open('$dir/stats.json'))['policies'][1]['max_in_window'])")
            # The ideal: the first window at once, then the policy's pace
            # (for tokens, of what the sim charged).
            ideal=$(python3 -c "
import json
st = json.load(open('$dir/stats.json'))
if '$policy' == 'window':
    print(f'{($ITEMS - 30) / 15:.2f}')
else:
    print(f'{max(0, st[\"tokens_charged\"] - 600) / 600:.2f}')")
            wall=$(python3 -c "print(f'{$end - $start:.2f}')")
            ratio=$(python3 -c "print(f'{$wall / $ideal:.2f}x')")
            printf '%-8s %-9s %-6s %7s %7s %6s %5s %9s\n' "$policy" "$dialect" "$how" \
                "$wall" "$ideal" "$ratio" "$limited" "$most"
            kill "$SIM_PID" 2>/dev/null || true
            wait "$SIM_PID" 2>/dev/null || true
        done
    done
done
