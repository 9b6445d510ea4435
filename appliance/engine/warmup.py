"""The start-up burst (`server.warmup`): a fleet's first busy minute, before /health says ok.

A GPU backend builds kernels the first time it meets a shape. On a fresh H200 the first
batch past 7 rows of an 8B 4-bit model stalled every agent's first turn ~45 s (the same
command again: no stall; docs/benchmarks.md, 8th and 9th sessions). So the server runs, once,
what such a minute runs: every row of the batch at once, one prompt a full prefill chunk
long, all rows decoding together (every batch size from 1 up as they join), through a
throwaway scheduler of the plan's own kind: no prefix cache entries, no counters touched.
Where a draft is set, it speculates too, at every batch size (`Alternating`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from appliance.engine.speculate import Control
from appliance.engine.types import Finished, GenerationRequest, SamplingParams

log = logging.getLogger(__name__)


class _Row:
    """A submitter that keeps only how its request ended."""

    def __init__(self, request: GenerationRequest, rid: int):
        self.request, self.id, self.cancelled, self.finished = request, rid, False, None

    def deliver(self, event) -> None:
        if isinstance(event, Finished):
            self.finished = event


@dataclass
class Alternating(Control):
    """The burst's control where a draft is set: a batch size decodes plainly the first
    time it is met (as rows join), speculates the first step each later time (as rows
    leave) and then every other step, each row proposing up to k. So the burst builds a
    speculative step's shapes (the verify pass, a drafter's passes) at every batch size as
    well as a plain step's. The adaptive control decodes plainly until a batch size has
    settled, so a burst never speculated: on an H200 the first speculative step of a fresh
    process then took 22.4 s (compiles) inside a client's request, and a verify pass at a
    new batch size took 50-90 ms against 5-8."""

    adaptive: bool = False
    sizes: set = field(default_factory=set)  # the batch sizes that speculated
    _seen: set = field(default_factory=set)
    _last: tuple = (0, False)  # the last step's rows, and whether it speculated

    def speculate(self, rows: int, settled: bool = True, left=None) -> bool:
        spec = rows in self._seen and (rows != self._last[0] or not self._last[1])
        self._seen.add(rows)
        self._last = (rows, spec)
        if spec:
            self.sizes.add(rows)
        return spec


def burst(rows: int, chunk: int, vocab: int, eos_ids: set[int],
          max_context: int) -> list[GenerationRequest]:
    """`rows` requests arriving together: the first one a prefill chunk long (within the
    context limit, which the KV budget always holds for one row), the others short; each
    decodes until the last has joined (EOS banned so none leaves early). Then one more, for
    `warm_up` to send late: longer than any of them has grown to (where the context limit
    allows), so it cannot take a finished row's slot and the batch re-forms around it."""
    decode = 8 + 2 * rows
    never_eos = SamplingParams(logit_bias={t: -100.0 for t in eos_ids if t < vocab})
    usable = [t for t in range(3, vocab) if t not in eos_ids]  # (low ids: specials)
    out = []
    for r in range(rows + 1):
        n = chunk if r == 0 else chunk + decode + 16 if r == rows else 16
        n = max(1, min(n, max_context - decode))
        out.append(GenerationRequest([usable[(r * 131 + j * 7) % len(usable)] for j in range(n)],
                                     decode, never_eos))
    return out


def warm_up(scheduler, requests: list[GenerationRequest]) -> float:
    """Drive `requests` (a `burst`) through `scheduler` to the end; the seconds it took. A
    row that fails fails the start-up: the same pass would fail the first client.

    All but the last are sent at once. Once the first row has finished, a short one is sent
    again and then the last, long one: they join rows still decoding, the short one into a
    finished row's slot (on CUDA finished rows are held until rows join: step.HOLD;
    `_Decoding.reuse`), the long one by re-forming the batch around the finished rows left,
    as a fleet's batch is all day. With finished rows held, the burst once never re-formed,
    and on a fresh H200 every request stalled ~3.3 s from when the first clients' rows
    finished (8B shape, 22nd session; likely that re-forming's first kernel builds, not
    measured apart: the device time was spent)."""
    t0 = time.perf_counter()
    rows = [_Row(r, -1 - i) for i, r in enumerate(requests[:-1])]
    for r in rows:
        scheduler.add(r)
    late = []
    while scheduler.has_work():
        scheduler.step()
        if not late and any(r.finished for r in rows) and not all(r.finished for r in rows):
            late = [_Row(requests[i], -1 - len(rows) - k) for k, i in enumerate((-2, -1))]
            for r in late:
                scheduler.add(r)
    rows += late
    bad = [r.finished.error for r in rows if r.finished is None or r.finished.error]
    if bad:
        raise RuntimeError(f"the start-up warm-up failed: {bad[0]}")
    seconds = time.perf_counter() - t0
    log.info("warm-up: %d requests, %.1f s", len(rows), seconds)
    return seconds
