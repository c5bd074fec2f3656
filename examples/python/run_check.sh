#!/usr/bin/env bash
# End-to-end check of the Python client and worker against a private palisade (`palisade dev`).
# Uses its own database (palisade_pycheck) and subject prefix (pycheck); drops/deletes both at the end.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-$HOME/.cache/pycheck-venv}
PY=$VENV/bin/python
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/palisade-target}
PAL=$CARGO_TARGET_DIR/debug/palisade
DB=${PYCHECK_DB:-palisade_pycheck}
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/$DB
export PALISADE_SUBJECT_PREFIX=${PALISADE_SUBJECT_PREFIX:-pycheck}
export NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
# Short leases so the lease_lost / expiry part of the check takes seconds, not minutes.
export PALISADE_LEASE_TTL_MS=6000 PALISADE_RENEW_INTERVAL_MS=2000
LOGS=${LOGS:-/tmp/pycheck-logs}
RUN=$(date +%s)              # makes idempotency keys (and so Nats-Msg-Ids) unique per run
mkdir -p "$LOGS"; rm -f "$LOGS"/*.log
PASS=0; FAIL=0
ok()   { echo "PASS: $*"; PASS=$((PASS+1)); }
bad()  { echo "FAIL: $*"; FAIL=$((FAIL+1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
wait_for() { # file pattern timeout-seconds [min-count]
  local n=0 want=${4:-1}
  while [ "$( (grep -c -- "$2" "$1" 2>/dev/null) || true)" -lt "$want" ] 2>/dev/null || [ ! -e "$1" ]; do
    sleep 0.25; n=$((n+1)); [ $n -ge $(($3*4)) ] && return 1
  done
  return 0
}
jfield() { "$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2]) or "")' "$1" "$2"; }
delete_streams() {
  (cd "$HERE" && "$PY" - <<'EOF'
import asyncio, os, nats
async def main():
    nc = await nats.connect(os.environ["NATS_URL"].split(",")); js = nc.jetstream()
    p = os.environ["PALISADE_SUBJECT_PREFIX"].replace("-", "_").upper()
    for s in ("REQUESTS", "EVENTS", "RESULTS"):
        try: await js.delete_stream(f"{p}_{s}")
        except Exception: pass
    await nc.close()
asyncio.run(main())
EOF
  )
}
DEV_PID=""; WORKER_PID=""; SLOW_PID=""
cleanup() {
  for p in $SLOW_PID $WORKER_PID $DEV_PID; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" test >/dev/null 2>&1
  delete_streams
}
trap cleanup EXIT

# -- 0. Python environment and generated code ------------------------------------------------
if [ ! -x "$PY" ]; then python3.11 -m venv "$VENV" && "$VENV/bin/pip" install -q nats-py nkeys protobuf grpcio-tools; fi
"$PY" -m grpc_tools.protoc -I "$ROOT/shared/messages/proto/palisade/v1" --python_out="$HERE" palisade.proto || exit 1
cd "$HERE"

# -- 1. build and start palisade -------------------------------------------------------------
(cd "$ROOT" && cargo build -q -p palisade) || exit 1
psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" test >/dev/null 2>&1
delete_streams
"$PAL" dev --workers 0 >"$LOGS/dev.log" 2>&1 & DEV_PID=$!
wait_for "$LOGS/dev.log" 'organization `dev`' 60 || { echo "palisade dev did not start"; tail "$LOGS/dev.log"; exit 1; }
ORG=$(sed -n 's/^organization `dev`: \([0-9a-f-]*\).*/\1/p' "$LOGS/dev.log")
echo "organization: $ORG"
WID=$("$PAL" worker add --name py --capacity 2) || exit 1
"$PAL" worker assign --worker "$WID" --org "$ORG" || exit 1
echo "worker: $WID"

check "client selftest (reference test vectors)" "$PY" client.py selftest >"$LOGS/selftest.log"

start_worker() { # log-name extra-args...
  local name=$1; shift
  PALISADE_WORKER_ID=$WID "$PY" worker.py --wait-ms 5000 "$@" >>"$LOGS/$name.log" 2>&1 & WORKER_PID=$!
  wait_for "$LOGS/$name.log" '"hello_ok"' 20 || { echo "worker hello failed"; cat "$LOGS/$name.log"; exit 1; }
}
start_worker worker --demo --findings-per-batch 2

# -- 2. scan A: py_echo over JetStream ---------------------------------------------------------
TA=http://py.example/a-$RUN
"$PY" client.py submit --org "$ORG" --target "$TA" --plugins py_echo --key "a-$RUN" --path js \
  --timeout 60 >"$LOGS/scanA.log"
RA=$(tail -1 "$LOGS/scanA.log"); SA=$(jfield "$RA" scan_id); echo "scan A: $RA"
check "scan A (py_echo, JetStream path) completed" grep -q '"outcome": "completed"' <<<"$RA"
check "scan A PubAck not duplicate" grep -q '"event": "puback".*"duplicate": false' "$LOGS/scanA.log"

# -- 3. scan B: py_echo then py_echo2 over request/reply ---------------------------------------
TB=http://py.example/b-$RUN
"$PY" client.py submit --org "$ORG" --target "$TB" --plugins py_echo,py_echo2 --key "b-$RUN" --path rr \
  --timeout 60 >"$LOGS/scanB.log"
RB=$(tail -1 "$LOGS/scanB.log"); SB=$(jfield "$RB" scan_id); echo "scan B: $RB"
check "scan B (py_echo,py_echo2, request/reply path) completed" grep -q '"outcome": "completed"' <<<"$RB"
check "py_echo2 lease carried the discovered asset" \
  grep -q '"plugin": "py_echo2".*"discovered_assets": \[\["http_service", "'"$TB"'"\]\]' "$LOGS/worker.log"
echo "--- palisade scan show A"; "$PAL" scan show "$SA" | tee "$LOGS/showA.log"
echo "--- palisade scan show B"; "$PAL" scan show "$SB" | tee "$LOGS/showB.log"
check "scan show A: completed with 3 findings" grep -q '^3 findings' "$LOGS/showA.log"
check "scan show B: py_echo2 finding present" grep -q 'py-echo2-asset' "$LOGS/showB.log"

# -- 4. worker-side probes (logged by worker --demo) --------------------------------------------
grep '"event": "probe"' "$LOGS/worker.log" | sed 's/^/  /'
check "acquire replay with same request_id returns same lease" grep -q '"name": "acquire replay with same request_id".*"ok": true' "$LOGS/worker.log"
check "batch_missing answered and recovered" grep -q '"event": "batch_missing".*"missing": \[1\]' "$LOGS/worker.log"
check "replayed batch -> duplicate=true" grep -q '"name": "replayed batch".*"ok": true' "$LOGS/worker.log"
check "same key, other checksum -> batch_conflict" grep -q '"name": "same key, other checksum".*"ok": true' "$LOGS/worker.log"
check "replayed completion -> duplicate=true" grep -q '"name": "replayed completion".*"ok": true' "$LOGS/worker.log"
check "batch/renew/release after completion -> lease_lost" \
  test "$(grep -c '"name": "\(new batch\|renew\|release\) after completion".*"ok": true' "$LOGS/worker.log")" -ge 3
check "no probe failed" bash -c "! grep -q '\"event\": \"probe\".*\"ok\": false' '$LOGS/worker.log'"

# -- 5. client-side idempotency ---------------------------------------------------------------
"$PY" client.py submit --org "$ORG" --target "$TB" --plugins py_echo,py_echo2 --key "b-$RUN" --path rr \
  --timeout 5 >"$LOGS/replayB.log"; tail -1 "$LOGS/replayB.log"
check "request/reply replay -> deduplicated=true, state completed" \
  grep -q '"deduplicated": true, "state": "completed"' "$LOGS/replayB.log"
"$PY" client.py submit --org "$ORG" --target "$TB/other" --plugins py_echo --key "b-$RUN" --path rr \
  --timeout 5 >"$LOGS/conflictB.log"; tail -1 "$LOGS/conflictB.log"
check "request/reply same key, other request -> idempotency_conflict" \
  grep -q '"outcome": "refused", "error": {"code": "idempotency_conflict"' "$LOGS/conflictB.log"
"$PY" client.py submit --org "$ORG" --target "$TA/other" --plugins py_echo --key "a-$RUN" --path js \
  --timeout 20 >"$LOGS/conflictA.log"; tail -1 "$LOGS/conflictA.log"
check "JetStream same key, other request -> scan.rejected idempotency_conflict" \
  grep -q '"outcome": "rejected", "error": {"code": "idempotency_conflict"' "$LOGS/conflictA.log"
"$PY" client.py submit --org "$ORG" --target "$TA" --plugins py_echo --key "a-$RUN" --path js \
  --timeout 3 >"$LOGS/replayA.log"; tail -2 "$LOGS/replayA.log"
check "JetStream exact replay within 2 min -> PubAck duplicate=true, no event" \
  grep -q '"event": "puback".*"duplicate": true' "$LOGS/replayA.log"

# -- 6. lease lost (worker frozen past its lease), then release on shutdown --------------------
TC=http://py.example/c-$RUN
"$PY" client.py submit --org "$ORG" --target "$TC" --plugins py_slow --key "c-$RUN" --path js \
  --watch-tasks --timeout 120 >"$LOGS/scanC.log" & SLOW_PID=$!
wait_for "$LOGS/worker.log" '"event": "lease".*"plugin": "py_slow"' 20 || bad "py_slow leased"
kill -STOP "$WORKER_PID"; echo "worker frozen for 9 s (lease TTL 6 s)"; sleep 9; kill -CONT "$WORKER_PID"
wait_for "$LOGS/worker.log" '"attempt_stopped_lease_lost"' 20 && ok "frozen worker stopped its attempt after lease loss" \
  || bad "frozen worker stopped its attempt after lease loss"
grep -E '"(renew_stop|lease_presumed_lost|attempt_stopped_lease_lost)"' "$LOGS/worker.log" | sed 's/^/  /'
wait_for "$LOGS/worker.log" '"event": "lease".*"plugin": "py_slow"' 30 2 && ok "py_slow re-leased after expiry (attempt 2)" \
  || bad "py_slow re-leased after expiry"
sleep 1
kill -TERM "$WORKER_PID"; wait "$WORKER_PID"; WORKER_PID=""
grep -E '"event": "(signal|stopping|release|stopped)"' "$LOGS/worker.log" | sed 's/^/  /'
check "release on shutdown answered without error" grep -q '"event": "release", "attempt_id": "[0-9a-f-]*", "error": null' "$LOGS/worker.log"
PY_SLOW_SECONDS=1 start_worker worker2
wait "$SLOW_PID"; SLOW_PID=""
RC=$(tail -1 "$LOGS/scanC.log"); SC=$(jfield "$RC" scan_id); echo "scan C: $RC"
grep -E '"event": "task\.' "$LOGS/scanC.log" | sed 's/^/  /'
check "scan C (py_slow: expired, released, re-run) completed" grep -q '"outcome": "completed"' <<<"$RC"
check "expiry reported as task.failed lease_expired will_retry" grep -q '"event": "task.failed".*"will_retry": true.*lease_expired' "$LOGS/scanC.log"
echo "--- palisade scan show C"; "$PAL" scan show "$SC"

echo
echo "passed $PASS, failed $FAIL (logs in $LOGS)"
[ "$FAIL" -eq 0 ]
