"""Seeded random differential fuzzer: draft=none vs a drafter. Usage: fuzz.py SEED0 MINUTES"""
from __future__ import annotations

import copy
import json
import os
import random
import sys
import time

sys.path.insert(0, "/tmp/fuzz40")
import fuzzcore  # noqa: E402
from fuzzcore import check  # noqa: E402

from appliance import oracle  # noqa: E402

SRC = os.environ.get("FUZZSRC", "/tmp/fuzz40/src")
REPROS = os.environ.get("FUZZREPROS", "/tmp/fuzz40/repros")
LOG = os.environ.get("FUZZLOG", "/tmp/fuzz40/log.jsonl")
MODELS = ["tiny", "tiny-gemma3", "tiny-qwen3-next"]
TEXT = {}


def text_ids(name):
    if name not in TEXT:
        tok = fuzzcore.model(name)[1]
        TEXT[name] = [t for t in tok.encode(oracle.BATCH_TEXT) if t not in tok.eos_token_ids]
    return TEXT[name]


def gen_len(rng):
    c = rng.random()
    if c < 0.2:
        return rng.randint(1, 3)
    if c < 0.45:
        return rng.randint(13, 19)
    if c < 0.65:
        return rng.randint(4, 40)
    if c < 0.85:
        return rng.randint(28, 70)
    return rng.randint(60, 200)


def gen_prompt(rng, name, n):
    ids = text_ids(name)
    kind = rng.random()
    if kind < 0.5:
        s = rng.randrange(0, max(1, len(ids) - n))
        p = ids[s:s + n]
        while len(p) < n:
            p += ids[:n - len(p)]
        return p
    if kind < 0.75:
        return [rng.randrange(3, 4090) for _ in range(n)]
    pat = [rng.randrange(3, 4090) for _ in range(rng.randint(2, 8))]  # repetitive: lookup hits
    return [pat[i % len(pat)] if rng.random() > 0.1 else rng.randrange(3, 4090)
            for i in range(n)]


def gen_case(seed):
    rng = random.Random(seed)
    name = rng.choices(MODELS, [5, 2.5, 3])[0]
    kinds = ["scripted", "model", "lookup"] + ([] if name == "tiny-gemma3" else ["mtp"])
    kind = rng.choices(kinds, [1, 3, 1, 3][:len(kinds)])[0]
    k = rng.randint(1, 6)
    ctl = rng.choices(["fixed", "adaptive", "pattern", "plain_won"], [3, 2, 5, 1])[0]
    draft = {"kind": kind, "k": k, "control": ctl, "every": rng.randint(2, 7),
             "salt": rng.randrange(7), "seed": rng.randrange(1 << 20),
             "p_spec": rng.choice([0.2, 0.5, 0.8, 0.95]),
             "p_rest": rng.choice([0, 0, 0.3, 0.7]),
             "chunk": rng.choice([16, 16, 5, 32])}
    nrows = rng.randint(1, 6)
    max_rows = rng.randint(1, 6)
    shared = None
    prefix = rng.random() < 0.5
    scheme = None
    if rng.random() < 0.65:
        if name == "tiny" and rng.random() < 0.65:
            codec = rng.choice(["affine", "k8v4", "k8v4", "affine8", "affine4", "k4v8"])
        else:
            codec = "turbo"
        start = rng.choice([0, 0, rng.randint(1, 140), rng.randint(1, 140),
                            rng.choice([1, 5, 31, 33, 47, 50, 63, 65, 70, 95, 97])])
        if start % 32 == 0 and start and rng.random() < 0.7:
            start += rng.choice([-1, 1, 7])
        scheme = {"codec": codec, "layers": sorted(rng.sample(range(6), rng.randint(1, 6))),
                  "start": start}
        if codec == "turbo" and rng.random() < 0.3:
            scheme["kb"], scheme["vb"] = rng.choice([(3, 3), (4, 2), (3, 4), (2.5, 2.5)])
    cross = scheme is not None and scheme["start"] > 0 and rng.random() < 0.6
    minp = 2 if scheme is not None and scheme["start"] == 0 else 1
    if prefix or rng.random() < 0.2:
        shared = gen_prompt(rng, name, rng.randint(5, 80))
    rows = []
    for i in range(nrows):
        n = max(minp, gen_len(rng))
        if cross and rng.random() < 0.7:
            n = max(minp, scheme["start"] + rng.choice([-2, -1, 0, 1, 2, rng.randint(3, 40),
                                                         rng.randint(-30, -3)]))
        p = gen_prompt(rng, name, n)
        if shared and rng.random() < 0.7:
            p = shared + p
        r = {"name": f"r{i}", "prompt": p,
             "max_tokens": rng.choice([1, 2, 3, rng.randint(4, 20), rng.randint(10, 60),
                                       rng.randint(30, 100)]),
             "tick": rng.choice([0, 0, rng.randint(0, 5), rng.randint(0, 25)])}
        if rng.random() < 0.15:
            r["remove"] = rng.randint(0, 20)
        c = rng.random()
        if c < 0.25:
            r["sampling"], r["seed"] = "seeded", rng.randrange(100)
            if rng.random() < 0.5:
                r["rep"] = 1.1
        elif c < 0.28:
            r["sampling"] = "unseeded"
        if rng.random() < 0.2:
            r["logprobs"] = rng.choice([0, 2])
        if prefix and shared and rng.random() < 0.6:
            r["checkpoints"] = [len(shared)]
        rows.append(r)
    rounds = [rows]
    if prefix and rng.random() < 0.5:
        r2 = []
        for i, r in enumerate(rows):
            if rng.random() < 0.6:
                r2.append({"name": f"s{i}", "prompt": [], "ext": [r["name"], rng.randint(0, 10),
                           [rng.randrange(3, 4090) for _ in range(rng.randint(0, 6))]],
                           "max_tokens": rng.randint(1, 30), "tick": rng.randint(0, 6)})
        if r2:
            rounds.append(r2)
    cuda = rng.random() < 0.3
    if os.environ.get("NO_TURBO") and scheme:
        scheme["codec"] = "affine"
        cuda = False
    flags = {"cuda": cuda, "grid": cuda and rng.random() < 0.5,
             "hold": (not cuda) and rng.random() < 0.1,
             "ahead": rng.choice([None, None, True]),
             "compact": rng.random() < 0.15, "lag": rng.choice([None, None, None, 2, 5]),
             "prefill_rows": rng.choice([1, 1, 1, 2, 3]),
             "compile_step": rng.random() < 0.1,
             "compile_verify": rng.random() < 0.7}
    return {"seed": seed, "model": name, "max_rows": max_rows, "draft": draft,
            "rounds": rounds, "prefix": prefix, "scheme": scheme, "flags": flags}


def gen_case40(seed):
    """The 40th's variant: mostly tiny (the only model whose entries are cut), the prefix
    cache on, second turns that share more of a stored turn (or prompt) than any whole
    entry, kv.start placed around the lengths that are cut."""
    rng = random.Random(seed * 7919 + 40)
    name = rng.choices(MODELS, [7, 1.2, 1.8])[0]
    kinds = ["scripted", "model", "lookup"] + ([] if name == "tiny-gemma3" else ["mtp"])
    kind = rng.choices(kinds, [1, 3, 1, 3][:len(kinds)])[0]
    k = rng.randint(1, 6)
    ctl = rng.choices(["fixed", "adaptive", "pattern", "plain_won"], [3, 2, 5, 1])[0]
    draft = {"kind": kind, "k": k, "control": ctl, "every": rng.randint(2, 7),
             "salt": rng.randrange(7), "seed": rng.randrange(1 << 20),
             "p_spec": rng.choice([0.2, 0.5, 0.8, 0.95]),
             "p_rest": rng.choice([0, 0, 0.3, 0.7]),
             "chunk": rng.choice([16, 16, 5, 32])}
    nrows = rng.randint(1, 5)
    max_rows = rng.randint(1, 6)
    prefix = rng.random() < 0.92
    shared = gen_prompt(rng, name, rng.randint(5, 80)) if rng.random() < 0.85 else None
    rows = []
    for i in range(nrows):
        n = max(3, gen_len(rng))
        p = gen_prompt(rng, name, n)
        if shared and rng.random() < 0.8:
            p = shared + p
        r = {"name": f"r{i}", "prompt": p,
             "max_tokens": rng.choice([rng.randint(4, 20), rng.randint(8, 40), rng.randint(1, 3),
                                       rng.randint(30, 80)]),
             "tick": rng.choice([0, 0, rng.randint(0, 5), rng.randint(0, 25)])}
        if rng.random() < 0.08:
            r["remove"] = rng.randint(0, 20)
        c = rng.random()
        if c < 0.25:
            r["sampling"], r["seed"] = "seeded", rng.randrange(100)
            if rng.random() < 0.5:
                r["rep"] = 1.1
        elif c < 0.27:
            r["sampling"] = "unseeded"
        if rng.random() < 0.15:
            r["logprobs"] = rng.choice([0, 2])
        if prefix and shared and p[:len(shared)] == shared and rng.random() < 0.75:
            r["checkpoints"] = [len(shared)]
        rows.append(r)
    rounds = [rows]
    r2 = []
    if prefix and rng.random() < 0.85:
        for i, r in enumerate(rows):
            if rng.random() < 0.75 or (i == 0 and not r2):
                extra = gen_prompt(rng, name, rng.randint(0, 24)) if rng.random() < 0.8 else []
                kindx = rng.choices(["turn", "branch", "ext"], [6.5, 2, 1.5])[0]
                if kindx == "turn":
                    n = rng.randint(0, max(0, r["max_tokens"] - 3))
                elif kindx == "branch":
                    lo = len(shared) + 1 if shared and r["prompt"][:len(shared)] == shared else 1
                    n = rng.randint(min(lo, len(r["prompt"]) - 1), len(r["prompt"]) - 1)
                else:
                    n = rng.randint(0, 10)
                x = {"name": f"s{i}", "prompt": [], "ext": [r["name"], n, extra],
                     "div": None if kindx == "ext" else kindx, "cp": rng.random() < 0.8,
                     "max_tokens": rng.randint(1, 30), "tick": rng.randint(0, 6)}
                if rng.random() < 0.2:
                    x["sampling"], x["seed"] = "seeded", rng.randrange(100)
                r2.append(x)
        rounds.append(r2)
    scheme = None
    if rng.random() < 0.88:
        if name == "tiny" and rng.random() < 0.55:
            codec = rng.choice(["affine", "k8v4", "k8v4", "affine8", "affine4", "k4v8"])
        else:
            codec = "turbo"
        how = rng.choices(["orig", "cut", "shared", "zero"], [2, 5, 2, 1])[0]
        if how == "cut" and r2:
            x = rng.choice(r2)
            src = rows[int(x["ext"][0][1:])]
            if x["div"] == "branch":
                at = min(x["ext"][1], len(src["prompt"]) - 1)
            else:
                at = len(src["prompt"]) + min(x["ext"][1], src["max_tokens"])
            start = max(0, at + rng.choice([-3, -2, -1, 0, 0, 0, 1, 1, 2, 3,
                                            rng.randint(4, 15), -rng.randint(4, 15)]))
        elif how == "shared" and shared:
            start = len(shared) + rng.randint(-3, 10)
        elif how == "zero":
            start = 0
        else:
            start = rng.choice([0, rng.randint(1, 140), rng.randint(1, 140),
                                rng.choice([1, 5, 31, 33, 47, 50, 63, 65, 70, 95, 97])])
        scheme = {"codec": codec, "layers": sorted(rng.sample(range(6), rng.randint(1, 6))),
                  "start": max(0, start), "how": how}
        if codec == "turbo" and rng.random() < 0.3:
            scheme["kb"], scheme["vb"] = rng.choice([(3, 3), (4, 2), (3, 4), (2.5, 2.5)])
    cache = "restart" if prefix and r2 and rng.random() < 0.3 else "ram"
    if os.environ.get("SANITIZE"):  # a round-2 row's base must be the same row in both runs
        bases = {x["ext"][0] for x in r2}
        for r in rows:
            if r["name"] in bases:
                if r.get("sampling") == "unseeded":
                    r.pop("sampling")
                r.pop("remove", None)
    cuda = rng.random() < 0.3
    flags = {"cuda": cuda, "grid": cuda and rng.random() < 0.5,
             "hold": (not cuda) and rng.random() < 0.1,
             "ahead": rng.choice([None, None, True]),
             "compact": rng.random() < 0.15, "lag": rng.choice([None, None, None, 2, 5]),
             "prefill_rows": rng.choice([1, 1, 1, 2, 3]),
             "compile_step": rng.random() < 0.1,
             "compile_verify": rng.random() < 0.7}
    return {"seed": seed, "model": name, "max_rows": max_rows, "draft": draft,
            "rounds": [x for x in rounds if x], "prefix": prefix, "scheme": scheme,
            "flags": flags, "cache": cache, "shared_len": len(shared) if shared else 0}


# ---------------------------------------------------------------- shrinking
def same_failure(status, info, want):
    if status == want and status in ("crash", "plain_crash"):
        return sig(status, info) == WANT_SIG[0]
    return status == "diff" and want == "diff"


def candidates(case):
    """Smaller variants of `case`, most aggressive first."""
    out = []
    rows = case["rounds"][0]
    if len(case["rounds"]) > 1:
        c = copy.deepcopy(case); c["rounds"] = c["rounds"][:1]; out.append(c)
    for rnd in range(len(case["rounds"])):
        for i in range(len(case["rounds"][rnd])):
            if rnd == 0 and len(rows) == 1:
                break
            c = copy.deepcopy(case)
            gone = c["rounds"][rnd].pop(i)["name"]
            if len(c["rounds"]) > 1:
                c["rounds"][1] = [r for r in c["rounds"][1] if not r.get("ext") or
                                  r["ext"][0] != gone]
                if not c["rounds"][1]:
                    c["rounds"].pop()
            out.append(c)
    f = case["flags"]
    for key, off in [("cuda", False), ("grid", False), ("hold", False), ("ahead", None),
                     ("compact", False), ("lag", None), ("prefill_rows", 1),
                     ("compile_step", False), ("compile_verify", False)]:
        if f.get(key) != off:
            c = copy.deepcopy(case); c["flags"][key] = off; out.append(c)
    if case["scheme"]:
        c = copy.deepcopy(case); c["scheme"] = None; out.append(c)
        if case["scheme"]["start"]:
            c = copy.deepcopy(case); c["scheme"]["start"] = 0; out.append(c)
        if len(case["scheme"]["layers"]) > 1:
            for l in case["scheme"]["layers"]:
                c = copy.deepcopy(case); c["scheme"]["layers"].remove(l); out.append(c)
    if case["prefix"]:
        c = copy.deepcopy(case); c["prefix"] = False; c["rounds"] = c["rounds"][:1]
        out.append(c)
    d = case["draft"]
    if d["control"] != "fixed":
        c = copy.deepcopy(case); c["draft"]["control"] = "fixed"; out.append(c)
    if d["control"] == "pattern" and d["p_rest"]:
        c = copy.deepcopy(case); c["draft"]["p_rest"] = 0; out.append(c)
    if d["kind"] in ("model", "mtp", "lookup"):
        c = copy.deepcopy(case); c["draft"]["kind"] = "scripted"; out.append(c)
    if d["k"] > 1:
        c = copy.deepcopy(case); c["draft"]["k"] = d["k"] - 1; out.append(c)
    if case["max_rows"] > 1:
        c = copy.deepcopy(case); c["max_rows"] -= 1; out.append(c)
    for rnd in range(len(case["rounds"])):
        for i, r in enumerate(case["rounds"][rnd]):
            for key, off in [("remove", None), ("logprobs", None), ("checkpoints", None),
                             ("sampling", None)]:
                if r.get(key) is not None:
                    c = copy.deepcopy(case); c["rounds"][rnd][i].pop(key)
                    c["rounds"][rnd][i].pop("seed", None); c["rounds"][rnd][i].pop("rep", None)
                    out.append(c)
            if r["tick"]:
                for t in (0, r["tick"] // 2, r["tick"] - 1):
                    c = copy.deepcopy(case); c["rounds"][rnd][i]["tick"] = t; out.append(c)
            mt = r["max_tokens"]
            for v in sorted({mt // 2, mt - 1, mt * 3 // 4}):
                if 1 <= v < mt:
                    c = copy.deepcopy(case); c["rounds"][rnd][i]["max_tokens"] = v; out.append(c)
            p = r["prompt"]
            if len(p) > 1:
                n = len(p)
                for q in (p[:n // 2], p[n // 2:], p[:-1], p[1:], p[:n * 3 // 4], p[n // 4:]):
                    if q and len(q) < n:
                        c = copy.deepcopy(case); c["rounds"][rnd][i]["prompt"] = q; out.append(c)
    def ok(c):
        sc = c["scheme"]
        return not (sc and sc["start"] == 0 and any(len(r["prompt"]) < 2 for r in c["rounds"][0]))
    return [c for c in out if ok(c)]


WANT_SIG = [None]


def sig(status, info):
    import re
    if status in ("crash", "plain_crash"):
        lines = [l for l in str(info).strip().splitlines() if l.strip()]
        last = lines[-1] if lines else ""
        for l in lines:
            if l.startswith("row ") and ":" in l:
                last = l.split(":", 1)[1]
                break
        return status + ":" + re.sub(r"\d+", "N", last)[:120]
    return status


def shrink(case, want, budget_s=120, info=None):
    WANT_SIG[0] = sig(want, info)
    t0, tries = time.time(), 0
    progress = True
    while progress and time.time() - t0 < budget_s:
        progress = False
        for c in candidates(case):
            if time.time() - t0 > budget_s:
                break
            tries += 1
            st, info = check(c, want_gap=False)
            if same_failure(st, info, want):
                case, progress = c, True
                print(f"  shrunk ({tries} tries, {time.time() - t0:.0f}s): "
                      f"{describe(case)}", flush=True)
                break
    return case


def describe(case):
    rows = [(r["name"], len(r["prompt"]) if not r.get("ext") else "ext", r["max_tokens"],
             r["tick"]) for rr in case["rounds"] for r in rr]
    return (f"{case['model']} cache={case.get('cache')} draft={case['draft']['kind']}/{case['draft']['control']} "
            f"k={case['draft']['k']} max_rows={case['max_rows']} rows={rows} "
            f"scheme={case['scheme']} prefix={case['prefix']} flags="
            f"{ {k: v for k, v in case['flags'].items() if v is not None and v is not False and not (k == 'prefill_rows' and v == 1)} }")


REPRO = '''"""Repro: {desc}
Run: cd {src} && . /work/main/.venv/bin/activate && \\
  PYTHONPATH={src}:{src}/tests OPENBLAS_NUM_THREADS=1 python {path}"""
import json, sys
sys.path.insert(0, "/tmp/fuzz40")
from fuzzcore import check
CASE = json.loads({case!r})
status, info = check(CASE)
print(status)
print(json.dumps(info, indent=1, default=str) if not isinstance(info, str) else info)
sys.exit(0 if status == "ok" else 1)
'''


def save(case, status, info, tag):
    os.makedirs(REPROS, exist_ok=True)
    path = f"{REPROS}/{tag}.py"
    with open(path, "w") as f:
        f.write(REPRO.format(desc=describe(case), path=path, src=SRC, case=json.dumps(case)))
    with open(path.replace(".py", ".out"), "w") as f:
        f.write(status + "\n" + (info if isinstance(info, str) else
                                 json.dumps(info, indent=1, default=str)))
    return path


def main():
    seed0, minutes = int(sys.argv[1]), float(sys.argv[2])
    shrink_on = len(sys.argv) < 4 or sys.argv[3] != "noshrink"
    t_end = time.time() + 60 * minutes
    seed, n, bad = seed0, 0, 0
    seen = {}
    while time.time() < t_end:
        case = gen_case(seed) if os.environ.get("GEN") == "orig" else gen_case40(seed)
        t = time.time()
        before = dict(fuzzcore.COUNTS)
        st, info = check(case)
        delta = {k: v - before[k] for k, v in fuzzcore.COUNTS.items() if v != before[k]}
        n += 1
        rec = {"seed": seed, "status": st, "secs": round(time.time() - t, 1),
               "desc": describe(case), "counts": delta, "totals": dict(fuzzcore.COUNTS),
               "cached": (info or {}).get("cached") if isinstance(info, dict) else None}
        if st != "ok":
            rec["info"] = info if isinstance(info, str) else json.loads(
                json.dumps(info, default=str))
        with open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"[{n}] seed={seed} {st} {rec['secs']}s {delta} {describe(case)}", flush=True)
        if st not in ("ok",):
            bad += 1
            print("   ", str(info)[:1500], flush=True)
            save(case, st, info, f"seed{seed}-full")
            key = sig(st, info)
            gl = info.get("gaps") if isinstance(info, dict) else None
            noise = st == "diff" and isinstance(gl, list) and gl and all(
                g.get("gap") is not None and g["gap"] < 1e-4 for g in gl)
            if st == "diff":
                key = (f"diff:{case['model']}:{case['draft']['kind']}:"
                       f"{(case['scheme'] or {}).get('codec')}")
            seen[key] = seen.get(key, 0) + 1
            if noise:
                print("    (noise: gap < 1e-4, not shrunk)", flush=True)
            if shrink_on and st != 'diff' and not noise and seen[key] <= 2:
                small = shrink(case, st, info=info)
                st2, info2 = check(small)
                p = save(small, st2, info2, f"seed{seed}-min")
                print(f"   minimal -> {p}: {st2} {str(info2)[:1500]}", flush=True)
        seed += 1
    print(f"done: {n} cases, {bad} failing; counts {fuzzcore.COUNTS}", flush=True)


if __name__ == "__main__":
    main()
