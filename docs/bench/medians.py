# medians.py OUT churn|publish: per-round ratios against plain khatru (rate and
# server CPU) and new against old, with their medians, from rounds.sh output.
import sys, statistics as st, collections
rows=[l.split() for l in open(sys.argv[1])]
kind=sys.argv[2]
g=collections.defaultdict(dict)
for r in rows:
    if kind=='churn':
        rnd,srv,cpu,rate=r[0],r[1],int(r[2]),int(r[3]); key=(rnd,'')
    else:
        rnd,n,srv,cpu,rate=r[0],r[1],r[2],int(r[3]),int(r[4]); key=(rnd,n)
    g[key][srv]=(rate,cpu)
by=collections.defaultdict(lambda: collections.defaultdict(list))
for (rnd,n),d in sorted(g.items()):
    if len(d)<3: continue
    k=d['khatru']
    for s in ('old','new'):
        by[n][s+'_rate'].append(d[s][0]/k[0]); by[n][s+'_cpu'].append(d[s][1]/k[1])
    by[n]['new/old'].append(d['new'][0]/d['old'][0])
    by[n]['k_rate'].append(k[0])
for n,d in by.items():
    print('n=%s rounds=%d' % (n, len(d['k_rate'])))
    for key,v in d.items():
        print('  %-9s median %.3f  [%s]' % (key, st.median(v), ' '.join('%.2f'%x if x<100 else '%d'%x for x in v)))
