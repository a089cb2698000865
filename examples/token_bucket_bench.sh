#!/usr/bin/env bash
# A token quota stated as OpenAI and Anthropic state theirs (issue 19): a
# bucket of 20,000 tokens refilling continuously over a minute, its limit,
# what is left and when it is full again in the dialect's headers, with no
# window and no shape. batchrun is told only a rate of calls (or
# `--limit none`, or the bucket itself, the README's recipe) and paces the
# tokens to what the headers say.
#
# The job: 585 prompts of 50 tokens and an answer of at most 1 (charged
# about what each asks, as a server charging `max_tokens` at admission
# would be), 29,250 tokens in all: the bucket's 20,000 at once, the rest at
# its 333 a second, so 27.75 s is the ideal. A window of a minute sends the
# 20,000, then waits out the minute.
#
# Prints one row per run: dialect, what batchrun was told, tokens charged,
# 429s, wall time against the ideal, and the line saying the bucket was
# found (when it was).
#
#   examples/token_bucket_bench.sh                 # target/release/batchrun
#   REPEAT=3 BIN=/path/to/older/batchrun examples/token_bucket_bench.sh
#   LATENCY=500ms..1500ms CONC=40 examples/token_bucket_bench.sh   # an LLM's answers
#
# SPLIT=1: Anthropic's input and output buckets, stated apart (and
# `tokens`, the more restrictive of the two, beside them): 20,000 input
# and 3,000 output tokens a minute; prompts of 50 tokens and answers of at
# most 20 (about 10 charged). The ideal is the slower of the two buckets'
# refill times for what they were charged (from the answers' usage).
#
# FLEET=1: two processes on one Redis key (`--shard i/2`, `-c CONC`
# each) instead of one; the 429s are both processes'. TOLD_ONLY=1 runs
# only the row told the buckets.
#
#   SPLIT=1 FLEET=1 CALLS=400 examples/token_bucket_bench.sh
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
REPEAT=${REPEAT:-1}
LATENCY=${LATENCY:-20ms..60ms}
CONC=${CONC:-10}
CALLS=${CALLS:-585}
QUOTA=20000
SPLIT=${SPLIT:-}
FLEET=${FLEET:-}
TOLD_ONLY=${TOLD_ONLY:-}
OUT_QUOTA=3000

. "$(dirname "$0")/bench_common.sh"
need_bin
bench_tmp token_bucket_bench
if [ -n "$FLEET" ]; then
    start_redis "$TMP"
fi

if [ -n "$SPLIT" ]; then
    ANSWER=20
    DIALECTS="anthropic"
    SIM_TOKENS=(--limit "$QUOTA/1m,input-tokens,burst=$((QUOTA - 1))"
        --limit "$OUT_QUOTA/1m,output-tokens,burst=$((OUT_QUOTA - 1))")
    TOLD_BUCKET="--limit 500/1s --limit $QUOTA/1m,input-tokens,burst=$QUOTA --limit $OUT_QUOTA/1m,output-tokens,burst=$OUT_QUOTA"
else
    ANSWER=1
    DIALECTS="openai anthropic"
    SIM_TOKENS=(--limit "$QUOTA/1m,tokens,burst=$((QUOTA - 1))")
    TOLD_BUCKET="--limit 500/1s --limit $QUOTA/1m,tokens,burst=$QUOTA"
fi
TOLDS=("--limit 500/1s" "--limit none" "$TOLD_BUCKET")
[ -z "$TOLD_ONLY" ] || TOLDS=("$TOLD_BUCKET")

python3 - "$CALLS" "$ANSWER" >"$TMP/items.jsonl" <<'PY'
import sys
prompt = "word " * 40
for i in range(1, int(sys.argv[1]) + 1):
    print('{"n": %d, "max_tokens": %s, "prompt": "%s"}' % (i, sys.argv[2], prompt))
PY

printf '%-10s %-38s %7s %5s %7s %7s %6s  %s\n' dialect told charged 429s wall_s ideal_s ratio found
for run in $(seq "$REPEAT"); do
    for dialect in $DIALECTS; do
        for told in "${TOLDS[@]}"; do
            start_sim_with --limit 1000/1s "${SIM_TOKENS[@]}" \
                --dialect "$dialect" --latency "$LATENCY" --concurrency 1000 --credits 1000000000
            dir="$TMP/run$run-$dialect-$(echo "$told" | tr -c 'a-z0-9' _)"
            if [ -n "$FLEET" ]; then
                # shellcheck disable=SC2086
                run_fleet_pair "$dir" "tb-$run-$dialect-$RANDOM" --url "$URL/v1/echo?n={n}" $told \
                    --json-body -c "$CONC"
                start=$START
                cat "$dir/out1.json" "$dir/out2.json" >"$dir/out.json"
                cat "$dir/err1" "$dir/err2" >"$dir/err"
            else
                mkdir -p "$dir"
                cp "$TMP/items.jsonl" "$dir/items.jsonl"
                start=$(date +%s.%N)
                # shellcheck disable=SC2086
                BATCHRUN_API_KEY=sk-bench-token-key "$BIN" "$dir/items.jsonl" --url "$URL/v1/echo?n={n}" $told \
                    --json-body -c "$CONC" --json --state-dir "$dir/state" >"$dir/out.json" 2>"$dir/err" || true
            fi
            end=$(date +%s.%N)
            python3 -c "
import urllib.request
print(urllib.request.urlopen('$URL/admin/stats').read().decode())" >"$dir/stats.json"
            kill "$SIM_PID" 2>/dev/null || true
            wait "$SIM_PID" 2>/dev/null || true
            python3 - "$dir" "$start" "$end" "$QUOTA" "$dialect" "$told" "$SPLIT" "$OUT_QUOTA" <<'PY'
import glob, json, sys
d, t0, t1, quota, dialect, told, split, out_quota = sys.argv[1:9]
quota, out_quota = int(quota), int(out_quota)
stats = json.load(open(f"{d}/stats.json"))
charged = stats["tokens_charged"]
summary = [json.loads(l) for l in open(f"{d}/out.json") if l.startswith("{")]
# One summary per process (two in a fleet), the last line of each run.
ends = [s for s in summary if "rate_limited" in s]
limited = sum(s["rate_limited"] for s in ends) if ends else "?"
if split:
    usage = [json.loads(l)["body"]["usage"]
             for f in glob.glob(f"{d}/items*.results.jsonl") for l in open(f)]
    spent = sum(u["input_tokens"] for u in usage), sum(u["output_tokens"] for u in usage)
    ideal = max(max(c - q, 0) / (q / 60) for c, q in zip(spent, (quota, out_quota)))
else:
    ideal = max(charged - quota, 0) / (quota / 60)
wall = float(t1) - float(t0)
found = "yes" if "refills continuously" in open(f"{d}/err").read() else "-"
print(f"{dialect:<10} {told:<38} {charged:>7} {limited:>5} {wall:7.2f} {ideal:7.2f} {(wall / ideal if ideal else float('inf')):5.2f}x  {found}")
PY
        done
    done
done
