#!/usr/bin/env bash
# batchrun against real nginx `limit_req`, the most common front door of an
# HTTP API (issue 19): nginx at rate=30r/s, once with `burst=5 nodelay` and
# once with no burst, answering 429 (`limit_req_status 429`), proxying to an
# unlimited `batchrun sim`. batchrun is told `--limit 30/1s -c 5` and runs
# 210 items with the default pacer and with `--pacer bucket`.
#
# Prints one row per (nginx config, pacer): wall time, the ideal time (the
# burst at once, then the rate), their ratio, and the 429s nginx answered
# (from its access log, so retries count).
#
#   examples/nginx_bench.sh                       # target/release/batchrun
#   BIN=/work/target-rel/release/batchrun examples/nginx_bench.sh
#   ITEMS=420 PACERS="window bucket spike" examples/nginx_bench.sh
#   PACERS="told window" examples/nginx_bench.sh   # told the burst too
#   CONC=10 examples/nginx_bench.sh                # -c 10 instead of -c 5
#   PACERS="fleet" examples/nginx_bench.sh         # two processes through Redis
#   PACERS="fleet-told" examples/nginx_bench.sh    # the same, told the burst
#   TOLD=90/1s PACERS="window fleet" examples/nginx_bench.sh  # a limit at a third
#   BURSTS=0 REPEAT=8 PACERS=fleet-told examples/nginx_bench.sh  # no burst only, 8 runs
#   STATUS=503 examples/nginx_bench.sh            # nginx's own default refusal
#
# `fleet`: two processes on one Redis key (`--shard i/2`, `-c $CONC` each),
# told the bare rate; needs redis-server on PATH (started here on a free
# port).
#
# Needs nginx (`apt-get install -y nginx`); runs it as the current user on
# loopback ports chosen here, with everything under a temporary directory.
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
ITEMS=${ITEMS:-210}
PACERS=${PACERS:-"window bucket"}
CONC=${CONC:-5}
BURSTS=${BURSTS:-"5 0"}
REPEAT=${REPEAT:-1}
TOLD=${TOLD:-30/1s}
RATE=30
# What nginx refuses with: 429 as configured for an API, or its default 503.
STATUS=${STATUS:-429}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}

[ -x "$BIN" ] || { echo "no batchrun at $BIN (cargo build --release, or set BIN)" >&2; exit 2; }
[ -x "$NGINX" ] || { echo "no nginx (apt-get install -y nginx)" >&2; exit 2; }

TMP=$(mktemp -d /tmp/nginx_bench.XXXXXX)
SIM_PID=""
NGINX_PID=""
REDIS_PID=""
cleanup() {
    [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null || true
    [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null || true
    [ -n "$SIM_PID" ] && kill "$SIM_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT

. "$(dirname "$0")/bench_common.sh"

# The unlimited sim behind nginx: it must never be what limits.
"$BIN" sim --listen 127.0.0.1:0 --model window --limit none --concurrency 1000 \
    --credits 1000000000 >"$TMP/sim.out" 2>"$TMP/sim.err" &
SIM_PID=$!
for _ in $(seq 100); do
    grep -q '^listening on' "$TMP/sim.out" 2>/dev/null && break
    sleep 0.05
done
SIM=$(sed -n 's/^listening on http:\/\///p' "$TMP/sim.out" | head -1)
[ -n "$SIM" ] || { echo "the sim did not start: $(cat "$TMP/sim.err")" >&2; exit 1; }

for i in $(seq "$ITEMS"); do echo "{\"n\": $i}"; done >"$TMP/items.jsonl"

# A Redis for the fleet rows only.
REDIS_URL=""
if [[ " $PACERS " == *" fleet"* ]]; then
    start_redis "$TMP"
    REDIS_URL="redis://127.0.0.1:$RPORT/0"
fi

# $1: the limit_req burst clause ("burst=5 nodelay" or "").
start_nginx() {
    local port=$1 clause=$2
    mkdir -p "$TMP/nginx"
    : >"$TMP/nginx/access.log"
    cat >"$TMP/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections 1024; }
http {
    # combined's first fields (the status is the ninth), then when (ms).
    log_format timed '\$remote_addr - \$remote_user [\$time_local] "\$request" \$status \$body_bytes_sent \$msec';
    access_log $TMP/nginx/access.log timed;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    limit_req_zone \$binary_remote_addr zone=api:1m rate=${RATE}r/s;
    upstream sim { server $SIM; keepalive 16; }
    server {
        listen 127.0.0.1:$port;
        location / {
            limit_req zone=api $clause;
            limit_req_status $STATUS;
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
    # As root nginx would switch its worker to `nobody`; stay who we are.
    if [ "$(id -u)" = 0 ]; then sed -i '1i user root;' "$TMP/nginx/nginx.conf"; fi
    "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;' \
        2>>"$TMP/nginx/stderr" &
    NGINX_PID=$!
    for _ in $(seq 100); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" \
            2>/dev/null && return 0
        sleep 0.05
    done
    echo "nginx did not start: $(cat "$TMP/nginx/stderr" "$TMP/nginx/error.log")" >&2
    exit 1
}

stop_nginx() {
    kill "$NGINX_PID" 2>/dev/null || true
    wait "$NGINX_PID" 2>/dev/null || true
    NGINX_PID=""
}

printf '%-22s %-10s %8s %8s %6s %5s %5s\n' "nginx" "pacer" "wall_s" "ideal_s" "ratio" "${STATUS}s" "exit"
run=0
for burst in $BURSTS; do
    if [ "$burst" = 0 ]; then clause=""; name="rate=30r/s, no burst"; else
        clause="burst=$burst nodelay"; name="rate=30r/s, burst=$burst"; fi
    # The ideal: the burst and one at once, then the rate.
    ideal=$(python3 -c "print(f'{max(0, $ITEMS - $burst - 1) / $RATE:.2f}')")
    for pacer in $(for _ in $(seq "$REPEAT"); do echo $PACERS; done); do
        run=$((run + 1))
        port=$(free_port)
        # A fresh nginx per run: its zone starts empty, as for a new client.
        start_nginx "$port" "$clause"
        t0=$(date +%s.%N)
        set +e
        # `told`: the default pacer told nginx's shape, `30/1s,burst=B`.
        limit=$TOLD; kind=$pacer
        # `fleet-told`: the fleet told it likewise.
        if [ "$pacer" = told ]; then limit="30/1s,burst=$burst"; kind=window; fi
        if [ "$pacer" = fleet-told ]; then limit="30/1s,burst=$burst"; fi
        if [ "$pacer" = fleet ] || [ "$pacer" = fleet-told ]; then
            mkdir -p "$TMP/fleet-$run"
            cp "$TMP/items.jsonl" "$TMP/fleet-$run/items.jsonl"
            shards=()
            for i in 1 2; do
                BATCHRUN_API_KEY=bench "$BIN" "$TMP/fleet-$run/items.jsonl" \
                    --url "http://127.0.0.1:$port/v1/echo?n={n}" \
                    --limit "$limit" -c "$CONC" --quiet \
                    --redis "$REDIS_URL" --fleet-key "nginx$run" --shard "$i/2" \
                    --state-dir "$TMP/fleet-$run/state" \
                    >"$TMP/run-$run-$i.out" 2>"$TMP/run-$run-$i.err" &
                shards+=($!)
            done
            code=0
            for p in "${shards[@]}"; do wait "$p" || code=$?; done
        else
            BATCHRUN_API_KEY=bench "$BIN" "$TMP/items.jsonl" \
                --url "http://127.0.0.1:$port/v1/echo?n={n}" \
                --limit "$limit" -c "$CONC" --pacer "$kind" --quiet \
                --state-dir "$TMP/state-$run" --out "$TMP/out-$run.jsonl" \
                --failures "$TMP/failures-$run.jsonl" >"$TMP/run-$run.out" 2>"$TMP/run-$run.err"
            code=$?
        fi
        set -e
        t1=$(date +%s.%N)
        stop_nginx
        refused=$(awk -v s="$STATUS" '$9 == s' "$TMP/nginx/access.log" | wc -l)
        # KEEP=1: each run's access log stays, its last field the arrival.
        [ -n "${KEEP:-}" ] && cp "$TMP/nginx/access.log" "$TMP/access-$run.log"
        python3 - "$name" "$pacer" "$t0" "$t1" "$ideal" "$refused" "$code" <<'EOF'
import sys
name, pacer, t0, t1, ideal, refused, code = sys.argv[1:]
wall = float(t1) - float(t0)
print(f"{name:<22} {pacer:<10} {wall:8.2f} {float(ideal):8.2f} {wall / float(ideal):5.2f}x {refused:>5} {code:>5}")
EOF
    done
done
