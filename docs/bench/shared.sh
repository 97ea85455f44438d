#!/bin/bash
# shared.sh ROUNDS OUT LOAD-ARGS...: sluice relay past one machine. Starts
# one PostgreSQL (initdb in a temporary directory, a free loopback port;
# as root it runs as the user postgres) and one Redis, then for ROUNDS
# rounds runs, in an order rotated every round, each of:
#   pg2        two sluice relays on one PostgreSQL database: publish to A,
#              the live subscriber on B
#   pg1        one sluice relay on PostgreSQL: publish and subscribe on it
#   badger1    one sluice relay on badger: publish and subscribe on it
#   khatru-pg  plain khatru on eventstore's PostgreSQL backend (sluice-load
#              khatru -database): publish and subscribe on it
# every sluice with --redis (the limits in Redis, none refusing:
# bench.yaml), each run on a fresh database or data directory. Appends one
# line per run to OUT: the server's name and sluice-load's JSON.
# BIN (default /tmp/lt) holds sluice-load as "load" and sluice as "sluice".
#   e.g. BIN=/tmp/lt docs/bench/shared.sh 5 shared.txt publish -conns 16 -events 8000
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-/tmp/lt}
rounds=$1 out=$2; shift 2
pgbin=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")")
free() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
as=()
if [[ $(id -u) -eq 0 ]]; then chown postgres "$work"; as=(runuser -u postgres --); fi
pgport=$(free) rport=$(free)
"${as[@]}" "$pgbin/initdb" -D "$work/pg" -U postgres -A trust -E UTF8 --locale=C >/dev/null
"${as[@]}" "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -o "-p $pgport -k $work -c listen_addresses=127.0.0.1 -c max_connections=300" -w start >/dev/null
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  kill "$(cat "$work/redis.pid")" 2>/dev/null || true
  "${as[@]}" "$pgbin/pg_ctl" -D "$work/pg" -m fast -w stop >/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
newdb() { # newdb NAME: a fresh database, its URL
  "$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U postgres "$1"
  echo "postgres://postgres@127.0.0.1:$pgport/$1?sslmode=disable"
}
waitport() { for _ in $(seq 200); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
sluice() { # sluice PORT ARGS...
  local port=$1; shift
  "$BIN/sluice" relay --config "$here/bench.yaml" --listen "127.0.0.1:$port" --metrics-listen "" \
    --redis "redis://127.0.0.1:$rport/0" "$@" >/dev/null 2>&1 &
  pids+=($!)
  waitport "$port"
}
run() { # run NAME ROUND LOAD-ARGS...: start NAME's servers, load them, stop them
  local name=$1 db=${1//-/_}_$2 a b url live d
  shift 2
  a=$(free) b=$(free) d=$(mktemp -d)
  case $name in
    pg2) url=$(newdb "$db"); sluice "$a" --database "$url"; sluice "$b" --database "$url"; live=$b ;;
    pg1) url=$(newdb "$db"); sluice "$a" --database "$url"; live=$a ;;
    badger1) sluice "$a" --data-dir "$d"; live=$a ;;
    khatru-pg) url=$(newdb "$db"); "$BIN/load" khatru -listen "127.0.0.1:$a" -database "$url" >/dev/null 2>&1 & pids+=($!); waitport "$a"; live=$a ;;
  esac
  echo "$name $("$BIN/load" "$@" -url "ws://127.0.0.1:$a" -live "ws://127.0.0.1:$live" -xff -json 2>&1)" >>"$out"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  rm -rf "$d"
}
servers=(pg2 pg1 badger1 khatru-pg)
for r in $(seq 0 $((rounds-1))); do
  for i in 0 1 2 3; do
    s=${servers[$(((i+r)%4))]}
    run "$s" "$r" "$@"
  done
done
