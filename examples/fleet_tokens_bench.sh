#!/usr/bin/env bash
# The token budget of `shapes_bench` (issue 19), run by a fleet: two
# processes on one Redis key (`--shard i/2`, `-c 5` each), each told
# `--limit 1000/1s --limit 3000/1s,tokens` with the cost estimated from the
# item (`max_tokens + chars(prompt)/4`) and corrected from each answer's
# usage, against `batchrun sim` keeping the same and charging what each
# answer says was used (latency 5-30 ms).
#
# Prints one row per run: the tokens the sim charged, the most it counted
# in any 1 s (never over 3000 is the bar), 429s, and the wall time against
# the ideal (within 1.15x is the bar): the sim keeps the budget as a
# sliding window, so the fastest is a budget at once each second,
# ceil(charged / 3000) - 1 seconds; and against the smooth rate after the
# first second, (charged - 3000) / 3000, which only a whole number of
# budgets reaches.
#
#   examples/fleet_tokens_bench.sh                 # target/release/batchrun
#   REPEAT=3 CALLS=600 BIN=/path/to/older/batchrun examples/fleet_tokens_bench.sh
#
# Needs redis-server on PATH; runs it on a free loopback port under a
# temporary directory.
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
CALLS=${CALLS:-600}
CONC=${CONC:-5}
REPEAT=${REPEAT:-1}
BUDGET=3000

. "$(dirname "$0")/bench_common.sh"
need_bin
bench_tmp fleet_tokens_bench
start_redis "$TMP"

# The items of shapes_bench's token budget: prompts of 4-52 words,
# max_tokens 20-100.
python3 - "$CALLS" >"$TMP/items.jsonl" <<'EOF'
import sys
for i in range(1, int(sys.argv[1]) + 1):
    prompt = "word " * ((i % 7) * 8 + 4)
    print('{"n": %d, "max_tokens": %d, "prompt": "%s"}' % (i, 20 + (i % 5) * 20, prompt))
EOF

printf '%-7s %6s %9s %5s %7s %7s %6s %8s %6s\n' charged most of 429s wall_s ideal_s ratio smooth_s ratio
for run in $(seq "$REPEAT"); do
    start_sim_with --limit 1000/1s --limit "$BUDGET/1s,tokens" --latency 5ms..30ms \
        --concurrency 1000 --credits 1000000000
    dir="$TMP/run$run"
    run_fleet_pair "$dir" "tokens$run" --url "$URL/v1/echo?n={n}" \
        --limit 1000/1s --limit "$BUDGET/1s,tokens" \
        --cost 'max_tokens + chars(prompt)/4' --json-body -c "$CONC"
    start=$START
    end=$(date +%s.%N)
    python3 -c "
import urllib.request
print(urllib.request.urlopen('$URL/admin/stats').read().decode())" >"$dir/stats.json"
    kill "$SIM_PID" 2>/dev/null || true
    wait "$SIM_PID" 2>/dev/null || true
    python3 - "$dir" "$start" "$end" "$BUDGET" <<'EOF'
import json, math, sys
d, t0, t1, budget = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
stats = json.load(open(f"{d}/stats.json"))
charged = stats["tokens_charged"]
most = stats["policies"][1]["max_in_window"]
limited = sum(json.loads(l).get("rate_limited", 0)
              for f in ("out1.json", "out2.json") for l in open(f"{d}/{f}") if l.startswith("{"))
ideal = max(math.ceil(charged / budget) - 1, 1)
smooth = max(charged - budget, 1) / budget
wall = t1 - t0
print(f"{charged:<7} {most:>6} {budget:>9} {limited:>5} {wall:7.2f} {ideal:7.2f} {wall / ideal:5.2f}x"
      f" {smooth:8.2f} {wall / smooth:5.2f}x")
EOF
done
