#!/usr/bin/env bash
# The README's report picture (docs/report.png): a 10-minute run against
# `batchrun sim` told two limits (25/1s and 1100/1m) where the sim keeps
# 20/1s; live traffic on the same key fills the sim's window twice (429s
# and pauses), and the credits run out near the end (a credit halt). Then
# `batchrun report` and a headless Chromium screenshot of the page.
#
#   cargo build --release && examples/report_shot.sh [OUT.png]
#
# Needs Debian's chromium (apt-get install chromium). Takes about 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/batchrun}
OUT=${1:-docs/report.png}
WORK=$(mktemp -d)
PORT=${PORT:-18787}
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

"$BIN" sim --listen 127.0.0.1:$PORT --limit 20/1s --cooldown 1s \
  --latency 20ms..60ms --credits 10400 --renewal-in 20d >"$WORK/sim.log" 2>&1 &
sleep 1
python3 -c "
import json
with open('$WORK/backfill.jsonl', 'w') as f:
    for n in range(1, 12001):
        f.write(json.dumps({'n': n}) + '\n')
"
live() {
  # Another client on the same key: 20 calls at once fill the sim's window.
  sleep "$1"
  for i in $(seq 1 20); do
    curl -s -o /dev/null -H 'x-api-key: shot' "http://127.0.0.1:$PORT/v1/echo?live=$i" &
  done
  wait
}
live 120 & live 330 &
BATCHRUN_API_KEY=shot "$BIN" "$WORK/backfill.jsonl" \
  --url "http://127.0.0.1:$PORT/v1/echo" --json-body \
  --limit 25/1s --limit 1100/1m -c 5 --quiet >"$WORK/results.txt" 2>"$WORK/run.log" || echo "run exit code $?"
tail -3 "$WORK/run.log"
"$BIN" report "$WORK/backfill.jsonl"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --window-size=1180,1700 --screenshot="$OUT" "file://$WORK/backfill.report.html" 2>/dev/null
echo "wrote $OUT (work files in $WORK)"
