#!/bin/bash
# slowrounds.sh stall|stall1|stall64|backlog|backlog2|slowread|slowread4k|slowread16 ROUNDS OUT: the
# slow-reader scenarios of docs/BENCHMARKS.md ("Slow readers and
# backpressure") against plain khatru and against sluice relay and sluice
# proxy (in front of plain khatru) built before and after a change; every
# run a fresh server process on a fresh data directory; the order of the
# targets rotates every round. One line per run in OUT:
#   round target variant {the tool's JSON report}
# LOAD is sluice-load, BEFORE and AFTER the two sluice binaries, CONFIG
# the config (default: testdata/slow.yaml beside this script), TARGETS the
# targets (default: all five).
# backlog, backlog2 and the slowread scenarios run their targets at the same time
# (their figures are goroutines, RSS and whether and when a client is cut,
# not latencies).
here=$(cd "$(dirname "$0")" && pwd)
LOAD=${LOAD:-bin/sluice-load}
CONFIG=${CONFIG:-$here/slow.yaml}
: "${BEFORE:?set BEFORE to the sluice binary before the change}" "${AFTER:?set AFTER to the sluice binary after it}"
scenario=$1 rounds=$2 out=$3
read -r -a targets <<< "${TARGETS:-khatru relay-before relay-after proxy-before proxy-after}"

# start TARGET N: serve TARGET on 127.0.0.1:(17100+N) with metrics on
# 17300+N (khatru behind a proxy: 17200+N, metrics 17400+N); sets pids.
start() {
  local t=$1 n=$2 d
  d=$(mktemp -d)
  dirs+=("$d")
  local port=$((17100 + n)) mport=$((17300 + n)) kport=$((17200 + n)) kmport=$((17400 + n))
  local bin=$AFTER
  [[ $t == *-before ]] && bin=$BEFORE
  case $t in
    khatru) "$LOAD" khatru -listen 127.0.0.1:$port -data "$d" -metrics 127.0.0.1:$mport >/dev/null 2>&1 & pids+=($!) ;;
    relay-*) "$bin" relay --config "$CONFIG" --listen 127.0.0.1:$port --data-dir "$d" --metrics-listen 127.0.0.1:$mport >/dev/null 2>&1 & pids+=($!) ;;
    proxy-*)
      "$LOAD" khatru -listen 127.0.0.1:$kport -data "$d" -metrics 127.0.0.1:$kmport >/dev/null 2>&1 & pids+=($!)
      for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$kport) 2>/dev/null && break; sleep 0.05; done
      "$bin" proxy --config "$CONFIG" --upstream ws://127.0.0.1:$kport --listen 127.0.0.1:$port --metrics-listen 127.0.0.1:$mport >/dev/null 2>&1 & pids+=($!) ;;
  esac
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
}
stop() {
  kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
  rm -rf "${dirs[@]}"; pids=() dirs=()
}
metrics() { # the metrics URLs of target $1 number $2
  case $1 in
    khatru) echo "http://127.0.0.1:$((17300 + $2))/metrics" ;;
    proxy-*) echo "http://127.0.0.1:$((17300 + $2))/metrics,http://127.0.0.1:$((17400 + $2))/metrics" ;;
    *) echo "http://127.0.0.1:$((17300 + $2))/metrics" ;;
  esac
}
one() { # one TARGET VARIANT ROUND ARGS...: a run on a fresh server
  local t=$1 v=$2 r=$3; shift 3
  pids=() dirs=()
  start "$t" 0
  echo "$r $t $v $("$LOAD" "$@" -url ws://127.0.0.1:17100 -xff -json 2>&1 | tr -d '\n')" >> "$out"
  stop
}

for r in $(seq "$rounds"); do
  rot=$(( (r - 1) % ${#targets[@]} ))
  order=("${targets[@]:$rot}" "${targets[@]:0:$rot}")
  case $scenario in
  stall)
    for t in "${order[@]}"; do
      [[ $t == *-before ]] || one "$t" unloaded "$r" stall -stallers 0 -duration 12s -timeout 8s
      one "$t" 1x256KB/s "$r" stall -stallers 1 -stall-read 256000 -duration 12s -timeout 8s
      one "$t" 64x0 "$r" stall -stallers 64 -stall-read 0 -duration 12s -timeout 8s
    done ;;
  stall64) # 64 connections from one address that read nothing, or all they can
    for t in "${order[@]}"; do
      [[ $t == *-before ]] || one "$t" unloaded "$r" stall -stallers 0 -duration 12s -timeout 8s
      one "$t" 64x0 "$r" stall -stallers 64 -stall-read 0 -duration 12s -timeout 8s
      one "$t" 64xfast "$r" stall -stallers 64 -stall-read 100000000 -duration 12s -timeout 8s
    done ;;
  stall1)
    for t in "${order[@]}"; do
      one "$t" 1x0 "$r" stall -stallers 1 -stall-read 0 -duration 12s -timeout 8s
    done ;;
  backlog|backlog2|slowread|slowread4k|slowread16)
    pids=() dirs=() tools=() i=0
    for t in "${order[@]}"; do start "$t" $i; i=$((i + 1)); done
    i=0
    for t in "${order[@]}"; do
      port=$((17100 + i))
      v=$scenario
      case $scenario in
        backlog) args=(backlog -duration 150s -metrics "$(metrics "$t" $i)") ;;
        backlog2) args=(backlog -filters 2 -duration 150s -metrics "$(metrics "$t" $i)") ;;
        slowread) args=(slowread -read 64000 -duration 60s) ;;
        slowread16) args=(slowread -read 16000 -duration 240s) ;;
        slowread4k)
          # two clients per target, one at 16 KB/s, one at 64 KB/s, each
          # with a 4 KiB receive buffer; the second fills the store again
          # (2,000 stored, the REQ still brings 1,000)
          ( echo "$r $t 16KB/s-4k $("$LOAD" slowread -read 16000 -rcvbuf 4096 -duration 60s -url ws://127.0.0.1:$port -xff -json 2>&1 | tr -d '\n')" >> "$out" ) &
          tools+=($!)
          v=64KB/s-4k args=(slowread -read 64000 -rcvbuf 4096 -duration 60s) ;;
      esac
      ( echo "$r $t $v $("$LOAD" "${args[@]}" -url ws://127.0.0.1:$port -xff -json 2>&1 | tr -d '\n')" >> "$out" ) &
      tools+=($!)
      i=$((i + 1))
    done
    wait "${tools[@]}"
    stop ;;
  esac
done
