"""Speculative decoding inside the continuous batch: proposers, acceptance, adaptive control.

Each decoding row proposes its own 0..k draft tokens (`Drafter.propose`); `BatchStep`
verifies every row's proposals in one forward pass (right-padded, then rolled back per
row), and each row keeps its own accepted prefix. Rows without proposals decode in the
same pass. The rule that keeps it lossless at any temperature is in `accept`.

`Control` decides how many tokens a row may propose: k shrinks with the row's measured
acceptance, a row whose drafts keep failing pauses, and the batch stops speculating at
a batch size where speculative steps measured slower than plain ones, so speculation is
never the slower choice for long.

The package: `control` (how many tokens a row proposes, and whether the batch speculates),
`shapes` (the CUDA shape policy), `accept` (which drafts a row keeps), `lookup` (prompt
lookup), `drafters` (a draft model) and `mtp_drafter` (an MTP head). The verify pass itself is
`appliance/engine/verify.py`.
"""

from appliance.engine.speculate.accept import accept_deterministic, accept_sampled
from appliance.engine.speculate.control import PROBE, WARM, Control, DraftCounts
from appliance.engine.speculate.drafters import ModelDrafter
from appliance.engine.speculate.lookup import LookupDrafter
from appliance.engine.speculate.mtp_drafter import MTPDrafter, Tapped
from appliance.engine.speculate.shapes import WHOLE_BUFFER

__all__ = [
    "PROBE",
    "WARM",
    "WHOLE_BUFFER",
    "Control",
    "DraftCounts",
    "LookupDrafter",
    "MTPDrafter",
    "ModelDrafter",
    "Tapped",
    "accept_deterministic",
    "accept_sampled",
]
