#!/bin/bash
# rounds.sh churn|publish N OUT: N rounds of plain khatru and the sluice
# binaries $BIN/sluice.old and $BIN/sluice.new, the order rotated every
# round, each run a fresh server process (one.sh); one line per run in OUT:
#   churn:   round server cpu_ticks upgrades/s connected
#   publish: round conns server cpu_ticks events/s p50_ms p99_ms ok_true
# medians.py OUT churn|publish prints the per-round ratios and medians.
here=$(cd "$(dirname "$0")" && pwd)
mode=$1 n=$2 out=$3
for r in $(seq "$n"); do
  case $((r % 3)) in 0) order="khatru old new";; 1) order="new khatru old";; 2) order="old new khatru";; esac
  if [ "$mode" = churn ]; then
    for s in $order; do
      "$here/one.sh" $s connect -conns 32 -churn 20000 | python3 -c "import sys,json; srv,cpu,js=sys.stdin.read().split(' ',2); j=json.loads(js); print($r, srv, cpu.split('=')[1], round(j['rate_per_s']), j['connected'])"
    done
  else
    for c in 8 64 256; do
      for s in $order; do
        "$here/one.sh" $s publish -conns $c -events 16000 | python3 -c "import sys,json; srv,cpu,js=sys.stdin.read().split(' ',2); j=json.loads(js); print($r, $c, srv, cpu.split('=')[1], round(j['rate_per_s']), j['latency_ms']['p50'], j['latency_ms']['p99'], j['ok_true'])"
      done
    done
  fi
done >> "$out"
