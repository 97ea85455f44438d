#!/bin/bash
# floor.sh publish|churn N OUT: where the CPU of `sluice relay --redis`
# goes, against its own memory store and plain khatru. N rounds, the order
# rotated every round, of three servers, each run a fresh process pinned to
# CPU 1 and the load tool to CPU 0 (one.sh):
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
mode=$1 n=$2 out=$3
rport=$((19000 + RANDOM % 500))
${REDIS_CPU:+taskset -c $REDIS_CPU} redis-server --port $rport --save "" --appendonly no >/dev/null 2>&1 &
rpid=$!
trap 'kill $rpid 2>/dev/null' EXIT
sleep 0.5
case $mode in
  publish) ops=16000 load="publish -conns 8 -events $ops" ;;
  churn) ops=10000 load="connect -conns 32 -churn $ops" ;;
  *) echo "floor.sh: publish or churn, not $mode" >&2; exit 2 ;;
esac
run() { # run ROUND SERVER
  local srv=$2 redis=
  case $2 in
    mem) srv=new ;;
    redis) srv=new redis=redis://127.0.0.1:$rport/0 ;;
  esac
  CONFIG=$here/bench-redis.yaml REDIS=$redis "$here/one.sh" $srv $load |
    python3 -c "import sys,json; srv,cpu,js=sys.stdin.read().split(' ',2); j=json.loads(js); print($1, '$mode', '$2', round(j['rate_per_s']), j['latency_ms']['p50'], cpu.split('=')[1], $ops)"
}
for r in $(seq "$n"); do
  case $((r % 3)) in 0) order="khatru mem redis";; 1) order="redis khatru mem";; 2) order="mem redis khatru";; esac
  for s in $order; do run $r $s; done
done >> "$out"
