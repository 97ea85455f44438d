# shared.py OUT: from shared.sh output, per-round publish rates and live
# delivery latencies of each server, the ratios (rate, live p50, live p99)
# of pg2 (two sluice relays on PostgreSQL, publish on A, live on B) against
# the others, and medians.
import sys, json, statistics as st, collections
runs = collections.defaultdict(list)  # server -> [report], in round order
for line in open(sys.argv[1]):
    name, rest = line.split(' ', 1)
    runs[name].append(json.loads(rest))
rounds = min(len(v) for v in runs.values())
print('rounds=%d' % rounds)
for name, reps in runs.items():
    rate = [r['rate_per_s'] for r in reps[:rounds]]
    p50 = [r['live_delivery_ms']['p50'] for r in reps[:rounds]]
    p99 = [r['live_delivery_ms']['p99'] for r in reps[:rounds]]
    miss = sum(r.get('undelivered', 0) for r in reps[:rounds])
    bad = sum(r['sent'] - r['ok_true'] for r in reps[:rounds])
    print('%-10s events/s median %7.0f [%s]  live p50 median %6.2fms p99 median %6.2fms  undelivered %d  not OK %d' % (
        name, st.median(rate), ' '.join('%.0f' % x for x in rate), st.median(p50), st.median(p99), miss, bad))
for peer in ('khatru-pg', 'pg1', 'badger1'):
    if peer not in runs or 'pg2' not in runs:
        continue
    r = [runs['pg2'][i]['rate_per_s'] / runs[peer][i]['rate_per_s'] for i in range(rounds)]
    l = [runs['pg2'][i]['live_delivery_ms']['p50'] / runs[peer][i]['live_delivery_ms']['p50'] for i in range(rounds)]
    t = [runs['pg2'][i]['live_delivery_ms']['p99'] / runs[peer][i]['live_delivery_ms']['p99'] for i in range(rounds)]
    print('pg2 / %-9s rate median %.3f [%s]  live p50 median %.2f [%s]  live p99 median %.2f [%s]' % (
        peer, st.median(r), ' '.join('%.2f' % x for x in r), st.median(l), ' '.join('%.2f' % x for x in l),
        st.median(t), ' '.join('%.2f' % x for x in t)))
