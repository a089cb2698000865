# Shared by the shell benchmarks in examples/ (sourced, not run): a free
# loopback port, a throwaway Redis and a pair of fleet processes for the
# fleet's rows.

# A temporary directory TMP for bench $1, removed at exit (unless KEEP is
# set), and PIDS, the processes to stop then.
bench_tmp() {
    TMP=$(mktemp -d "/tmp/$1.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
}

bench_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$TMP"
}

# Prints a TCP port free on 127.0.0.1 now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Stops the bench unless $BIN is a batchrun to run.
need_bin() {
    [ -x "$BIN" ] || { echo "no batchrun at $BIN (cargo build --release, or set BIN)" >&2; exit 2; }
}

# Starts redis-server on a free loopback port with nothing kept on disk,
# its files under $1; sets RPORT and REDIS_PID (also in PIDS, stopped at
# exit) and waits until it answers.
start_redis() {
    command -v redis-server >/dev/null || { echo "no redis-server on PATH" >&2; exit 2; }
    RPORT=$(free_port)
    redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$1" >"$1/redis.log" 2>&1 &
    REDIS_PID=$!
    PIDS+=("$REDIS_PID")
    for _ in $(seq 100); do
        redis-cli -p "$RPORT" ping >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "redis-server did not start: $(cat "$1/redis.log")" >&2
    exit 1
}

# Starts `$BIN sim` (or `$SIM_BIN sim`, to judge an older client against
# today's sim) on a free loopback port with the options given, its output
# under $TMP; sets SIM_PID (also in PIDS) and URL once it listens.
start_sim_with() {
    "${SIM_BIN:-$BIN}" sim --listen 127.0.0.1:0 "$@" >"$TMP/sim.out" 2>"$TMP/sim.err" &
    SIM_PID=$!
    PIDS+=("$SIM_PID")
    for _ in $(seq 100); do
        grep -q '^listening on' "$TMP/sim.out" 2>/dev/null && break
        sleep 0.05
    done
    URL="http://$(sed -n 's/^listening on http:\/\///p' "$TMP/sim.out" | head -1)"
}

# Runs `$BIN` as two fleet processes (`--shard 1/2` and `2/2`) on the
# Redis of start_redis, on a fresh copy of $TMP/items.jsonl in $1, under
# fleet key $2, each with the rest of the arguments and `--json`; their
# summaries go to $1/out1.json and $1/out2.json, their stderr to $1/err1
# and $1/err2. Sets START (when they began) and returns once both ended.
run_fleet_pair() {
    local dir=$1 key=$2 i p
    shift 2
    mkdir -p "$dir"
    cp "$TMP/items.jsonl" "$dir/items.jsonl"
    START=$(date +%s.%N)
    local shards=()
    for i in 1 2; do
        BATCHRUN_API_KEY=sk-bench-fleet-key "$BIN" "$dir/items.jsonl" "$@" --json \
            --redis "redis://127.0.0.1:$RPORT/0" --fleet-key "$key" \
            --shard "$i/2" --state-dir "$dir/state" >"$dir/out$i.json" 2>"$dir/err$i" &
        shards+=($!)
    done
    for p in "${shards[@]}"; do wait "$p" || true; done
}
