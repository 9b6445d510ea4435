"""bench=spec: the plan's speculative decoding against draft=none, measured in one run.

Two workloads, each at B rows for B in `bench.spec_batches`, temperature 0, EOS banned:
- `edit`: an agent-edit prompt (a held-out stdlib file, then an instruction to write it
  again with one change, and its first line), where a capable model restates the prompt's
  code: the case for draft=lookup;
- `free`: code generation continuing the start of a held-out file: draft=mtp's and
  draft=model's case.
Both engines run in this process on one loaded model, through the continuous scheduler
(the anchor's lone row takes the solo path a draft=none user gets), their runs alternating;
each reports its best of `bench.repeats`, and the cell the ratio of their best runs and of
their median runs. Decode tok/s counts tokens after every row's first
one, over the time since then (prefill excluded). With `bench.spec_control`, a second
draft=none engine runs too (`"none again"`): its ratios to the first (`control`) are what
two equal engines read in these runs, the noise a draft's ratio is read against.

Also: the verify cost, a forward over B rows of 1 + k tokens against a plain decode step
at the same B and context, for k = 1..draft.k (what a proposal costs before acceptance).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from appliance.plan import ExecutionPlan

WORKLOADS = ("edit", "free")
AGAIN = "none again"  # the A/A contender (bench.spec_control)
EDIT = "\n\n# The same module again, with `_` prefixes removed from private names:\n"


def _heldout_texts() -> list[str]:
    from appliance.embedded.train import load_corpus

    _, _, heldout = load_corpus()
    return [text for _, text in heldout]


def prompts(tokenizer, workload: str, rows: int, context: int) -> list[list[int]]:
    files = [tokenizer.encode(t, add_special_tokens=False) for t in _heldout_texts()]
    files = [ids for ids in files if len(ids) >= 2 * context] or [sum(files, [])]
    out = []
    for r in range(rows):
        ids = files[r % len(files)]
        start = (r // len(files)) * 97 % max(1, len(ids) - context)  # later rows start later
        body = ids[start:start + context]
        if workload == "edit":
            first = tokenizer.decode(body).splitlines(keepends=True)[:1]
            body = body + tokenizer.encode(EDIT + "".join(first), add_special_tokens=False)
        out.append(body)
    return out


class _Row:
    """Collects one request's tokens (the scheduler's submitter interface)."""

    def __init__(self, request, rid: int):
        self.request, self.id, self.cancelled = request, rid, False
        self.times: list[float] = []  # when each token was delivered
        self.finished = None

    @property
    def first(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def n(self) -> int:
        return len(self.times)

    def cancel(self) -> None:
        self.cancelled = True

    def deliver(self, event) -> None:
        from appliance.engine.types import Finished

        if isinstance(event, Finished):
            self.finished = event
        else:
            self.times.append(time.perf_counter())


def _run_batch(scheduler, reqs) -> dict:
    """Decode tok/s of the batch: `tok_s` from the moment every row has its first token to
    the last row's end (the rows that finish first leave a tail of fewer rows); `full_tok_s`
    only while all B rows decode (every row has its first token, none has its last), the
    rate at B rows that a server whose batch stays full sees."""
    rows = [_Row(r, i) for i, r in enumerate(reqs)]
    for r in rows:
        scheduler.add(r)
    while scheduler.has_work():
        scheduler.step()
    t_end = time.perf_counter()
    bad = [r.finished.error for r in rows if r.finished.error]
    if bad:
        raise RuntimeError(f"rows failed: {bad[:2]}")
    t0 = max(r.first for r in rows)  # every row decoding from here on
    t1 = min(r.times[-1] for r in rows)  # ... until the first row's last token
    tokens = sum(r.n - 1 for r in rows)
    full = sum(t0 < t <= t1 for r in rows for t in r.times)
    accepted = sum(r.finished.accepted_prediction_tokens for r in rows)
    rejected = sum(r.finished.rejected_prediction_tokens for r in rows)
    return {"tokens": tokens, "decode_s": round(t_end - t0, 4),
            "tok_s": round(tokens / max(1e-9, t_end - t0), 2),
            "full_tokens": full, "full_s": round(t1 - t0, 4),
            "full_tok_s": round(full / (t1 - t0), 2) if t1 > t0 else None,
            "accepted": accepted, "rejected": rejected}


def _scheduler(model, tokenizer, plan: ExecutionPlan, rows: int, draft):
    from appliance.engine.budget import Budget, KVShape
    from appliance.engine.build import make_drafter
    from appliance.engine.continuous import ContinuousScheduler
    from appliance.engine.kv import Scheme, cores

    cores.use(plan.batch.attention_threads)  # as the engine thread does
    drafter, control = make_drafter(draft, model, plan.model.dtype, plan.batch.prefill_chunk,
                                    model_dir=_dir(plan))
    budget = Budget(plan.batch.kv_budget_bytes, KVShape.for_plan(plan))
    return ContinuousScheduler(model, set(tokenizer.eos_token_ids), max(rows, 1),
                               plan.batch.prefill_chunk, budget, scheme=Scheme.from_plan(plan.kv),
                               drafter=drafter, control=control,
                               compile_step=plan.batch.compile_step)


def _warm(scheduler, reqs) -> None:
    """Build this batch size's shapes, as a server's start-up burst does: with a draft,
    speculative steps too (`warmup.Alternating`; the adaptive control would decode a short
    batch plainly). Without, a fresh H200 process paid its first speculative step's
    compiles, 22.4 s, inside the first measured run."""
    from appliance.engine.warmup import Alternating

    ctl = scheduler.control
    if ctl is not None:
        scheduler.control = scheduler._batch.control = Alternating(ctl.k)
    try:
        _run_batch(scheduler, reqs)
    finally:
        scheduler.control = scheduler._batch.control = ctl


def _dir(plan: ExecutionPlan) -> str:
    from appliance.bench.prompts import model_dir

    return str(model_dir(plan))


def verify_cost(model, plan: ExecutionPlan, rows: int, context: int, ks: list[int],
                repeats: int, seed: int = 0) -> dict:
    """Seconds of a plain decode step, and of a speculative step with k proposals per row
    (the plan's drafter proposing, for a draft model or MTP head; fixed tokens for lookup,
    whose proposals cost next to nothing), at B rows of `context` tokens (random ids)."""
    import mlx.core as mx

    from appliance.bench.kv import NEVER, _prompts
    from appliance.engine.build import make_drafter
    from appliance.engine.compiled import CompiledDecode
    from appliance.engine.kv import Scheme, cores
    from appliance.engine.sampling import make_sampler
    from appliance.engine.speculate import WHOLE_BUFFER
    from appliance.engine.step import BatchStep
    from appliance.engine.types import SamplingParams

    drafter, control = make_drafter(plan.draft, model, plan.model.dtype,
                                    plan.batch.prefill_chunk, model_dir=_dir(plan))
    proposes = drafter is not None and drafter.method in ("model", "mtp")
    cores.use(plan.batch.attention_threads)
    step = BatchStep(model, set(), rows, plan.batch.prefill_chunk, Scheme.from_plan(plan.kv),
                     drafter=drafter if proposes else None, control=control,
                     compiled=CompiledDecode(model) if plan.batch.compile_step else None,
                     compile_verify=WHOLE_BUFFER)
    sampler = make_sampler(SamplingParams(temperature=0.0))
    for p in _prompts(seed, rows, context, plan.model.vocab_size):
        step.insert([p], NEVER, sampler, params=SamplingParams())
    while len(step._decode) < rows:
        step.tick()
    d = step._decode

    def plain():
        toks, _ = d.step(step.model)
        step._observe(d.uids, [[t] for t in toks], step=True)

    def spec(k):
        pend = d.next_tokens.tolist()
        if proposes:
            drafts, qs = drafter.propose(d, pend, [k] * rows)
        else:
            drafts, qs = [[(p + 1) % plan.model.vocab_size] * k for p in pend], None
        d.verify(step.model, pend, drafts, qs, compiled=step._verify_compiled)
        if proposes:
            drafter.settle(d)
        mx.eval(d.next_tokens)

    def timed(fn, *a) -> float:
        fn(*a)  # warm-up (shapes compile once)
        best = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(8):
                fn(*a)
            mx.eval(d.next_tokens)
            best.append((time.perf_counter() - t) / 8)
        return min(best)

    base = timed(plain)
    out = {"rows": rows, "context": context, "plain_step_s": round(base, 6),
           "proposer": plan.draft.kind if proposes else "fixed tokens", "verify": []}
    for k in ks:
        t = timed(spec, k)
        out["verify"].append({"k": k, "seconds": round(t, 6), "vs_plain": round(t / base, 3)})
    return out


def _ratios(a: dict, b: dict) -> dict:
    """Contender a's tok/s over b's: best runs, median runs, per repeat, all-B window."""
    out = {"ratio": round(a["tok_s"] / b["tok_s"], 3),
           # (a launch-bound H200's runs of one contender spread by up to 1.7x: the ratio
           # of medians is the steadier reading where the best runs disagree)
           "median_ratio": round(statistics.median(a["runs_tok_s"])
                                 / statistics.median(b["runs_tok_s"]), 3),
           # each of a's runs against b's in the same repeat: a machine's drift over the
           # runs (+-10-20% on a 2-core CPU) meets both sides of a pair alike
           "paired_ratio": round(statistics.median(
               x / y for x, y in zip(a["runs_tok_s"], b["runs_tok_s"], strict=True)), 3)}
    if b["full_tok_s"]:
        out["full_ratio"] = round(a["full_tok_s"] / b["full_tok_s"], 3)
    return out


def run_spec(plan: ExecutionPlan, cfg, path: Path, tokenizer) -> dict:
    import mlx.core as mx

    from appliance.bench.progress import bar
    from appliance.engine import runner
    from appliance.engine.types import GenerationRequest, SamplingParams
    from appliance.plan.draft import DraftPlan

    model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
    bias = {i: -100.0 for i in tokenizer.eos_token_ids}
    sampling = SamplingParams(temperature=0.0, logit_bias=bias)
    contenders = {"none": DraftPlan(kind="none")}
    if plan.draft.kind != "none":
        contenders[plan.draft.kind] = plan.draft
    if cfg.spec_control:  # (with draft=none too: the runs' spread alone)
        contenders[AGAIN] = DraftPlan(kind="none")
    results = []
    with bar(f"spec: {' vs '.join(contenders)}", len(cfg.spec_workloads) * len(cfg.spec_batches),
             cfg.progress) as advance:
        for workload, rows in [(w, b) for w in cfg.spec_workloads for b in cfg.spec_batches]:
            ps = prompts(tokenizer, workload, rows, cfg.spec_context)
            reqs = [GenerationRequest(p, cfg.decode_tokens, sampling) for p in ps]
            warm = [GenerationRequest(p[:64], 8, sampling) for p in ps]
            cell = {"workload": workload, "rows": rows}
            scheds = {name: _scheduler(model, tokenizer, plan, rows, draft)
                      for name, draft in contenders.items()}
            for sched in scheds.values():
                _warm(sched, warm)
            runs = {name: [] for name in scheds}
            names = list(scheds)
            for i in range(cfg.repeats):  # alternating, each in turn first: the machine's
                for name in names[i % len(names):] + names[:i % len(names)]:  # drift meets
                    runs[name].append(_run_batch(scheds[name], reqs))  # all alike
            for name, rs in runs.items():
                best = max(rs, key=lambda r: r["tok_s"])
                cell[name] = {**best, "runs_tok_s": [r["tok_s"] for r in rs],
                              "runs_full_tok_s": [r["full_tok_s"] for r in rs],
                              # (which runs speculated: the control decides per run)
                              "runs_accepted": [r["accepted"] for r in rs],
                              "full_tok_s": max(r["full_tok_s"] or 0 for r in rs)}
            del scheds
            mx.clear_cache()
            if plan.draft.kind != "none":
                cell.update(_ratios(cell[plan.draft.kind], cell["none"]))
            if AGAIN in cell:
                cell["control"] = _ratios(cell[AGAIN], cell["none"])
            results.append(cell)
            advance()
    out = {"draft": plan.draft.kind, "k": plan.draft.k, "cells": results}
    if cfg.spec_verify_cost:
        ks = list(range(1, max(plan.draft.k, 1) + 1))
        out["verify_cost"] = [verify_cost(model, plan, rows, cfg.spec_context, ks,
                                          cfg.repeats) for rows in cfg.spec_batches]
    return out


def spec_text(doc: dict) -> str:
    r = doc["result"]
    lines = [f"speculative decoding: draft={r['draft']} (k={r['k']}) against draft=none",
             f"{'workload':<8} {'B':>3} {'none tok/s':>11} {'draft tok/s':>12} {'ratio':>6} "
             f"{'all-B ratio':>11} {'median':>6} {'paired':>6} {'accepted':>9} {'rejected':>9}"
             f"  A/A (best/median/paired)"]
    for c in r["cells"]:
        d = c.get(r["draft"], c["none"])
        full = c.get("full_ratio")
        aa = c.get("control")
        lines.append(f"{c['workload']:<8} {c['rows']:>3} {c['none']['tok_s']:>11.1f} "
                     f"{d['tok_s']:>12.1f} {c.get('ratio', 1.0):>6.2f} "
                     f"{'-' if full is None else format(full, '.2f'):>11} "
                     f"{c.get('median_ratio', 1.0):>6.2f} {c.get('paired_ratio', 1.0):>6.2f} "
                     f"{d['accepted']:>9} {d['rejected']:>9}  " + (
                         '-' if aa is None else f"{aa['ratio']:.2f} / {aa['median_ratio']:.2f}"
                         f" / {aa['paired_ratio']:.2f}"))
    lines.append("(ratio: tok/s from every row's first token to the last row's end; all-B "
                 "ratio: only while all B rows decode; ratio and all-B ratio compare each "
                 "contender's best run, median its median run, paired the median of each "
                 "draft run over the none run of the same repeat; A/A: a second draft=none "
                 "engine's ratios to the first, the runs' own spread)")
    for v in r.get("verify_cost", []):
        costs = ", ".join(f"k={x['k']}: {x['vs_plain']:.2f}x" for x in v["verify"])
        lines.append(f"verify cost at B={v['rows']} ({v['context']} tokens), against a plain "
                     f"step of {v['plain_step_s'] * 1e3:.2f} ms: {costs}")
    return "\n".join(lines)
