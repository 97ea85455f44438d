#!/bin/bash
# floor.sh publish|churn N OUT: where the CPU of `sluice relay --redis`
# goes, against its own memory store and plain khatru. N rounds, the order
# rotated every round, of three servers, each run a fresh process pinned to
# CPU 1 and the load tool to CPU 0:
#   khatru  plain khatru (sluice-load khatru)
#   mem     $BIN/sluice.new as `sluice relay` with bench-redis.yaml (the
#           quota on), on its memory store
#   redis   the same with --redis, on one redis-server of this script's
#           (REDIS_CPU pins it, as in redisrounds.sh)
# publish: sluice-load publish -conns 8 -events 16000; churn: sluice-load
# connect -conns 32 -churn 10000. One line per run in OUT:
#   round mode server rate_per_s p50_ms server_ticks ops
# server_ticks the server's CPU (user + system, clock ticks of
# /proc/PID/stat) during the load run, ops the EVENTs or upgrades it made:
# (redis - mem) ticks per op is what deciding in Redis costs the gate's
# process, against khatru's ticks per op.
set -e
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-/tmp/lt}
mode=$1 n=$2 out=$3
rport=$((19000 + RANDOM % 500))
${REDIS_CPU:+taskset -c $REDIS_CPU} redis-server --port $rport --save "" --appendonly no >/dev/null 2>&1 &
rpid=$!
trap 'kill $rpid 2>/dev/null' EXIT
sleep 0.5
run() { # run ROUND SERVER
  local port=$((17000 + RANDOM % 2000)) d pid c0 j ops
  d=$(mktemp -d)
  case $2 in
    khatru) taskset -c 1 "$BIN/load" khatru -listen 127.0.0.1:$port -data "$d" >/dev/null 2>&1 & ;;
    mem) taskset -c 1 "$BIN/sluice.new" relay --config "$here/bench-redis.yaml" --listen 127.0.0.1:$port --data-dir "$d" --metrics-listen "" >/dev/null 2>&1 & ;;
    redis) taskset -c 1 "$BIN/sluice.new" relay --config "$here/bench-redis.yaml" --redis redis://127.0.0.1:$rport/0 --listen 127.0.0.1:$port --data-dir "$d" --metrics-listen "" >/dev/null 2>&1 & ;;
  esac
  pid=$!
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
  c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  if [ "$mode" = publish ]; then
    ops=16000
    j=$(taskset -c 0 "$BIN/load" publish -conns 8 -events $ops -url ws://127.0.0.1:$port -xff -json 2>&1)
  else
    ops=10000
    j=$(taskset -c 0 "$BIN/load" connect -conns 32 -churn $ops -url ws://127.0.0.1:$port -xff -json 2>&1)
  fi
  c0=$(( $(awk '{print $14+$15}' /proc/$pid/stat) - c0 ))
  kill $pid; wait $pid 2>/dev/null || true; rm -rf "$d"
  echo "$j" | python3 -c "import sys,json; j=json.loads(sys.stdin.read()); print($1, '$mode', '$2', round(j['rate_per_s']), j['latency_ms']['p50'], $c0, $ops)"
}
for r in $(seq "$n"); do
  case $((r % 3)) in 0) order="khatru mem redis";; 1) order="redis khatru mem";; 2) order="mem redis khatru";; esac
  for s in $order; do run $r $s; done
done >> "$out"
