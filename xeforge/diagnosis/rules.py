"""The knowledge base's diagnoses matched against a call's compiled kernels.

Owns: :class:`Diagnoser` — built once per port from the knowledge base (the recognizers and diagnoses that apply
to the device and the installed Triton), it turns the folder the worker wrote for one call into the verdict's
``diagnosis`` (every kernel's facts, and the findings: cause, stage, tactics, source); :func:`evaluate` (one
diagnosis against one kernel's facts) and :func:`tactic_order` (the rules engine's order of a stage's tactics,
with the reason for each one moved first).

A condition on a fact the kernel does not have is false, except ``missing: true``, which holds only when the
recognizer read its IR and found nothing (an unread IR proves nothing).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xeforge.diagnosis.compiler import KernelFacts, read_cost, read_folder
from xeforge.kb.entries import fill
from xeforge.kb.versions import version_applies

#: what the verdict says where no compiled kernel can be read
NO_COMPILER = "the Triton interpreter compiles nothing; run on a GPU for compiler facts"


@dataclass
class Finding:
    id: str
    title: str
    kernel: str
    cause: str
    stage: str
    tactics: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    confidence: str = "derived"
    where: str = ""
    shape: str = ""  # the timed shape it holds at, when that is not the primary one
    gain: float | None = None  # at most this speedup from addressing it, where the diagnosis bounds it (``share``)

    def render(self) -> str:
        at = f" at {self.shape}" if self.shape else ""
        return f"[{self.id}] {self.kernel}{at}: {self.cause} -> {self.stage}" + (
            f" ({', '.join(self.tactics)})" if self.tactics else "")


def _value(facts: dict[str, Any], ref: Any) -> Any:
    return facts.get(ref) if isinstance(ref, str) else ref


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v)


def holds(cond: Any, kf: KernelFacts) -> bool:
    """One condition of a diagnosis (:class:`xeforge.kb.schema.Condition`) on one kernel's facts."""
    facts = kf.facts
    if cond.missing is not None:
        if cond.fact in kf.unknown:
            return False
        return (cond.fact not in facts or facts[cond.fact] in (0, [], None)) == cond.missing
    if cond.fact not in facts:
        return False
    value = facts[cond.fact]
    if cond.above is not None or cond.below is not None:
        x, bound = _number(value), _number(_value(facts, cond.above if cond.above is not None else cond.below))
        if x is None or bound is None:
            return False
        return x > bound if cond.above is not None else x < bound
    if cond.has is not None:
        items = value if isinstance(value, list) else [value]
        return any(cond.has in str(item) for item in items)
    return value == cond.equals or str(value) == str(cond.equals)


def evaluate(entry: Any, kf: KernelFacts) -> Finding | None:
    """``entry`` (a :class:`xeforge.kb.entries.Diagnosis`) on one kernel: the finding, or None."""
    spec = entry.spec
    if not all(holds(c, kf) for c in spec.when):
        return None
    shown = {k: (", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in kf.facts.items()}
    src = [spec.source] if isinstance(spec.source, str) else list(spec.source)
    share = _number(kf.facts.get(spec.share)) if spec.share else None
    return Finding(spec.id, spec.title, kf.kernel, fill(spec.cause, shown), spec.stage, list(spec.tactics), src,
                   spec.confidence, entry.where, gain=round(1 / share, 2) if share and 0 < share < 1 else None)


class Diagnoser:
    """The recognizers and diagnoses of the knowledge base that apply to one device under one Triton."""

    def __init__(self, kb: Any, device_entry: Any, triton: Any, device: Any) -> None:
        def applies(entry: Any) -> bool:
            if device_entry is not None:
                return entry.applies(device_entry, triton)
            # no device entry matched: the backend and the Triton version still gate
            spec = entry.spec
            return ((not spec.backends or device.kind in spec.backends) and not spec.devices
                    and version_applies(spec.range("triton"), spec.range("triton_xpu"), triton))

        self.recognizers = [r for r in getattr(kb, "recognizers", []) if applies(r)]
        self.diagnoses = [d for d in getattr(kb, "diagnoses", []) if applies(d)]
        # the IRs a capture must write for these recognizers (the rest, SASS above all, cost time and say nothing)
        self.irs = {r.spec.ir for r in self.recognizers}
        # facts this backend's recognizers read under other Triton versions only: unknown here, never "missing"
        found = {n for r in self.recognizers for n in (r.spec.fact, r.spec.capture) if n}
        self.unrecognized: dict[str, str] = {}
        for r in getattr(kb, "recognizers", []):
            if r in self.recognizers or (r.spec.backends and device.kind not in r.spec.backends):
                continue
            for name in (r.spec.fact, r.spec.capture):
                if name and name not in found:
                    self.unrecognized.setdefault(name, f"{r.id}: no recognizer of it applies to Triton "
                                                       f"{getattr(triton, 'text', triton)}")
        self.device_cores = getattr(device, "cores", None)
        self.interpreter = bool(getattr(device, "interpreter", False))

    def read(self, folder: Path, trace: Any = None, model: Any = None) -> dict[str, Any]:
        """The verdict's ``diagnosis`` for one call: ``kernels`` (facts), ``findings``, or why there are none."""
        if self.interpreter:
            return {"available": False, "why": NO_COMPILER}
        kernels = read_folder(folder, self.recognizers)
        if not kernels:
            return {"available": False, "why": "the worker wrote no compiled kernel for this call"}
        launches = list(getattr(trace, "launches", []) or [])
        for kf in kernels:
            for name, why in self.unrecognized.items():
                kf.unknown.setdefault(name, why)
            if launches:
                kf.facts["launches"] = len(launches)
                mine = [la for la in launches if la.kernel == kf.kernel]
                grid = next((la.grid for la in mine if isinstance(la.grid, tuple)), None)
                if grid:
                    kf.facts["programs"] = math.prod(int(g) for g in grid)
                asked = {str((getattr(la, "options", None) or {}).get("grf_mode")) for la in mine}
                if mine and kf.facts.get("grf_mode") in ("256", "512") and not asked & {"256", "512", "large"}:
                    kf.facts["grf_recompiled"] = True  # the Intel backend retried with more GRF after spills
            if self.device_cores:
                kf.facts["device_cores"] = self.device_cores
                if "programs" in kf.facts:  # how much of the device one wave of the grid fills
                    kf.facts["core_fill"] = round(kf.facts["programs"] / self.device_cores, 3)
                    kf.facts["idle_cores"] = max(self.device_cores - kf.facts["programs"], 0)
                    # the share of the waves' core time that does work: 288 programs on 132 cores run in 3 waves,
                    # the last with 24 programs: 288 / 396 = 0.727
                    waves = -(-kf.facts["programs"] // self.device_cores)
                    kf.facts["waves"] = waves
                    kf.facts["wave_fill"] = round(kf.facts["programs"] / (waves * self.device_cores), 3)
            if model is not None:
                kf.facts["dot_calls"] = sum(1 for c in model.calls_to("tl.dot") if c.function == kf.kernel)
        findings = merge([f for kf in kernels for d in self.diagnoses if (f := evaluate(d, kf)) is not None])
        out = {"available": True, "kernels": [k.as_dict() for k in kernels], "findings": [asdict(f) for f in findings]}
        cost = read_cost(folder, kernels)
        if cost is not None:
            out["cost"] = cost
        return out


def merge(findings: list[Finding]) -> list[Finding]:
    """One finding per diagnosis and cause: a fact of the call (several launches) holds on each of its kernels
    alike, and is said once, with every kernel it holds on."""
    out: dict[tuple[str, str], Finding] = {}
    for f in findings:
        key = (f.id, f.cause)
        if key in out:
            out[key].kernel += f", {f.kernel}"
        else:
            out[key] = Finding(**asdict(f))
    return list(out.values())


def by_shape(shapes: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One verdict's diagnosis from :meth:`Diagnoser.read` at each timed shape, the primary first: the primary's as
    it is (with its ``shape``), every other shape's kernels and findings under ``by_shape`` (findings tagged with
    the shape), where they were read."""
    (name, first), rest = shapes[0], shapes[1:]
    if not first.get("available"):
        return first  # no facts at the primary shape (the interpreter; nothing captured): why, as read
    out = {**first, "shape": name}
    for name, got in rest:
        if got.get("available"):
            out.setdefault("by_shape", {})[name] = {
                "kernels": got["kernels"], "findings": [{**f, "shape": name} for f in got["findings"]]}
    return out


def findings_of(diagnosis: dict[str, Any] | None) -> list[Finding]:
    """The findings at the primary shape, then those that hold only at another timed shape (``by_shape``: a decode
    shape's idle cores, an odd shape's lost vector width), each naming its shape."""
    if not diagnosis or not diagnosis.get("available"):
        return []
    out = [Finding(**f) for f in diagnosis.get("findings", [])]
    seen = {(f.id, f.kernel) for f in out}
    for shape in diagnosis.get("by_shape") or {}:
        for f in diagnosis["by_shape"][shape].get("findings", []):
            if (f["id"], f["kernel"]) not in seen:
                seen.add((f["id"], f["kernel"]))
                out.append(Finding(**f))
    return out


#: the tactic that gives a class of shapes its own branch
PER_SHAPE = "per-shape-config"


def tactic_order(tactics: list[Any], stage: str, diagnosis: dict[str, Any] | None,
                 lost_at: tuple[str, ...] = ()) -> tuple[list[Any], dict[str, str]]:
    """``tactics`` (objects with ``name``) with those the diagnosis names for ``stage`` first, in the order the
    findings name them; and for each tactic moved, the reason (the finding's id and cause). A finding that holds at
    a shape other than the primary one puts ``per-shape-config`` first among its tactics, where it names it: that
    shape's class gets its own branch there, and a port whose time budget runs out after the launch search (on an
    H100, most corpus GEMMs' one-minute ports) still reaches it. ``lost_at``: the shapes at which the source was
    slower than the incumbent (a carried trial): ``per-shape-config`` goes first of all, so the branch for their
    class keeps what the trial gains everywhere else (on the H200, a persistent loop 1.23x at 4096^3 and 0.95x at
    M = 16 was carried into device_tuning, where a group-swizzle candidate spent the time per-shape-config needed).
    Findings whose diagnosis bounds their gain (``gain``: 32 programs for 132 cores, up to 4.1x) come before the
    others, the largest first: on an H100 (2026-12-07) kb41's spills at the primary shape sent launch-params and
    epilogue-halves first, and the port's time ran out before the branch for M = 16, where 100 of 132 cores idled
    and the port stayed at 0.70x of torch.compile."""
    reasons: dict[str, str] = {}
    if lost_at and any(t.name == PER_SHAPE for t in tactics):
        reasons[PER_SHAPE] = (f"the trial it builds on was slower at {', '.join(lost_at)}: a branch for that "
                              "shape's class keeps the trial's gain at the others")
    found = findings_of(diagnosis)
    for f in sorted(found, key=lambda f: -(f.gain or 0.0)):  # stable: the rest keep their order
        if f.stage != stage:
            continue
        names = list(f.tactics)
        if f.shape and PER_SHAPE in names:
            names = [PER_SHAPE] + [n for n in names if n != PER_SHAPE]
        for name in names:
            at = f" at {f.shape}" if f.shape else ""
            reasons.setdefault(name, f"diagnosis {f.id}{at}: {f.cause}")
    first = [t for name in reasons for t in tactics if t.name == name]
    return first + [t for t in tactics if t not in first], {t.name: reasons[t.name] for t in first}


def describe(diagnosis: dict[str, Any] | None, *, quiet: bool = False) -> list[str]:
    """The lines a user reads: each kernel's facts, each finding, or why there are none (``quiet``: [] then,
    for views that say it once elsewhere)."""
    if not diagnosis:
        return []
    if not diagnosis.get("available"):
        return [] if quiet else [f"compiler facts: none ({diagnosis.get('why', 'not collected')})"]
    primary = [KernelFacts.from_dict(k).summary() for k in diagnosis.get("kernels", [])]
    lines = [f"compiler: {s}" for s in primary]
    for shape, other in (diagnosis.get("by_shape") or {}).items():  # where another shape compiled differently
        lines += [f"compiler at {shape}: {s}" for k in other.get("kernels", [])
                  if (s := KernelFacts.from_dict(k).summary()) not in primary]
    found = findings_of(diagnosis)
    lines += [f"diagnosis: {f.render()}" for f in found] or ["diagnosis: no knowledge-base diagnosis holds"]
    return lines
