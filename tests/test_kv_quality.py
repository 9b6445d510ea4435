"""Quality gates for the KV schemes: perplexity change vs native on held-out text.

Each scheme, with its default `keep_layers` and with every layer quantized, decodes the same
held-out windows as native (appliance/quality.py: C context tokens prefilled in one pass,
then T tokens teacher-forced one at a time over the stored KV) on the embedded model in
float32. A scheme fails when its perplexity rises past its envelope. The envelopes are fixed:
never widen one to make a test pass. A scheme the plan refuses as not built yet is skipped.
Full figures (KL, greedy agreement): `python -m appliance.quality`, docs/kv-quality.md.
"""

from __future__ import annotations

import sys

import pytest

from appliance import quality
from appliance.engine.kv import Scheme
from appliance.plan import PlanError

# 4 windows x (256 context + 32 teacher-forced): the file takes ~27 s of CPU on a 2-core VM
# with MLX's reference BLAS (TurboQuant's 'none' cases are a third of it), and the figures sit
# far inside the envelopes (docs/kv-quality.md).
WINDOWS, CONTEXT, TEACHER = 4, 256, 32
ENVELOPE = {  # the most perplexity may rise, in %
    "affine8": 0.5,
    "k8v4": 1.5,
    "affine4": 3.0,
    "turboquant": 3.0,  # 4-bit
    "turboquant-3.5": 5.0,
}
HELDOUT_3_11 = ["asyncio/events.py", "curses/ascii.py", "distutils/__init__.py",
                "distutils/command/config.py", "email/mime/image.py", "ensurepip/__main__.py",
                "functools.py", "graphlib.py", "multiprocessing/popen_forkserver.py"]


MODELS = ("tiny",)  # the `loaded` fixture runs over these


@pytest.fixture(scope="module")
def model(loaded):
    return loaded[1]


@pytest.fixture(scope="module")
def ref(loaded):
    """Native's run over the windows, computed once."""
    _, model, tok = loaded
    rows = quality.heldout_windows(tok, WINDOWS, CONTEXT + TEACHER + 1)
    return quality.reference(model, rows, CONTEXT)


def plan_or_skip(overrides: list[str]):
    try:
        return quality.plan_for(overrides)
    except PlanError as e:
        if quality.unavailable(e):
            pytest.skip(f"{' '.join(overrides)}: {e.problems[0]}")
        raise


def test_every_scheme_has_an_envelope():
    assert set(quality.SCHEMES) == set(ENVELOPE)


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the corpus is Python 3.11's")
def test_heldout_files_are_the_trained_models():
    assert [rel for rel, _ in quality.heldout_texts()] == HELDOUT_3_11  # docs/embedded-model.md


@pytest.mark.parametrize("keep", list(quality.KEEP))
@pytest.mark.parametrize("label", list(quality.SCHEMES))
def test_perplexity_within_envelope(label, keep, model, ref):
    plan = plan_or_skip([*quality.SCHEMES[label], *quality.KEEP[keep]])
    assert plan.kv.quantized_layers, "nothing is quantized: the gate would measure native"
    ppl_native, ppl, kl = quality.compare(model, ref, Scheme.from_plan(plan.kv))
    delta = 100 * (ppl / ppl_native - 1)
    figures = (f"{label} keep_layers={list(plan.kv.keep_layers)}: ppl {ppl:.4f} vs native "
               f"{ppl_native:.4f} ({delta:+.3f}%, envelope +{ENVELOPE[label]}%), "
               f"mean KL {kl:.6f}")
    assert kl > 0, f"identical to native, so the quantized path did not run: {figures}"
    assert delta <= ENVELOPE[label], figures


def test_gate_catches_a_coarse_scheme(model, ref):
    """2-bit keys and values on every layer leave the 4-bit envelope: the gate can fail."""
    plan = quality.plan_for(["kv=affine4", "kv.key_bits=2", "kv.value_bits=2",
                             "kv.keep_layers=[]"])
    ppl_native, ppl, _ = quality.compare(model, ref, Scheme.from_plan(plan.kv))
    assert 100 * (ppl / ppl_native - 1) > ENVELOPE["affine4"]
