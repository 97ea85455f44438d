#!/bin/bash
# redisstall.sh N OUT [STALL_MS]: N rounds, the order rotated, of
# $BIN/sluice.old and $BIN/sluice.new as `sluice relay --redis`
# (bench-redis.yaml) under `sluice-load publish -conns 256 -events 16000`,
# while a loop pauses (SIGSTOP, then SIGCONT STALL_MS later, default 150)
# every 0.7 s, from 1 s into the run:
#   both   the server and redis-server together: the machine stalled, as a
#          VM whose time is stolen does; Redis answers all it is sent
#   redis  redis-server alone: Redis slow, the gate running
# Each run a fresh redis-server and server (pinned to CPU 1, the load tool
# to CPU 0). One line per run in OUT:
#   round server paused stall_ms events/s ok_true unavailable stalls_total other connected sent
# unavailable counts every answer that starts "error:" (the limiter's
# "error: rate limiter unavailable" is the only one this load draws).
# stalls_total is the server's sluice_store_stalls_total at the end; other
# counts the EVENTs sent that got neither OK true nor an "error:" answer;
# connected is how many of the 256 connections were upgraded (one refused
# while Redis was paused sends none of its EVENTs) and sent how many
# EVENTs went out.
# BIN (default /tmp/lt) holds sluice-load as "load" and the two binaries.
set -e
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-/tmp/lt}
n=$1 out=$2 stall=${3:-150}
run() { # run ROUND SERVER PAUSED
  local rport=$((19000 + RANDOM % 500)) port=$((17000 + RANDOM % 2000)) d pid rpid lp pz mport
  mport=$((port + 3000)) # 20000-21999: clear of the servers and of Redis
  redis-server --port $rport --save "" --appendonly no >/dev/null 2>&1 &
  rpid=$!
  sleep 0.3
  d=$(mktemp -d)
  taskset -c 1 "$BIN/sluice.$2" relay --config "$here/bench-redis.yaml" --redis redis://127.0.0.1:$rport/0 --listen 127.0.0.1:$port --data-dir "$d" --metrics-listen 127.0.0.1:$mport >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
  taskset -c 0 "$BIN/load" publish -conns 256 -events 16000 -url ws://127.0.0.1:$port -xff -json > "$d/load.json" 2>&1 &
  lp=$!
  local who=$rpid
  [ "$3" = both ] && who="$pid $rpid"
  (sleep 1; while kill -0 $lp 2>/dev/null; do
     kill -STOP $who; sleep "$(awk "BEGIN{print $stall/1000}")"; kill -CONT $who; sleep 0.7
   done) &
  pz=$!
  wait $lp || true
  kill $pz 2>/dev/null || true; wait $pz 2>/dev/null || true
  kill -CONT $pid $rpid 2>/dev/null || true
  local st
  st=$(curl -s 127.0.0.1:$mport/metrics | awk '/^sluice_store_stalls_total/{print $2}')
  python3 -c "import sys,json; j=json.load(open('$d/load.json')); r=j.get('prefixes',{}) or {}; print($1, '$2', '$3', $stall, round(j['rate_per_s']), j['ok_true'], r.get('error:',0), '${st:-0}', j['sent']-j['ok_true']-r.get('error:',0), j['connected'], j['sent'])"
  kill $pid $rpid 2>/dev/null || true; wait $pid $rpid 2>/dev/null || true; rm -rf "$d"
}
for r in $(seq "$n"); do
  case $((r % 2)) in 0) order="old new";; 1) order="new old";; esac
  for p in both redis; do
    for s in $order; do run $r $s $p; done
  done
done >> "$out"
