#!/usr/bin/env bash
# An outage in the middle of a run: a small server answers 200 except from
# FROM to TO seconds after its first call, when it refuses everything with
# STATUS (429, or 503 with nginx's own page, as nginx's `return 503` or an
# ingress with no backend serves it), with no Retry-After. batchrun is told
# `--limit 20/1s -c 5` and runs ITEMS items. Prints the wall time, the
# ideal (the items at 20 a second, plus the outage), the refusals the
# server answered, the items failed and the exit code.
#
#   examples/outage_bench.sh                          # target/release/batchrun
#   STATUS=503 examples/outage_bench.sh
#   FROM=2 TO=32 examples/outage_bench.sh             # a half-minute outage
#   BIN=/tmp/before/batchrun examples/outage_bench.sh # another build
set -euo pipefail

BIN=${BIN:-target/release/batchrun}
ITEMS=${ITEMS:-300}
STATUS=${STATUS:-429}
FROM=${FROM:-2}
TO=${TO:-6}

. "$(dirname "$0")/bench_common.sh"
need_bin
bench_tmp outage_bench

PORT=$(free_port)
cat >"$TMP/server.py" <<'EOF'
import http.server, json, socketserver, sys, threading, time
port, status, start, end = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
PAGE = (b"<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n"
        b"<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n"
        b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
first, lock, refused = [None], threading.Lock(), [0]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        now = time.time()
        with lock:
            if first[0] is None: first[0] = now
            t = now - first[0]
            out = start <= t < end
            if out: refused[0] += 1
        if out:
            body, code, kind = (PAGE, 503, "text/html") if status == 503 else (b'{"error":"unavailable"}', status, "application/json")
        else:
            body, code, kind = json.dumps({"ok": True}).encode(), 200, "application/json"
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_HEAD(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", port), H)
threading.Thread(target=s.serve_forever, daemon=True).start()
open(sys.argv[5], "w").write("up\n")
while True:
    time.sleep(0.2)
    with open(sys.argv[5], "w") as f: f.write(f"{refused[0]}\n")
EOF
python3 "$TMP/server.py" "$PORT" "$STATUS" "$FROM" "$TO" "$TMP/refused" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$TMP/refused" ] && break; sleep 0.05; done

for i in $(seq "$ITEMS"); do echo "{\"n\": $i}"; done >"$TMP/items.jsonl"
t0=$(date +%s.%N)
set +e
BATCHRUN_API_KEY=bench "$BIN" "$TMP/items.jsonl" --url "http://127.0.0.1:$PORT/x?n={n}" \
    --limit 20/1s -c 5 --quiet --json --state-dir "$TMP/state" \
    --out "$TMP/out.jsonl" --failures "$TMP/failures.jsonl" >"$TMP/summary.json" 2>"$TMP/run.err"
code=$?
set -e
t1=$(date +%s.%N)
sleep 0.3
python3 - "$t0" "$t1" "$ITEMS" "$FROM" "$TO" "$STATUS" "$code" "$TMP/refused" "$TMP/summary.json" <<'EOF'
import json, sys
t0, t1, items, start, end, status, code, refused, summary = sys.argv[1:]
wall = float(t1) - float(t0)
ideal = int(items) / 20 + (float(end) - float(start))
failed = json.load(open(summary)).get("failed", "?")
print(f"{'status':>6} {'outage_s':>8} {'wall_s':>7} {'ideal_s':>7} {'ratio':>6} {'refused':>7} {'failed':>6} {'exit':>4}")
print(f"{status:>6} {float(end) - float(start):8.0f} {wall:7.2f} {ideal:7.2f} {wall / ideal:5.2f}x "
      f"{open(refused).read().strip():>7} {failed:>6} {code:>4}")
EOF
