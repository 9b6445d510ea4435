import json, sys
d = json.load(open(sys.argv[1])); ys = d["ys"]; N = len(ys[0])
TP, TS, SW = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
R = len(ys)
def run(rule, stagger=0, alpha=0.3, shadow=True, P=8, always=False):
    g = [stagger * (R - 1 - i) for i in range(R)]
    ema = [2.0] * R
    t = 0.0; nspec = 0; plain_run = 0; prev = None
    while any(x < N for x in g):
        live = [i for i in range(R) if g[i] < N]
        s = always or rule(g, live, ema)
        if not s and not shadow:
            plain_run += 1
            if plain_run >= P: s, plain_run = True, 0
        if shadow or s:
            for i in live:
                ema[i] = (1 - alpha) * ema[i] + alpha * ys[i][g[i]]
        if prev is not None and s != prev: t += SW
        prev = s
        if s:
            for i in live: g[i] = min(N, g[i] + ys[i][g[i]])
            t += TS; nspec += 1
        else:
            for i in live: g[i] += 1
            t += TP
    return t
def crit(g, l): return max(l, key=lambda i: N - g[i])
def wmean(g, l, e, p):
    w = [(N - g[i]) ** p for i in l]
    return sum(wi * e[i] for wi, i in zip(w, l)) / sum(w)
rules = {
 "slowest": lambda g, l, e: e[crit(g, l)] * TP >= TS,
 "mean": lambda g, l, e: sum(e[i] for i in l) / len(l) * TP >= TS,
 "w2": lambda g, l, e: wmean(g, l, e, 2) * TP >= TS,
 "w4": lambda g, l, e: wmean(g, l, e, 4) * TP >= TS,
}
for st in (0, 2):
    base = run(None, st, always=False, shadow=True) if False else None
    base = 0.0
    g = [st * (R - 1 - i) for i in range(R)]
    base = (N + max(g) - min(g)) * TP  # plain: every step one token
    base = sum(1 for _ in range(N - min(g))) * TP
    out = []
    for k, r in rules.items():
        for sh, P in ((True, 0), (False, 4), (False, 8)):
            out.append(f"{k}/{'sh' if sh else 'P' + str(P)}={base / run(r, st, shadow=sh, P=P or 8):.3f}")
    print("stagger", st, " ".join(out))
def crit4(g, l, e, cap=4, slack=7):
    m = max(N - g[i] for i in l)
    c = sorted([i for i in l if N - g[i] >= m - slack], key=lambda i: g[i])[:cap]
    return sum(e[i] for i in c) / len(c)
print("crit4", " ".join(f"st{st}={(N - 0) * TP / run(lambda g, l, e: crit4(g, l, e) * TP >= TS, st, shadow=True):.3f}" for st in (0, 2)),
      "crit2", " ".join(f"st{st}={(N - 0) * TP / run(lambda g, l, e: crit4(g, l, e, 2) * TP >= TS, st, shadow=True):.3f}" for st in (0, 2)),
      "crit4-noshadowP8", " ".join(f"st{st}={(N - 0) * TP / run(lambda g, l, e: crit4(g, l, e) * TP >= TS, st, shadow=False, P=8):.3f}" for st in (0, 2)))
