#!/bin/bash
# redisrounds.sh N OUT: N rounds, the order rotated every round, of plain
# khatru (sluice-load khatru) and of $BIN/sluice.old and $BIN/sluice.new as
# `sluice relay --redis` (bench-redis.yaml: the quota on) on one
# redis-server of this script's, each run a fresh server process pinned to
# CPU 1 and the load tool to CPU 0; publish at 8, 64 and 256 connections,
# then, per sluice binary, publish at 8 connections with Redis's replies
# 5 ms late (delayproxy). One line per run in OUT:
#   round conns server delay_ms events/s p50_ms p99_ms ok_true unavailable server_ticks redis_ticks
# the last two the CPU (user + system, in clock ticks of /proc/PID/stat)
# the server process and redis-server spent during the load run.
# BIN (default /tmp/lt) holds sluice-load as "load", the sluice binaries and
# delayproxy (go build -o $BIN/delayproxy docs/bench/delayproxy/main.go).
# REDIS_CPU, when set, pins redis-server to that CPU (0: beside the load
# tool, so that the sluice server has CPU 1 to itself as plain khatru has;
# unset: the kernel places it, often on the server's CPU).
set -e
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-/tmp/lt}
n=$1 out=$2
rport=$((19000 + RANDOM % 500))
${REDIS_CPU:+taskset -c $REDIS_CPU} redis-server --port $rport --save "" --appendonly no >/dev/null 2>&1 &
rpid=$!
dport=$((rport + 500))
"$BIN/delayproxy" -target 127.0.0.1:$rport -listen 127.0.0.1:$dport -d 5ms &
dpid=$!
trap 'kill $rpid $dpid 2>/dev/null' EXIT
sleep 0.5
run() { # run ROUND CONNS SERVER REDISPORT DELAY
  local port=$((17000 + RANDOM % 2000)) d pid
  d=$(mktemp -d)
  case $3 in
    khatru) taskset -c 1 "$BIN/load" khatru -listen 127.0.0.1:$port -data "$d" >/dev/null 2>&1 & ;;
    *) taskset -c 1 "$BIN/sluice.$3" relay --config "$here/bench-redis.yaml" --redis redis://127.0.0.1:$4/0 --listen 127.0.0.1:$port --data-dir "$d" --metrics-listen "" >/dev/null 2>&1 & ;;
  esac
  pid=$!
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
  local c0 r0 j
  ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; } # 0 once the process is gone
  c0=$(ticks $pid)
  r0=$(ticks $rpid)
  j=$(taskset -c 0 "$BIN/load" publish -conns $2 -events 16000 -url ws://127.0.0.1:$port -xff -json 2>&1)
  c0=$(( $(ticks $pid) - c0 ))
  r0=$(( $(ticks $rpid) - r0 ))
  echo "$j" | python3 -c "import sys,json; j=json.loads(sys.stdin.read()); r=j.get('prefixes',{}) or {}; print($1, $2, '$3', $5, round(j['rate_per_s']), j['latency_ms']['p50'], j['latency_ms']['p99'], j['ok_true'], r.get('error:',0), $c0, $r0)"
  kill $pid; wait $pid 2>/dev/null || true; rm -rf "$d"
}
for r in $(seq "$n"); do
  case $((r % 3)) in 0) order="khatru old new";; 1) order="new khatru old";; 2) order="old new khatru";; esac
  for c in 8 64 256; do
    for s in $order; do run $r $c $s $rport 0; done
  done
  for s in $order; do [ $s = khatru ] || run $r 8 $s $dport 5; done
done >> "$out"
