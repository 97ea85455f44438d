#!/bin/bash
# one.sh SERVER LOAD-ARGS...: start SERVER on a free port with a fresh data
# directory, pinned to CPU 1; run sluice-load with LOAD-ARGS against it,
# pinned to CPU 0; print the server's CPU ticks (utime + stime from
# /proc/PID/stat) over the run and the tool's JSON line.
#   SERVER: khatru (plain khatru: sluice-load khatru) or a name N for which
#   $BIN/sluice.N is a sluice binary (run as sluice relay with bench.yaml,
#   or with the config CONFIG names, and with --redis REDIS when REDIS is
#   set: a Redis URL).
# BIN (default /tmp/lt) holds sluice-load as "load" and the sluice binaries.
set -e
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-/tmp/lt}
srv=$1; shift
port=$((17000 + RANDOM % 2000))
d=$(mktemp -d)
case $srv in
  khatru) taskset -c 1 "$BIN/load" khatru -listen 127.0.0.1:$port -data "$d" >/dev/null 2>&1 & ;;
  *) taskset -c 1 "$BIN/sluice.$srv" relay --config "${CONFIG:-$here/bench.yaml}" ${REDIS:+--redis "$REDIS"} --listen 127.0.0.1:$port --data-dir "$d" --metrics-listen "" >/dev/null 2>&1 & ;;
esac
pid=$!
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
cpu() { awk '{print $14+$15}' /proc/$pid/stat; }
c0=$(cpu)
out=$(taskset -c 0 "$BIN/load" "$@" -url ws://127.0.0.1:$port -xff -json 2>&1)
c1=$(cpu)
kill $pid; wait $pid 2>/dev/null || true; rm -rf "$d"
echo "$srv cpu_ticks=$((c1-c0)) $out"
