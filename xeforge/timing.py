"""Gate 3's statistics: medians, IQRs, the A/A noise margin, the speedup decision and roofline plausibility.

Owns: turning the interleaved per-call times the worker measured into a decision — at one shape
(:func:`decide`) and over every timed shape (:func:`decide_shapes`: a weighted objective, no shape slower than its
own A/A margin allows) — and sizing the GPU-side delay that hides host launch overhead (:func:`delay_flushes`),
with one timed call that is measured again when the delay did not cover the host (:func:`timed_call`). The
measurement loop (rotated buffers, A B A B order) happens in :mod:`xeforge.worker`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Stats:
    median_ms: float
    iqr_ms: float
    q1_ms: float
    q3_ms: float
    n: int

    @classmethod
    def of(cls, xs: list[float]) -> "Stats":
        q1, q3 = quantile(xs, 0.25), quantile(xs, 0.75)
        return cls(statistics.median(xs), q3 - q1, q1, q3, len(xs))

    def as_dict(self) -> dict:
        return asdict(self)


def delay_flushes(host_ms: float, flush_ms: float, cover: float = 4.0, floor_ms: float = 0.5,
                  cap_ms: float = 20.0) -> int:
    """How many L2-flush writes to queue before a timed call's start event so the device is still busy with them
    when the host finishes issuing the call.

    After the full synchronisation the device queue is empty; without a delay the start event fires at once and
    the measured interval includes the host's Python and launch overhead (``host_ms``), which varies from call
    to call and is not the kernel's time (in a model, the next launch overlaps the previous kernel). The writes
    cover ``cover`` times the host time measured in the warm-up, and at least ``floor_ms``: host time jitters
    (another process compiling on the same CPUs doubles it), and a write more costs only device time outside
    the timed interval. At least 1 (the L2 flush itself), at most ``cap_ms`` of delay.
    """
    if flush_ms <= 0 or host_ms != host_ms or flush_ms != flush_ms:
        return 1
    if math.isinf(host_ms):  # the cap
        return max(1, int(cap_ms // flush_ms))
    need = math.ceil(round(max(cover * max(host_ms, 0.0), floor_ms) / flush_ms, 6)) + 1
    return max(1, min(need, max(1, int(cap_ms // flush_ms))))


#: times a timed call is measured again when the device ran out of queued delay before the host had issued it
LATE_RETRIES = 3


def timed_call(rt, call, l2_bytes: int | None, delay: int, flush_ms: float,
               retries: int = LATE_RETRIES) -> tuple[float, int, int]:
    """One timed call on ``rt`` (a :class:`xeforge.devices.Runtime`): full sync, ``delay`` L2-flush writes, start
    event, ``call()``, end event. Returns (device ms, late starts, the delay it ended with).

    A start is late when the device has already reached the start event by the time the host has issued the call
    (``Event.query()``): the device waited on the host inside the timed interval, which then holds host time, not
    only the kernels'. Another process on the same CPUs (a lane compiling, six at once on one GPU) stalls the host
    for longer than the warm-up measured: on an H100 (2026-12-07) one A/A pair at 16 x 4096 x 4096 timed 1.47x apart
    that way, and its 94% margin kept a 1.93x candidate out. A late call is measured again with twice the delay, up
    to ``retries`` times (and :func:`delay_flushes`' cap); the last measurement stands either way, and the count is
    reported."""
    late = 0
    cap = delay_flushes(float("inf"), flush_ms)
    while True:
        rt.synchronize()
        rt.flush_l2(l2_bytes, repeats=delay)
        start, end = rt.event(), rt.event()
        start.record()
        call()
        caught_up = start.query()
        end.record()
        rt.synchronize()
        if not caught_up or late >= retries:
            return start.elapsed_time(end), late, delay
        late += 1
        delay = max(delay, min(2 * delay, cap))


def paired_ratios(a: list[float], b: list[float]) -> list[float]:
    """Per-pair speedups a_i / b_i of interleaved measurements (b faster -> ratio > 1)."""
    return [x / y for x, y in zip(a, b) if y > 0]


def noise_margin(aa_a: list[float], aa_b: list[float], floor: float) -> float:
    """The margin a candidate must beat: how far an A/A comparison strays from 1, at least ``floor``.

    Uses the larger of the A/A median ratio's distance from 1 and half the ratios' IQR, doubled for safety.
    """
    ratios = paired_ratios(aa_a, aa_b)
    if not ratios:
        return floor
    med = statistics.median(ratios)
    spread = (quantile(ratios, 0.75) - quantile(ratios, 0.25)) / 2
    return max(floor, 2 * max(abs(med - 1.0), spread))


@dataclass
class Decision:
    speedup: float  # median(incumbent) / median(candidate)
    margin: float
    accepted: bool
    incumbent: Stats
    candidate: Stats
    implausible: str | None = None  # set when the candidate beats the roofline floor
    flagged: bool = False  # speedup above the report flag (e.g. 10x)

    def as_dict(self) -> dict:
        d = asdict(self)
        return d

    def summary(self) -> str:
        verdict = "faster" if self.accepted else "not faster beyond the noise margin"
        return (f"{verdict}: speedup {self.speedup:.3f}x (incumbent {self.incumbent.median_ms:.4f} ms "
                f"IQR {self.incumbent.iqr_ms:.4f}, candidate {self.candidate.median_ms:.4f} ms IQR "
                f"{self.candidate.iqr_ms:.4f}); needed > {1 + self.margin:.3f}x")


def decide(inc: list[float], cand: list[float], margin: float, floor_s: float | None, flag_above: float) -> Decision:
    si, sc = Stats.of(inc), Stats.of(cand)
    speedup = si.median_ms / sc.median_ms if sc.median_ms > 0 else float("inf")
    implausible = None
    if floor_s is not None and sc.median_ms * 1e-3 < floor_s:
        implausible = (f"candidate median {sc.median_ms:.4f} ms is below the roofline floor {floor_s * 1e3:.4f} ms "
                       "(flop/peak, bytes/bandwidth): a measurement or correctness bug, or the spec's `flop` / "
                       "`bytes` count more than the minimum work (a multi-pass algorithm's traffic, say: they are "
                       "the floor any kernel must pay)")
    accepted = implausible is None and speedup > 1.0 + margin
    return Decision(speedup, margin, accepted, si, sc, implausible, speedup > flag_above)


@dataclass
class ShapeVerdict:
    """Gate 3 at one timed shape: its weight in the objective and the incumbent-vs-candidate decision (with the
    shape's own A/A margin)."""

    variant: str
    weight: float
    decision: Decision

    def as_dict(self) -> dict:
        d = self.decision
        return {"variant": self.variant, "weight": self.weight, "speedup": d.speedup, "margin": d.margin,
                "incumbent": d.incumbent.as_dict(), "candidate": d.candidate.as_dict(), "implausible": d.implausible}


@dataclass
class ShapesDecision:
    """Gate 3 over every timed shape: adopted only when the weighted objective (geometric mean of the speedups)
    clears the weighted margin and no shape is slower than 1 minus its own margin."""

    shapes: list[ShapeVerdict]
    untimed: list[str]  # shapes not timed: the primary did not improve, so the rest were not worth the time
    objective: float
    margin: float
    accepted: bool
    blocked_by: str | None  # the shape slower beyond its margin (the worst of them)
    implausible: str | None
    improved: list[str] = field(default_factory=list)  # the shapes faster beyond their own margin

    def summary(self) -> str:
        first = self.shapes[0].decision
        if len(self.shapes) == 1:
            text = first.summary()
            if self.untimed:
                text += (f"; not timed at {', '.join(self.untimed)} (the primary shape {self.shapes[0].variant} "
                         "did not improve)")
            return text
        per = ", ".join(f"{s.variant} {s.decision.speedup:.3f}x" for s in self.shapes)
        gains = f"; faster at {', '.join(self.improved)}" if self.improved else ""
        if self.blocked_by is not None:
            worst = next(s for s in self.shapes if s.variant == self.blocked_by)
            return (f"not adopted: slower at {self.blocked_by}: {worst.decision.speedup:.3f}x, beyond its margin "
                    f"(needed >= {1 - worst.decision.margin:.3f}x at every shape){gains}; per shape: {per}")
        verdict = "faster" if self.accepted else "not faster beyond the noise margin"
        return (f"{verdict}: objective {self.objective:.3f}x over {len(self.shapes)} shapes (weighted geometric mean; "
                f"{per}){gains}; needed > {1 + self.margin:.3f}x, no shape below its margin")


def decide_shapes(shapes: list[ShapeVerdict], untimed: list[str]) -> ShapesDecision:
    """The decision over ``shapes`` (the primary first); ``untimed``: the shapes left out after the primary."""
    weights = [s.weight for s in shapes]
    total = sum(weights)
    objective = math.exp(sum(w * math.log(s.decision.speedup) for w, s in zip(weights, shapes)
                             if 0 < s.decision.speedup < float("inf")) / total) if total else 1.0
    if any(s.decision.speedup == float("inf") for s in shapes):
        objective = float("inf")
    margin = sum(w * s.decision.margin for w, s in zip(weights, shapes)) / total if total else 0.0
    implausible = next((f"{s.variant}: {s.decision.implausible}" if len(shapes) > 1 else s.decision.implausible
                        for s in shapes if s.decision.implausible), None)
    slower = [s for s in shapes if s.decision.speedup < 1.0 - s.decision.margin]
    blocked = min(slower, key=lambda s: s.decision.speedup).variant if slower else None
    improved = [s.variant for s in shapes if s.decision.speedup > 1.0 + s.decision.margin]
    if len(shapes) == 1:  # one timed shape (or the primary did not improve): its own decision, as before
        accepted = shapes[0].decision.accepted
    else:
        accepted = implausible is None and blocked is None and objective > 1.0 + margin
    return ShapesDecision(shapes, list(untimed), objective, margin, accepted, blocked, implausible, improved)


def roofline_floor(flop: float | None, nbytes: float | None, peak_flops: float | None, bw: float | None) -> float | None:
    """Lower bound on the time in seconds: max(flop / peak, bytes / bandwidth); None if nothing is known."""
    terms = []
    if flop and peak_flops:
        terms.append(flop / peak_flops)
    if nbytes and bw:
        terms.append(nbytes / bw)
    return max(terms) if terms else None
