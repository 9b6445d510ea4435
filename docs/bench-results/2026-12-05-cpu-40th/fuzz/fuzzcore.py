"""Differential fuzzing core: run one case with draft=none and with a drafter, compare."""
from __future__ import annotations

import contextlib
import json
import random
import traceback

import appliance  # noqa: F401
import mlx.core as mx
from harness import Collector

from appliance import oracle
from appliance.engine import GenerationRequest, SamplingParams
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler
from appliance.engine.kv import Scheme
from appliance.engine.kv.affine import AffineCodec
from appliance.engine.kv.turboquant import TurboCodec
from appliance.engine.prefix_cache import PrefixCache, RamTier
from appliance.engine.kv.quantized import QuantRowCache
import inspect, os, shutil, tempfile
from appliance.engine.ssd_tier import SsdTier

NEW = "encoded_from" in inspect.signature(RamTier).parameters  # 813c71c or later
COUNTS = {"ram_cut_enc": 0, "ram_cut_float": 0, "ssd_cut_enc": 0, "ssd_cut_float": 0,
          "ram_cut_enc_at_start": 0, "ram_cut_enc_near_start": 0, "ssd_load_whole_enc": 0}

_orig_cut = RamTier._cut


def _counted_cut(self, key, n):
    enc = any(type(c) is QuantRowCache for e in self._chain(key) for c in e.cache)
    out = _orig_cut(self, key, n)
    if enc:
        COUNTS["ram_cut_enc"] += 1
        d = n - getattr(self, "encoded_from", 0)
        assert d >= 0, f"encoded entry cut below kv.start: n={n} start={self.encoded_from}"
        COUNTS["ram_cut_enc_at_start"] += d == 0
        COUNTS["ram_cut_enc_near_start"] += 0 <= d <= 2
    else:
        COUNTS["ram_cut_float"] += 1
    assert all(c.offset == n for c in out), [(type(c).__name__, c.offset) for c in out]
    for c in out:
        if type(c) is QuantRowCache:
            assert all(x.shape[-2] == n for x in (*c.keys, *c.values))
    return out


RamTier._cut = _counted_cut
_orig_load = SsdTier.load


def _counted_load(self, tokens, n, entry=None):
    out = _orig_load(self, tokens, n, entry)
    if out is not None:
        enc = any(type(c) is QuantRowCache for c in out)
        if entry is not None:
            COUNTS["ssd_cut_enc" if enc else "ssd_cut_float"] += 1
            assert all(c.offset == n for c in out), [(type(c).__name__, c.offset) for c in out]
        elif enc:
            COUNTS["ssd_load_whole_enc"] += 1
    return out


SsdTier.load = _counted_load


def _ram(case):
    start = case["scheme"]["start"] if case.get("scheme") else 0
    return RamTier(1 << 30, encoded_from=start) if NEW else RamTier(1 << 30)


def _ssd(case, root):
    start = case["scheme"]["start"] if case.get("scheme") else 0
    kw = {"encoded_from": start} if NEW else {}
    return SsdTier(root, 1 << 30, "fuzzfp", **kw)
from appliance.engine.speculate import Control, LookupDrafter, ModelDrafter, MTPDrafter
from appliance.models.mtp import MTPHead

_MODELS = {}


def model(name):
    if name not in _MODELS:
        _MODELS[name] = oracle.load(oracle.model_path(name), "float32")
    return _MODELS[name]


def full_layers(m):
    from mlx_lm.models.cache import KVCache, make_prompt_cache
    return tuple(i for i, c in enumerate(make_prompt_cache(m)) if type(c) is KVCache)


# ---------------------------------------------------------------- proposers / controls
class Scripted:
    """Proposes each row's known plain output, wrong where (pos*7+salt) % every == 0."""
    method, fed = "scripted", False

    def __init__(self, outputs: list, every: int, salt: int):
        self.rows = sorted(outputs, key=lambda po: -len(po[0]))  # (prompt, out), longest first
        self.every, self.salt = every, salt

    def _find(self, ctx):
        for p, o in self.rows:
            if len(ctx) >= len(p) and ctx[:len(p)] == p:
                return p, o
        return None, None

    def _prop(self, ctx, at0, k):
        p, o = self._find(ctx)
        if p is None:
            return [(7 * j + 11) % 4000 + 3 for j in range(k)]
        at = len(ctx) - len(p) + at0
        return [t if (at + j + self.salt) % self.every else (t + 1) % 4000 + 3
                for j, t in enumerate(o[at:at + k])]

    def propose(self, batch, pend, ks):
        out = []
        for toks, pp, k in zip(batch.tokens, pend, ks, strict=True):
            out.append(self._prop([*toks, pp], 0, k) if k else [])
        return out, None

    def propose_ahead(self, batch, ks):
        return [self._prop(list(toks), 0, k + 1) if k else []
                for toks, k in zip(batch.tokens, ks, strict=True)]

    def make_cache(self):
        return []

    def settle(self, batch):
        pass

    def forget(self, uid):
        pass


class Pattern(Control):
    """Speculates / rests by a seeded random pattern (deterministic per run)."""

    def setup(self, seed, p_spec, p_rest):
        self._rng = random.Random(seed)
        self._p, self._pr = p_spec, p_rest
        self._rrng = random.Random(seed + 1)
        return self

    def speculate(self, rows, settled=True, left=None):
        return self._rng.random() < self._p

    def resting(self, rows, ahead):
        return self._pr > 0 and self._rrng.random() < self._pr


def plain_won(control):
    from appliance.engine.speculate.control import WARM
    for _ in range(WARM):
        control.timed(1, True, 0.010, 2, 1)
        control.timed(1, False, 0.001, 1, 1)
    return control


# ---------------------------------------------------------------- flags
@contextlib.contextmanager
def flags(case, spec):
    from appliance.engine import prefill, rows, step, verify
    from appliance.engine.kv import native
    from appliance.engine.speculate import drafters, mtp_drafter
    saved = []

    def setf(mod, name, val):
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, val)

    f = case["flags"]
    if f.get("cuda"):
        for mod in (prefill, rows, step, verify, drafters, mtp_drafter):
            setf(mod, "WHOLE_BUFFER", True)
        setf(step, "HOLD", True)
    if f.get("grid"):
        setf(native, "GRID_TRIM", True)
    if f.get("hold"):
        setf(step, "HOLD", True)
    if spec:
        if f.get("ahead") is not None:
            setf(step, "AHEAD", f["ahead"])
        if f.get("compact"):
            setf(verify, "COMPACT_AT", -1.0)
        if f.get("lag"):
            setf(drafters, "LAG_MAX", f["lag"])
            setf(mtp_drafter, "LAG_MAX", f["lag"])
    try:
        yield
    finally:
        for mod, name, val in reversed(saved):
            setattr(mod, name, val)


def make_scheme(case, m):
    s = case.get("scheme")
    if not s:
        return None
    full = full_layers(m)
    layers = tuple(i for i in s["layers"] if i in full) or full
    hd = {"tiny": 64}.get(case["model"], 16)
    AFF = {"affine": (32, 8, 4), "k8v4": (64, 8, 4), "affine8": (64, 8, 8),
           "affine4": (64, 4, 4), "k8v4g32": (32, 8, 4), "k4v8": (64, 4, 8)}
    if s["codec"] == "turbo":
        codec = TurboCodec(hd, s.get("kb", 4), s.get("vb", 4))
    else:
        codec = AffineCodec(*AFF[s["codec"]])
    return Scheme(codec, layers, s["start"])


def make_draft(case, m, plain_outs):
    d = case["draft"]
    kind = d["kind"]
    if kind == "lookup":
        drafter = LookupDrafter(1, 3)
    elif kind == "scripted":
        drafter = Scripted(plain_outs, d.get("every", 5), d.get("salt", 0))
    elif kind == "model":
        drafter = ModelDrafter(model("tiny-llama")[0], d.get("chunk", 16))
    elif kind == "mtp":
        mx.random.seed(0)
        drafter = MTPDrafter(MTPHead.for_model(m), m, d.get("chunk", 16))
    c = d["control"]
    if c == "fixed":
        control = Control(d["k"], adaptive=False)
    elif c == "adaptive":
        control = Control(d["k"])
    elif c == "plain_won":
        control = plain_won(Control(d["k"]))
    else:
        control = Pattern(d["k"], adaptive=False).setup(d["seed"], d["p_spec"], d["p_rest"])
    return drafter, control


def sampling(row):
    s = row.get("sampling")
    if s == "seeded":
        return SamplingParams(temperature=0.8, top_p=0.95, seed=row.get("seed", 7),
                              repetition_penalty=row.get("rep"))
    if s == "unseeded":
        return SamplingParams(temperature=0.9)
    return SamplingParams()


def execute(case, spec, ref_round1=None, logprobs_all=None, mode=None):
    """Runs the case's rounds through one scheduler (mode "restart": round 2 on a fresh
    scheduler, fresh RAM tier, over the SSD tier round 1 wrote). Returns {row_name: dict}."""
    m, tok = model(case["model"])
    f = case["flags"]
    mode = mode or case.get("cache", "ram")
    root = tempfile.mkdtemp(prefix="ssd", dir="/tmp/fuzz40/ssd") if case.get("prefix") \
        and mode == "restart" else None

    def make_prefix():
        if not case.get("prefix"):
            return None
        if mode == "restart":
            return PrefixCache(ram=_ram(case), ssd=_ssd(case, root))
        return PrefixCache(ram=_ram(case))

    budget = Budget(1 << 40, KVShape(1, 0, 0, 0))
    out = {}
    with flags(case, spec):
        def make_sched():
            draft = make_draft(case, m, case["_plain_outs"]) if spec else (None, None)
            return ContinuousScheduler(m, set(tok.eos_token_ids), case["max_rows"],
                                oracle.BATCH_PREFILL_CHUNK, Budget(1 << 40, KVShape(1, 0, 0, 0)),
                                prefix=make_prefix(),
                                scheme=make_scheme(case, m), prefill_rows=f.get("prefill_rows", 1),
                                drafter=draft[0], control=draft[1],
                                compile_step=f.get("compile_step", False),
                                compile_verify=f.get("compile_verify", True))
        s = make_sched()
        try:
          for rnd, rows in enumerate(case["rounds"]):
            if rnd and mode == "restart":
                s.close()
                s = make_sched()
            colls = {}
            for r in rows:
                prompt = list(r["prompt"])
                cps = tuple(r.get("checkpoints", ()))
                if r.get("ext"):  # round 2: a round-1 row's prompt + its output[:n] + extra
                    base, n, extra = r["ext"]
                    src = (ref_round1 if ref_round1 is not None else out)[base]
                    div = r.get("div")
                    if div == "branch":  # parts inside the round-1 prompt at k
                        k = min(n, len(src["prompt"]) - 1)
                        prompt = list(src["prompt"][:k]) + [(src["prompt"][k] + 1) % 4000 + 3] \
                            + list(extra)
                    else:
                        prompt = list(src["prompt"]) + list(src["tokens"][:n])
                        if div == "turn" and n < len(src["tokens"]):
                            prompt.append((src["tokens"][n] + 1) % 4000 + 3)
                        prompt += list(extra)
                    if r.get("cp"):
                        cps = tuple(sorted({c for c in (case.get("shared_len", 0),
                                                        len(src["prompt"])) if c}))
                lp = logprobs_all if logprobs_all is not None else r.get("logprobs")
                colls[r["name"]] = Collector(GenerationRequest(
                    prompt, r["max_tokens"], sampling(r), lp, cps))
                colls[r["name"]]._prompt = prompt
            events = []
            for r in rows:
                events.append((r["tick"], "insert", r["name"]))
                if r.get("remove") is not None:
                    events.append((r["tick"] + r["remove"], "remove", r["name"]))
            drive(s, events, colls)
            for name, c in colls.items():
                out[name] = {"prompt": c._prompt, "tokens": c.tokens,
                             "reason": c.finished.reason.value if c.finished else None,
                             "error": c.finished.error if c.finished else "no finish",
                             "cached": c.finished.cached_tokens if c.finished else None,
                             "cancelled": c.cancelled,
                             "top": [e.top for e in c.events if hasattr(e, "top")]}
        finally:
            if mode == "restart":
                s.close()
                shutil.rmtree(root, ignore_errors=True)
    return out


def drive(scheduler, events, rows, max_ticks=20_000):
    events = sorted(events, key=lambda e: (e[0], e[1] != "remove"))
    for tick in range(max_ticks):
        while events and events[0][0] <= tick:
            _, what, r = events.pop(0)
            if what == "remove":
                rows[r].cancel()
            else:
                scheduler.add(rows[r])
        if not events and not scheduler.has_work():
            return
        scheduler.step()
        scheduler.check_integrity()
    raise AssertionError("schedule did not finish")


def compare(case, plain, spec):
    """List of (row, index, plain_tok, spec_tok, note)."""
    diffs = []
    rowdef = {r["name"]: r for rows in case["rounds"] for r in rows}
    for name, p in plain.items():
        q = spec[name]
        if q["error"]:
            diffs.append((name, -1, None, None, "spec error: " + str(q["error"])[:300]))
            continue
        if rowdef[name].get("sampling") == "unseeded":
            continue
        a, b = p["tokens"], q["tokens"]
        if rowdef[name].get("remove") is not None:
            n = min(len(a), len(b))
            a, b = a[:n], b[:n]
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append((name, i, a[i] if i < len(a) else None, b[i] if i < len(b) else None,
                          f"len plain {len(a)} spec {len(b)}"))
        elif rowdef[name].get("remove") is None and p["reason"] != q["reason"]:
            diffs.append((name, len(a), None, None, f"reason {p['reason']} vs {q['reason']}"))
    return diffs


CACHED_LOG = []


def check(case, want_gap=True):
    """Returns (status, info). status: ok | diff | crash | plain_crash."""
    case = json.loads(json.dumps(case))
    case["_plain_outs"] = []
    try:
        plain = execute(case, False)
    except Exception:
        return "plain_crash", traceback.format_exc()[-2000:]
    for n, p in plain.items():
        if p["error"]:
            return "plain_crash", f"row {n}: {p['error']}"
    case["_plain_outs"] = [(p["prompt"], p["tokens"]) for p in plain.values()]
    r1 = {n: plain[n] for r in case["rounds"][0] for n in [r["name"]]}
    try:
        spec = execute(case, True, ref_round1=r1)
    except Exception:
        return "crash", traceback.format_exc()[-2500:]
    diffs = compare(case, plain, spec)
    ramssd = []
    if case.get("prefix") and case.get("cache") == "restart" and len(case["rounds"]) > 1:
        try:
            ram = execute(case, False, ref_round1=r1, mode="ram")
        except Exception:
            return "crash", "ram-mode rerun: " + traceback.format_exc()[-2500:]
        for r in case["rounds"][1]:
            a, b = plain[r["name"]], ram[r["name"]]
            if r.get("sampling") == "unseeded" or r.get("remove") is not None:
                continue
            if a["cached"] == b["cached"] and a["tokens"] != b["tokens"]:
                ramssd.append((r["name"], a["cached"], a["tokens"], b["tokens"]))
        CACHED_LOG.append({"ssd": {n: plain[n]["cached"] for n in plain},
                           "ram": {n: ram[n]["cached"] for n in ram}})
    cached = {n: (plain[n]["cached"], spec[n]["cached"]) for n in plain}
    if not diffs and not ramssd:
        return "ok", {"cached": cached}
    if not diffs:
        return "ramssd", {"ramssd": ramssd, "cached": cached}
    info = {"diffs": diffs, "cached": cached, "ramssd": ramssd}
    if want_gap:
        info["gaps"] = gaps(case, plain, diffs)
    return "diff", info


def gaps(case, plain, diffs):
    """The plain run's top-2 logprob gap at each parting token (plain rerun with logprobs=2)."""
    try:
        lp = execute(case, False, logprobs_all=2)
    except Exception as e:
        return f"logprob rerun failed: {e}"
    res = []
    for name, i, a, b, _ in diffs:
        if i < 0:
            continue
        same = lp[name]["tokens"] == plain[name]["tokens"]
        top = lp[name]["top"]
        if i < len(top) and top[i] and len(top[i]) >= 2:
            (t0, l0), (t1, l1) = top[i][0], top[i][1]
            res.append({"row": name, "i": i, "gap": l0 - l1, "top2": [t0, t1],
                        "spec_is_second": b == t1, "logprob_run_same_tokens": same})
        else:
            res.append({"row": name, "i": i, "gap": None, "logprob_run_same_tokens": same})
    return res
