"""Is the spread of the q <= 1 Mamba variants' test MSE (Figure 3) more than seed noise? Per cell, a
permutation test of the between-variant spread (F statistic) against random relabellings of the runs."""
import json, statistics, collections, random, sys
runs = [json.loads(l) for f in sys.argv[1:] for l in open(f)]
cells = collections.defaultdict(lambda: collections.defaultdict(list))
for r in runs:
    if r['backbone'] == 'mamba' and r['variant'] != 'free' and r['test_mse'] is not None:
        cells[(r['horizon'], r['depth'])][r['variant']].append(r['test_mse'])
def F(groups):
    allx = [x for g in groups for x in g]; m = statistics.fmean(allx); k = len(groups); n = len(allx)
    between = sum(len(g) * (statistics.fmean(g) - m) ** 2 for g in groups) / (k - 1)
    within = sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g) / (n - k)
    return between / within
rng = random.Random(0)
for cell, by in sorted(cells.items()):
    groups = list(by.values()); sizes = [len(g) for g in groups]; pool = [x for g in groups for x in g]
    f0 = F(groups); hits = 0; N = 20000
    for _ in range(N):
        rng.shuffle(pool); it = iter(pool)
        hits += F([[next(it) for _ in range(s)] for s in sizes]) >= f0
    means = {v: statistics.fmean(g) for v, g in by.items()}; med = statistics.median(means.values())
    spread = ", ".join(f"{v} {100 * (m / med - 1):+.1f}%" for v, m in means.items())
    cv = statistics.fmean(statistics.stdev(g) / statistics.fmean(g) for g in groups)
    print(f"H{cell[0]} L{cell[1]}: seeds/variant {sizes[0]}; variant means vs median: {spread}; "
          f"mean seed CV {100 * cv:.0f}%; permutation p = {hits / N:.3f}")
