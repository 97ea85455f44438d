#!/bin/bash
# redischurn.sh N OUT DELAY_MS SERVER...: N rounds, the order rotated every
# round, of connection churn (sluice-load connect: 32 workers opening and
# closing 10,000 connections, each worker its own address) against each
# SERVER, a fresh process pinned to CPU 1 and the load tool to CPU 0:
#   khatru   plain khatru (sluice-load khatru)
#   NAME     $BIN/sluice.NAME as `sluice relay --redis` with bench-redis.yaml
#            on one redis-server of this script's, its replies DELAY_MS late
#            through delayproxy when DELAY_MS is not 0
# One line per run in OUT: round server delay_ms cpu_ticks upgrades/s p50_ms
# BIN (default /tmp/lt) holds sluice-load as "load", the sluice binaries and
# delayproxy (go build -o $BIN/delayproxy docs/bench/delayproxy/main.go).
# REDIS_CPU, when set, pins redis-server to that CPU (0: beside the load
# tool, so that the sluice server has CPU 1 to itself as plain khatru has;
# unset: the kernel places it).
set -e
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-/tmp/lt}
n=$1 out=$2 delay=$3
shift 3
rport=$((19000 + RANDOM % 500))
${REDIS_CPU:+taskset -c $REDIS_CPU} redis-server --port $rport --save "" --appendonly no >/dev/null 2>&1 &
pids=$!
uport=$rport
if [ "$delay" != 0 ]; then
  uport=$((rport + 500))
  "$BIN/delayproxy" -target 127.0.0.1:$rport -listen 127.0.0.1:$uport -d "${delay}ms" &
  pids="$pids $!"
fi
trap 'kill $pids 2>/dev/null' EXIT
sleep 0.5
run() { # run ROUND SERVER
  local port=$((17000 + RANDOM % 2000)) d pid c0 c1 j
  d=$(mktemp -d)
  case $2 in
    khatru) taskset -c 1 "$BIN/load" khatru -listen 127.0.0.1:$port -data "$d" >/dev/null 2>&1 & ;;
    *) taskset -c 1 "$BIN/sluice.$2" relay --config "$here/bench-redis.yaml" --redis redis://127.0.0.1:$uport/0 --listen 127.0.0.1:$port --data-dir "$d" --metrics-listen "" >/dev/null 2>&1 & ;;
  esac
  pid=$!
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
  c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  j=$(taskset -c 0 "$BIN/load" connect -conns 32 -churn 10000 -url ws://127.0.0.1:$port -xff -json 2>&1)
  c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill $pid; wait $pid 2>/dev/null || true; rm -rf "$d"
  echo "$1 $2 $delay $((c1 - c0)) $(echo "$j" | python3 -c "import sys,json; j=json.loads(sys.stdin.read()); print(round(j['rate_per_s']), j['latency_ms']['p50'])")"
}
for r in $(seq "$n"); do
  for s in "$@"; do run $r $s; done
  set -- "${@:2}" "$1"
done >> "$out"
