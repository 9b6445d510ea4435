"""bench=spec: the plan's draft against draft=none on one loaded model, in one run, and the
verify cost. Speed is never asserted; the structure and the contenders' equal work are."""

from __future__ import annotations

import json

from appliance.bench.spec import spec_text
from appliance.config.schema import BenchConfig

SMALL = dict(workload="spec", spec_workloads=["edit", "free"], spec_batches=[1, 2],
             spec_context=64, decode_tokens=12, repeats=2, spec_verify_cost=True)


def test_spec_bench_runs_both_contenders_alternately_on_the_same_rows(tmp_path, monkeypatch):
    from conftest import resolve_overrides

    from appliance.bench import run, spec

    order, controls, real = [], [], spec._run_batch
    engines: list = []  # the schedulers, in order of their first run (A/A: two none)

    def logged(sched, reqs):
        if sched not in engines:
            engines.append(sched)
        order.append("none" if sched.drafter is None else "draft")
        controls.append(type(sched._batch.control).__name__)
        return real(sched, reqs)

    monkeypatch.setattr(spec, "_run_batch", logged)
    overrides = ["model.dtype=float32", "draft=lookup", "draft.k=3"]
    plan = resolve_overrides(overrides)
    doc = run(plan, BenchConfig(**SMALL), tmp_path, tuple(overrides))
    r = doc["result"]
    assert (r["draft"], r["k"]) == ("lookup", 3)
    assert [(c["workload"], c["rows"]) for c in r["cells"]] == [
        ("edit", 1), ("edit", 2), ("free", 1), ("free", 2)]
    for c in r["cells"]:
        for name in ("none", "lookup", spec.AGAIN):
            assert len(c[name]["runs_tok_s"]) == 2 and c[name]["tok_s"] == max(
                c[name]["runs_tok_s"])
            assert c[name]["tokens"] == c["none"]["tokens"]  # the same work (EOS banned)
            # while all B rows decode: a part of the same tokens, in a part of the time
            assert c[name]["full_tokens"] <= c[name]["tokens"]
            assert c[name]["full_s"] <= c[name]["decode_s"]
            if c["rows"] == 1:  # one row: every token after its first is in that window
                assert c[name]["full_tokens"] == c[name]["tokens"]
            assert c[name]["full_tok_s"] == max(c[name]["runs_full_tok_s"])
            assert len(c[name]["runs_accepted"]) == 2 and c[name]["accepted"] in c[name][
                "runs_accepted"]
        assert c["none"]["accepted"] == c["none"]["rejected"] == 0
        assert c["ratio"] == round(c["lookup"]["tok_s"] / c["none"]["tok_s"], 3)
        assert c["full_ratio"] == round(c["lookup"]["full_tok_s"] / c["none"]["full_tok_s"], 3)
        med = [sorted(c[n]["runs_tok_s"]) for n in ("lookup", "none")]  # (2 runs: the mean)
        assert c["median_ratio"] == round(sum(med[0]) / sum(med[1]), 3)
        pairs = [d / n for d, n in zip(c["lookup"]["runs_tok_s"], c["none"]["runs_tok_s"],
                                       strict=True)]
        assert c["paired_ratio"] == round(sum(pairs) / 2, 3)  # (2 runs: the mean)
        # A/A: the second draft=none engine against the first, by the same measures
        aa = [sorted(c[n]["runs_tok_s"]) for n in (spec.AGAIN, "none")]
        assert c["control"]["median_ratio"] == round(sum(aa[0]) / sum(aa[1]), 3)
        assert c["control"]["ratio"] == round(c[spec.AGAIN]["tok_s"] / c["none"]["tok_s"], 3)
        assert c[spec.AGAIN]["accepted"] == 0
    # per cell: a warm-up each, then the runs alternate, each engine first in turn (drift
    # on the machine meets all alike)
    assert order == (["none", "draft", "none"] * 2 + ["draft", "none", "none"]) * 4
    assert len(engines) == 4 * 3  # three engines a cell: none, the draft, none again
    # the draft's warm-up speculates as a server's start-up burst does; its runs adapt
    assert controls == (["NoneType", "Alternating", "NoneType", "NoneType", "Control",
                         "NoneType", "Control", "NoneType", "NoneType"]) * 4
    assert [v["rows"] for v in r["verify_cost"]] == [1, 2]
    assert all([x["k"] for x in v["verify"]] == [1, 2, 3] for v in r["verify_cost"])
    text = spec_text(doc)
    assert "draft=lookup (k=3) against draft=none" in text and "verify cost at B=2" in text
    assert "all-B ratio" in text and "median" in text and "paired" in text and "A/A" in text
    assert json.loads((tmp_path / "bench.json").read_text())["result"] == r


def test_the_a_a_control_runs_with_draft_none_and_goes_when_turned_off(tmp_path):
    """`bench.spec_control` is honoured either way: with draft=none the two draft=none
    engines still run (the runs' spread alone); turned off, only the contenders run."""
    from conftest import resolve_overrides

    from appliance.bench import run, spec

    small = {**SMALL, "spec_workloads": ["free"], "spec_batches": [1], "spec_verify_cost": False}
    plan = resolve_overrides(["model.dtype=float32", "draft=none"])
    cell = run(plan, BenchConfig(**small), tmp_path / "on", ())["result"]["cells"][0]
    assert set(cell) >= {"none", spec.AGAIN, "control"} and "ratio" not in cell
    assert cell["control"]["ratio"] == round(cell[spec.AGAIN]["tok_s"] / cell["none"]["tok_s"], 3)
    plan = resolve_overrides(["model.dtype=float32", "draft=lookup"])
    cell = run(plan, BenchConfig(**{**small, "spec_control": False}), tmp_path / "off",
               ())["result"]["cells"][0]
    assert spec.AGAIN not in cell and "control" not in cell and "ratio" in cell
