"""How many tokens each row proposes, and whether the batch speculates at all."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from appliance.engine.speculate.shapes import WHOLE_BUFFER

# Most plain steps run without asking for drafts after asking found none (`Control.found`):
# on CUDA, where a step that asks loses its pipelining; not on CPU, where a step's compute
# dwarfs that and waiting only missed drafts (edit bursts).
IDLE_MAX = 4 if WHOLE_BUFFER else 0


@dataclass
class DraftCounts:
    """Tokens proposed and accepted, for /stats and one request's usage."""

    proposed: int = 0
    accepted: int = 0

    def add(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


WARM = 2  # measured steps of each kind before the batch picks the faster one
WINDOW = 9  # a mode's step time: the median of its last WINDOW measurements
PROBE = WARM + 1  # steps of a probe of the slower mode (its first one is not a measurement)
# What a losing speculation's probes may cost, as a share of the steps between them: the
# gap to the next probe is its last probe's loss over this (then doubles while it loses).
# Issue 12 asks B=16 never below 0.95x: an H200 probe at 16 rows (mtp) lost the time of
# 10-90 plain steps, one-off compiles included, where a 512-token run is ~530 steps.
SHARE = 0.02
# Steps a batch size must have lasted before it is explored: exploring pays a switch into
# speculation and a drafter's first pass, which only a batch size that lasts can repay. As
# the rows of a batch left one by one, each row count explored once on the H200 (mtp, 4
# rows: 59-234 ms against a 3-8 ms plain step) and was gone a few steps later.
EXPLORE_AFTER = 8
# What speculation must win its measured step time by. Its costs outlast its own steps: the
# slots its rejected drafts leave masked widen the rows every later step attends over (up
# to verify.COMPACT_AT), and each switch of mode restarts the pipeline. Near break-even
# (B=16 on a 2-core CPU) the plain step is the safe choice.
MARGIN = 1.05
LONGEST = 16  # the most a losing speculation's probe gap grows to, over its first gap
# Where finished rows stay in the batch (CUDA), the rows it waits on decide (`Control.ends`):
# at most this many rows, those with the most tokens left (within one step of the most),
# and the weight of a step's yield in a row's moving average.
CRITICAL = 2
ROW_ALPHA = 0.3


def _bucket(rows: int) -> int:
    """Batch sizes share the idle wait by power of two (rows finish one by one)."""
    return 1 << max(0, rows - 1).bit_length()


def _near(rows: int) -> int:
    """How far (in rows) another batch size's decision carries as is: a step's cost, and so
    speculation's margin, changes little with one row more or less in 8."""
    return max(1, rows // 8)


@dataclass
class _Row:
    accept: float = 0.6  # moving average of accepted / proposed
    paused: int = 0  # steps left before the row proposes again
    gain: float | None = None  # moving average of the tokens a speculative step emits


@dataclass
class _Mode:
    """One batch size's choice between speculative and plain steps."""

    probe_at: int = 0  # the step at which the slower mode is probed again (0: not planned)
    gap: int = 0  # steps between probes: doubles while the winner holds
    winner: bool | None = None  # the mode before the current probe
    ratio: float | None = None  # a speculative step's time over a plain one's, both fresh


@dataclass
class Control:
    """How many tokens each row may propose this step, and whether the batch speculates.

    Per row (where a pass feeds each row only its own proposals, not `full_width`): k
    follows the expected run of accepted tokens, a/(1-a) for acceptance a, plus one (capped
    at `k`); below `pause_below` the row pauses for `pause_steps` steps, then probes again
    with one token. Per batch size (each row count: a step's time grows with its
    rows, so pooling sizes let a smaller batch's cheaper steps stand for a larger one's):
    the time of speculative and plain steps and the tokens a speculative step yields per row
    are measured, and the faster mode runs. The slower one is
    probed again for a few steps after `explore_every` steps (when speculation is the slower
    one, after its last probe's loss over SHARE), then after twice as many each time it
    loses again (up to LONGEST times as many; at once where it lost hopelessly on CUDA),
    so probing costs a small share of a long run and speculation is never the slower
    choice for long. A batch size not measured yet takes the decision of its neighbours:
    one within `_near` rows as is; otherwise speculation that lost at B rows loses at more
    (and down to B/2 rows where it could not have won at any acceptance, `_hopeless`), and
    one that won at B wins at fewer. Where finished rows stay in the batch (`by_rows`:
    CUDA), the yield that decides is not the batch size's but that of the rows the batch
    waits on (`ends`), each row's own moving average (`emitted`). `adaptive=False` always
    proposes k."""

    k: int
    adaptive: bool = True
    pause_below: float = 0.1
    pause_steps: int = 4
    explore_every: int = 32
    idle_max: int = IDLE_MAX
    full_width: bool = WHOLE_BUFFER
    # Steps slow down as the rows' contexts grow (a compute-bound CPU's attention), and a
    # step's time grows with its rows: measure each row count on its own, and switch modes
    # only on a fresh probe. Not on CUDA, where a step's time is flat in both (launch-bound)
    # and a fresh probe's two steps are too few against its one-off compiles (an H200 read
    # lookup at B=4 at 0.99-1.07x with this, against 1.42-1.62x without).
    drift: bool = not WHOLE_BUFFER
    _rows: dict[int, _Row] = field(default_factory=dict)
    _ends: float | None = None  # this step's yield of the rows the batch waits on (`ends`)
    waits_on: list[int] = field(default_factory=list)  # those rows (uids), this step
    _times: dict[tuple[int, bool], deque] = field(default_factory=dict)  # (B, spec) -> s/step
    _gain: dict[int, float] = field(default_factory=dict)  # B -> tokens per row per spec step
    _ticks: dict[int, int] = field(default_factory=dict)
    _modes: dict[int, _Mode] = field(default_factory=dict)
    _idle: dict[int, int] = field(default_factory=dict)  # B -> plain steps left, no asking
    _idle_gap: dict[int, int] = field(default_factory=dict)  # B -> the last such wait
    _stale: dict[int, deque | None] = field(default_factory=dict)  # B -> times before a probe
    _spent: dict[int, list] = field(default_factory=dict)  # B -> its last probe's step times
    _plain_since: dict[int, bool] = field(default_factory=dict)  # B -> a plain step since
    _streak: tuple[int, int] = (0, 0)  # (rows, steps the batch has had that many)

    def budget(self, uid: int) -> int:
        """Tokens row `uid` may propose. Where a verify pass feeds every row `k + 1`
        tokens anyway (`full_width`: CUDA's shape policy), a shorter proposal saves
        nothing and only loses the accepted runs it cuts: every row may propose k (on an
        H200, lookup at B=16 emitted 3.1 tokens a row per verify step with per-row budgets
        against 3.7 without)."""
        if not self.adaptive or self.full_width:
            return self.k
        r = self._rows.setdefault(uid, _Row())
        if r.paused:
            r.paused -= 1
            return 1 if not r.paused else 0  # the last paused step probes with one token
        run = r.accept / max(1e-6, 1 - r.accept)  # expected accepted run, plus the one
        return max(1, min(self.k, math.ceil(run) + 1))  # that would end it

    def record(self, uid: int, proposed: int, accepted: int) -> None:
        if not self.adaptive or not proposed:
            return
        r = self._rows.setdefault(uid, _Row())
        r.accept = 0.7 * r.accept + 0.3 * accepted / proposed
        if r.accept < self.pause_below:
            r.paused, r.accept = self.pause_steps, self.pause_below + 0.1

    def _secs(self, b: int, spec: bool) -> float | None:
        """A mode's step time at bucket `b`: the median of its recent steps, or the least
        of the first two. One-off slow steps (a new shape compiled: on CUDA a verify pass
        at a new batch size or key length took 50-90 ms against 5-8, measured on an H200)
        only ever make a step slower, and never move the median while they are a minority
        of the window; a lasting change moves it within WINDOW // 2 + 1 steps."""
        times = self._times.get((b, spec))
        if not times:
            return None
        return statistics.median(times) if len(times) > 2 else min(times)

    def _measured(self, b: int) -> bool | None:
        """Whether speculation is faster at bucket `b`, once both modes are measured there:
        the tokens a speculative step yields per row (the rows the batch waits on, where
        known: `ends`) against what its time would decode."""
        if min(len(self._times.get((b, s), ())) for s in (True, False)) < WARM:
            return None
        margin = MARGIN if self.drift else 1.0
        return self._yield(b) * self._secs(b, False) >= self._secs(b, True) * margin

    def _yield(self, b: int) -> float:
        """Tokens a speculative step yields a row at bucket `b` (the rows the batch waits
        on, where known: `ends`)."""
        return self._gain[b] if self._ends is None else self._ends

    def _ratio(self, b: int) -> float | None:
        """A speculative step's time over a plain one's at bucket `b` (or the batch size
        that decides it), as measured now."""
        source = self._source(b)
        t_spec = source is not None and self._secs(source, True)
        t_plain = source is not None and self._secs(source, False)
        return t_spec / t_plain if t_spec and t_plain else None

    @property
    def by_rows(self) -> bool:
        """Whether the decision follows the rows the batch waits on (`ends`): where finished
        rows stay in the batch (CUDA), so its size, and each size's measured yield, stay
        those of the full batch as it drains."""
        return self.adaptive and not self.drift

    def ends(self, left: dict[int, int]) -> list[int]:
        """The live rows the batch's end waits on, of `left` (uid: tokens left): those with
        the most, within one speculative step of the most, CRITICAL at most. A step's cost
        is the whole batch's either way, so once rows finish at different steps, what
        decides when the batch is done is how fast these rows go, not the others' mean:
        on an H200 at B=16 (edit), the rows that copied most finished first, the tail of
        the rest took two thirds of a run, and lookup read 0.91-0.96x draft=none while its
        all-rows phase was 1.25x (28th session; a replay of those rows' own yields at the
        measured step times read 0.93-1.02x on their mean, 1.00-1.08x on these rows)."""
        if not left:
            return []
        most = max(left.values())
        near = sorted((u for u, n in left.items() if n >= most - self.k - 1),
                      key=lambda u: -left[u])
        return near[:CRITICAL]

    def emitted(self, uid: int, tokens: int) -> None:
        """The tokens a speculative step emitted for row `uid` (or would have: `Shadow`)."""
        r = self._rows.setdefault(uid, _Row())
        r.gain = tokens if r.gain is None else (1 - ROW_ALPHA) * r.gain + ROW_ALPHA * tokens

    def _winner(self, b: int) -> bool | None:
        source = self._source(b)
        return None if source is None else self._measured(source)

    def _source(self, b: int) -> int | None:
        """The batch size whose measurement decides bucket `b`: `b` itself once measured,
        else a neighbour's that carries (see the class docstring); None if none does."""
        if self._measured(b) is not None:
            return b
        for other in sorted(self._gain, key=lambda o: abs(o - b)):
            won = self._measured(other)
            near = self.drift and abs(other - b) <= _near(b)
            if won is not None and (near or other <= b and not won
                                    or other >= b and won
                                    or not won and 2 * b >= other and self._hopeless(other)):
                return other
        return None

    def _hopeless(self, b: int) -> bool:
        """Whether speculation lost at bucket `b` by more than any acceptance could make
        up: a step of it costs more than the k + 1 plain steps that every draft kept would
        replace. It then loses at half as many rows too (a step's cost falls with its rows
        no faster than a plain one's until then: measured ~4x at 16 rows and 4 on an H200,
        ~7x at 16 rows on a 2-core CPU), and exploring there only pays a drafter's catch-up
        (on a CPU 150-440 ms a step as rows left one by one, against 15 ms plain)."""
        t_spec, t_plain = self._secs(b, True), self._secs(b, False)
        return t_spec > (self.k + 1) * t_plain

    def speculate(self, rows: int, settled: bool = True,
                  left: dict[int, int] | None = None) -> bool:
        """Whether a batch of `rows` rows should speculate this step. `settled`: whether
        this step can be timed (no prefill since the last one, the batch unchanged for a
        while); a batch size with no decision yet measures both modes only then, and
        decodes plainly meanwhile (as without a draft), and a probe starts only then (an
        H200 probed at 16 rows while rows still joined: three speculative steps, 38-104 ms
        against 5, that measured nothing). `left`: each live row's tokens left (uid:
        count), for `by_rows`."""
        if not self.adaptive:
            return True
        self._ends = None
        if self.by_rows and left:
            self.waits_on = self.ends(left)
            gains = [g for g in (self._rows.get(u, _Row()).gain for u in self.waits_on)
                     if g is not None]
            self._ends = sum(gains) / len(gains) if gains else None
        last, steps = self._streak
        self._streak = (rows, steps + 1 if rows == last else 0)
        idle = _bucket(rows)
        if self._idle.get(idle):
            self._idle[idle] -= 1
            return False
        b = rows if self.drift else idle
        n = self._ticks[b] = self._ticks.get(b, 0) + 1
        m = self._modes.get(b) if self.drift else None
        if m is not None and n == m.probe_at and not settled:
            m.probe_at += 1  # a probe starts on a step that can be timed
            return m.winner
        if m is not None and m.probe_at <= n < m.probe_at + PROBE:
            return self._probe(b, m, n)
        if m is not None and n == m.probe_at + PROBE and not self._probed(b, m):
            m.probe_at = n + m.gap  # the probe measured too little: keep the mode, try later
            return m.winner
        winner = self._winner(b)
        if winner is None:  # measuring both, in turn (PROBE steps: the first of each run is
            # no measurement), once the batch size has lasted
            steps = self._streak[1] - EXPLORE_AFTER
            return settled and steps >= 0 and steps % (2 * PROBE) < PROBE
        m = self._modes.setdefault(b, _Mode())
        if not m.probe_at:
            first, _ = self._gaps(b, winner)
            m.probe_at, m.gap, m.winner, m.ratio = n + first, first, winner, self._ratio(b)
        if n < m.probe_at:
            if winner == m.winner:
                return winner
            if not self.drift:
                # On CUDA a step's time follows the host (launch-bound), and only the
                # running mode's times are fresh: a slow spell made plain steps look
                # slower than speculation's older ones (an H100, model at B=16: plain
                # 2.3 -> 4.5 ms a step against a 10.4 ms speculative one measured before;
                # it switched and lost; 15 of 31 runs speculated, 0.93x). So between
                # probes the two compare as they last did when both were fresh; a yield
                # that moved (lookup's shadow drafts, the rows the batch waits on) still
                # switches at once.
                now = self._yield(self._source(b))
                if m.ratio is not None and (now >= m.ratio) == m.winner:
                    return m.winner
                first, _ = self._gaps(b, winner)
                m.winner, m.gap, m.probe_at = winner, first, n + first
                return winner
            # The running mode fell below the other's last rate. That rate is as old as
            # the other's last probe, and steps slow down as the rows' contexts grow
            # (attention): measure the other afresh before switching to it.
            if not settled:
                return m.winner
            m.probe_at = n
            return self._probe(b, m, n)
        if n == m.probe_at and not settled:
            m.probe_at += 1  # (a probe of steps that cannot be timed measures nothing)
            return m.winner
        if n < m.probe_at + PROBE:  # a probe (with `drift`, run above)
            return not m.winner
        # The probe is over: back off while the winner holds. A switch is checked again
        # soon, when both modes' times are fresh (the one it leaves may be old too: a
        # server's batch of this size last ran over shorter or longer contexts).
        held = winner == m.winner
        # (both modes' times are fresh here: the probe's, and the steps just before it)
        m.ratio = self._ratio(b)
        first, longest = self._gaps(b, winner)
        if held:  # (after a switch's quick check, the usual gap again; never below
            m.gap = max(first, min(2 * m.gap, longest))  # what the last probe cost)
        else:
            m.gap = WINDOW if self.drift else first
        m.probe_at, m.winner = n + m.gap, winner
        return winner

    def alone(self) -> bool:
        """Whether a lone row should decode unbatched (the scheduler's solo path, which runs
        the model over a plain cache and never speculates): where plain steps won at one
        row and its next probe is not due. A lone row in the batched step pays its padding,
        masks and shape policy: on an H200 the embedded model's plain steps there ran at
        ~840 tok/s against ~1050 solo, so mtp and model, pausing rightly, read 0.79-0.80x
        draft=none at B=1 (29th session). Solo steps count towards the probe (`alone_step`),
        and the first lone row after it runs batched again, and probes."""
        return self.resting(1, 1)

    def resting(self, rows: int, ahead: int) -> bool:
        """Whether plain steps won at this batch size and its next probe is more than
        `ahead` steps away: an MTP engine's plain steps and prefill passes then skip the
        hidden states its head would read (an H200 read mtp's plain steps at B=16
        0.94-0.97x draft=none's), and tap again `ahead` steps before the probe, which then
        finds the pairs it would have kept anyway (the last LAG_MAX: `MTPDrafter.skip`)."""
        b = rows if self.drift else _bucket(rows)
        m = self._modes.get(b)
        return self.adaptive and m is not None and m.winner is False \
            and self._ticks.get(b, 0) + ahead < m.probe_at

    def alone_step(self) -> None:
        """A lone row's unbatched step: one plain step at one row, short of the probe."""
        m = self._modes.get(1)
        if m is not None and m.probe_at:
            self._ticks[1] = min(self._ticks.get(1, 0) + 1, m.probe_at - 1)

    def _probe(self, b: int, m: _Mode, n: int) -> bool:
        """A step of the mode that is not running. A probe's verdict rests on its own steps
        alone, compared with the running mode's latest ones."""
        if n == m.probe_at:
            self._stale[b] = self._times.pop((b, not m.winner), None)
        return not m.winner

    def _probed(self, b: int, m: _Mode) -> bool:
        """Whether the probe that just ended measured its mode (a step next to a prefill,
        or the first after a switch, is no measurement); if not, its older times stand."""
        stale, key = self._stale.pop(b, None), (b, not m.winner)
        if len(self._times.get(key, ())) >= WARM:
            return True
        if stale:
            self._times[key] = stale
        return False

    def found(self, rows: int, any_drafts: bool) -> None:
        """Whether a step that asked the rows found anything to propose. Asking costs the
        step its pipelining (the pending tokens are read first): measured on an H200, a
        lookup that never matched ran at 0.76x. So after a step that found nothing, plain
        pipelined steps run for a while without asking: 1 step, then twice as many each
        time in a row, up to `idle_max` (short: an edit's matches come in bursts, and a
        longer wait missed them); a step that finds drafts resets the wait."""
        if not self.adaptive or not self.idle_max:
            return
        b = _bucket(rows)
        if any_drafts:
            self._idle_gap[b] = 0
            return
        self._idle_gap[b] = self._idle[b] = min(self.idle_max,
                                                max(1, 2 * self._idle_gap.get(b, 0)))

    def _gaps(self, b: int, winner: bool) -> tuple[int, int]:
        """The gap before the slower mode's next probe, and the most it may grow to
        (`LONGEST` times the first). Only where a decision is made, not every step."""
        first = self._first_gap(b, winner)
        source = self._source(b)
        if source is not None and source != b and source in self._modes:
            # A decision carried from another batch size backs off as that one's does: its
            # own first gap (`explore_every`, nothing measured here) kept an MTP engine
            # tapped there, within LAG_MAX of a probe, wherever a CPU agents run's row
            # count wandered (2-7 rows: 155 tapped plain steps and every prefill pass).
            first = max(first, self._modes[source].gap)
        longest = LONGEST * first
        if not self.drift and not winner and self._secs(b, True) and self._secs(b, False) \
                and self._hopeless(b):
            # Where a step's cost is flat in the rows' contexts (CUDA), a speculation that
            # lost by more than any acceptance could repay loses the same way at the next
            # probe: its probes start where a loss's back-off ends (an H200 at B=16, mtp
            # and model, 10-15 ms a speculative step against 2.2-3.5 plain: each probe
            # cost a 256-token run 15-30%, every 1000-2000 steps).
            first = longest
        return first, longest

    def _first_gap(self, b: int, winner: bool) -> int:
        """Steps before the slower mode is probed: `explore_every` when speculation wins;
        when it loses, what its last run of steps lost against plain steps (their wall
        time beyond what plain steps would take for the tokens they emitted) over SHARE,
        so probing costs about SHARE of the time (and half as much after each probe it
        loses again, `speculate`).
        That loss counts every speculative step's wall time, one-offs included (`spent`):
        a probe's first step feeds a draft model or MTP head the tokens of the plain steps
        before it and on CUDA builds graphs for shapes it has not met, which the step times
        the decision compares leave out by design."""
        t_spec, t_plain = self._secs(b, True), self._secs(b, False)
        if winner or not t_spec or not t_plain:
            return self.explore_every
        spent = self._spent.get(b) or [t_spec] * PROBE
        lost = sum(spent) - len(spent) * self._gain.get(b, 1.0) * t_plain
        return max(self.explore_every, math.ceil(lost / t_plain / SHARE))

    def spent(self, rows: int, spec: bool, seconds: float) -> None:
        """Any decode step's wall time, timed or not (no prefill ran since the last): the
        speculative steps since the batch size's last plain one are its last probe's cost."""
        b = rows if self.drift else _bucket(rows)
        if not spec:
            self._plain_since[b] = True
            return
        if self._plain_since.get(b, True):
            self._spent[b], self._plain_since[b] = [], False
        self._spent[b].append(seconds)

    def timed(self, rows: int, spec: bool, seconds: float, tokens: int,
              live: int | None = None) -> None:
        """One step's time and the tokens its `live` rows emitted (of the `rows` the step
        ran: finished rows held in the batch emit nothing), so a speculative step's yield is
        per live row, against a plain step's one token per live row. Before, held rows' own
        (discarded) tokens counted, one a step each, over every row: in a batch's tail, 4
        live rows at 2.5 tokens among 16 read 1.4, so speculation looked worse than it was
        just where the slowest rows decide when the batch ends. The yield is smoothed (0.15
        per step), since acceptance varies from step to step far more than a step's time."""
        if seconds <= 0:
            return
        b = rows if self.drift else _bucket(rows)
        self._times.setdefault((b, spec), deque(maxlen=WINDOW)).append(seconds)
        if spec:
            per = tokens / max(1, live if live is not None else rows)
            old = self._gain.get(b)
            self._gain[b] = per if old is None else 0.85 * old + 0.15 * per

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)
