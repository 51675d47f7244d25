"""Text and JSON views of the knowledge base: what a stage receives (``kb show``), and ``kb explain``.

Owns: :func:`render_selection` (the exact text a stage's prompt and ``xeforge kb show`` get; deterministic,
nothing truncated), :func:`selection_dict` (the same as data, for ``--json``), :func:`explain_entry`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from xeforge.kb.checks import CHECKS, check_params, describe
from xeforge.kb.entries import Constraint, Pattern, SpaceEntry, applies_to_text, fill
from xeforge.kb.facts import DeviceEntry, Fact
from xeforge.kb.schema import SourceSpec, sources_of
from xeforge.kb.versions import describe_versions

if TYPE_CHECKING:  # annotations only (never imported at run time): knowledge imports this module to render
    from xeforge.kb.knowledge import KnowledgeBase, Selection, TuningSpace


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {k: _plain(v) for k, v in value.model_dump(exclude_none=True).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _compact(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def fact_line(name: str, fact: Fact[Any]) -> str:
    unit = f" {fact.unit}" if fact.unit else ""
    note = f" — {fact.note.strip()}" if fact.note else ""
    return f"- {name}: {_compact(fact.value)}{unit} [{fact.confidence}; {', '.join(fact.sources)}]{note}"


def _versions(spec: Any) -> str:
    return describe_versions(spec.range("triton"), spec.range("triton_xpu"))


def _device_fields(selection_device: DeviceEntry, triton: Any, rule: str) -> dict[str, Any]:
    return {"device": selection_device.id, "device_name": selection_device.name, "triton": str(triton), "rule": rule}


def constraint_lines(c: Constraint, device: DeviceEntry | None, triton: Any = None) -> list[str]:
    spec = c.spec
    fields = _device_fields(device, triton, c.id) if device is not None else {"rule": c.id}
    return [
        f"- [{c.id}] ({spec.severity}) {spec.title}",
        f"  rule: {describe(spec.check, device)}",
        f"  fix: {fill(spec.fix, fields)}",
        f"  applies to: {applies_to_text(spec)} · {_versions(spec)} · source: {', '.join(sources_of(spec))}"
        f" · {spec.confidence}",
    ]


def _block(label: str, text: str | None) -> list[str]:
    if not text:
        return []
    body = text.rstrip("\n").splitlines()
    if len(body) == 1 and label not in ("before", "after"):
        return [f"{label}: {body[0]}"]
    return [f"{label}:", *("    " + line if line else "" for line in body)]


def pattern_lines(p: Pattern) -> list[str]:
    spec = p.spec
    lines = [f"### [{p.id}] {spec.title}"]
    lines += _block("applies when", spec.when)
    lines += _block("before", spec.before)
    lines += _block("after", spec.after)
    lines += _block("effect", spec.effect)
    extra = f" · tactic: {spec.tactic}" if spec.tactic else ""
    if spec.basis_for:
        extra += f" · basis for: {', '.join(spec.basis_for)}"
    tags = f" · tags: {', '.join(spec.tags)}" if spec.tags else ""
    lines.append(
        f"({applies_to_text(spec)} · {_versions(spec)} · source: {', '.join(sources_of(spec))} · "
        f"{spec.confidence}{tags}{extra})"
    )
    return lines


def space_lines(s: TuningSpace) -> list[str]:
    vals = "; ".join(f"{k} {v}" for k, v in s.values().items())
    rows = f" (a class of at most {s.max_rows} rows)" if s.max_rows else ""
    lines = [f"- [{s.id}] {s.family}{rows}: {vals}"]
    for seed in s.seeds:
        shown = ", ".join(f"{s.spelling.get(k, k)}={v!r}" for k, v in seed.items())
        lines.append(f"  seed: {shown}")
    if s.note:
        lines.append(f"  note: {s.note}")
    lines.append(f"  (source: {', '.join(s.source)} · {s.confidence})")
    return lines


def render_selection(sel: Selection) -> str:
    d = sel.device
    out = [
        f"# Knowledge base for stage {sel.stage} · device {d.id} ({d.name}, backend {d.backend}) · {sel.triton}",
        f"{len(sel.constraints)} constraints, {len(sel.patterns)} patterns, {len(sel.spaces)} tuning spaces"
        + (f"; left out for the prompt budget: {', '.join(sel.left_out)}" if sel.left_out else "; nothing left out"),
        "",
        f"## Device facts ({d.id})",
    ]
    if d.notes:
        out.append(f"notes: {' '.join(d.notes.split())}")
    out += [fact_line(name, fact) for name, fact in d.facts().items()]
    out += ["", "## Hard constraints (gate 1 rejects a candidate that breaks an error; warnings are reported)"]
    for c in sel.constraints:
        out += constraint_lines(c, d, sel.triton)
    if not sel.constraints:
        out.append("(none)")
    out += ["", f"## Patterns for {sel.stage}"]
    for p in sel.patterns:
        out += pattern_lines(p) + [""]
    if not sel.patterns:
        out += ["(none)", ""]
    if sel.spaces:
        out += ["## Tuning spaces (the tuner draws from these; every configuration is checked against the constraints)"]
        for s in sel.spaces:
            out += space_lines(s)
        out.append("")
    cited = _cited(sel)
    if cited:
        out.append("## Sources")
        for sid in cited:
            src = sel.sources.get(sid)
            if src is not None:
                out.append(f"- {sid}: {src.title}" + (f" <{src.url}>" if src.url else ""))
    return "\n".join(out).rstrip() + "\n"


def _cited(sel: Selection) -> list[str]:
    ids: list[str] = []
    for fact in sel.device.facts().values():
        ids += fact.sources
    for c in sel.constraints:
        ids += sources_of(c.spec)
    for p in sel.patterns:
        ids += sources_of(p.spec)
    for s in sel.spaces:
        ids += s.source
    return sorted(set(ids))


def fact_dict(fact: Fact[Any]) -> dict[str, Any]:
    return {
        "value": _plain(fact.value),
        "unit": fact.unit,
        "source": list(fact.sources),
        "confidence": fact.confidence,
        "note": fact.note,
    }


def constraint_dict(c: Constraint, device: DeviceEntry | None = None) -> dict[str, Any]:
    spec = c.spec
    return {
        "id": c.id,
        "title": spec.title,
        "severity": spec.severity,
        "rule": describe(spec.check, device),
        "check": check_params(spec.check),
        "message": spec.message,
        "fix": spec.fix,
        "why": spec.why,
        "devices": spec.devices,
        "backends": spec.backends,
        "device_facts": spec.device_facts,
        "triton": spec.triton,
        "triton_xpu": spec.triton_xpu,
        "source": list(sources_of(spec)),
        "confidence": spec.confidence,
        "where": c.where,
    }


def pattern_dict(p: Pattern) -> dict[str, Any]:
    spec = p.spec
    return {
        "id": p.id,
        "stage": list(spec.stages),
        "title": spec.title,
        "when": spec.when,
        "before": spec.before,
        "after": spec.after,
        "effect": spec.effect,
        "devices": spec.devices,
        "backends": spec.backends,
        "triton": spec.triton,
        "triton_xpu": spec.triton_xpu,
        "tags": spec.tags,
        "tactic": spec.tactic,
        "basis_for": spec.basis_for,
        "source": list(sources_of(spec)),
        "confidence": spec.confidence,
        "where": p.where,
    }


def selection_dict(sel: Selection) -> dict[str, Any]:
    d = sel.device
    return {
        "stage": sel.stage,
        "device": {
            "id": d.id,
            "name": d.name,
            "backend": d.backend,
            "notes": d.notes,
            "facts": {name: fact_dict(f) for name, f in d.facts().items()},
        },
        "triton": {"version": str(sel.triton.version), "is_xpu": sel.triton.is_xpu, "text": sel.triton.text},
        "constraints": [constraint_dict(c, d) for c in sel.constraints],
        "patterns": [pattern_dict(p) for p in sel.patterns],
        "spaces": [s.to_dict() for s in sel.spaces],
        "left_out": list(sel.left_out),
        "sources": {sid: sel.sources[sid].model_dump(exclude_none=True) for sid in _cited(sel) if sid in sel.sources},
    }


def _source_lines(kb: KnowledgeBase, ids: tuple[str, ...] | list[str]) -> list[str]:
    out = ["sources:"]
    for sid in ids:
        src = kb.sources.get(sid)
        if src is None:
            out.append(f"  - {sid}: (not in sources.yaml)")
            continue
        out.append(f"  - {sid}: {src.title}" + (f" <{src.url}>" if src.url else ""))
        if src.note:
            out.append(f"      {src.note}")
    return out


def explain_entry(kb: KnowledgeBase, entry_id: str, found: Any) -> str:
    lines: list[str]
    if isinstance(found, Constraint):
        spec = found.spec
        kind = CHECKS[spec.check.kind]
        params = {k: v for k, v in check_params(spec.check).items() if k != "kind"}
        lines = [
            f"{found.id} — constraint ({spec.severity}), {found.where}",
            spec.title,
            "",
            f"rule: {describe(spec.check)}",
            f"check: {spec.check.kind} {json.dumps(params)}  ({kind.scope}-level)",
            f"applies to: {applies_to_text(spec)}",
            f"versions: {_versions(spec)}",
            f"stages listing it: {', '.join(spec.stages) if spec.stages else 'all'}",
            f"message: {spec.message}",
            f"fix: {spec.fix}",
        ]
        if spec.why:
            lines += ["", "why: " + " ".join(spec.why.split())]
        lines += ["", f"confidence: {spec.confidence}", *_source_lines(kb, sources_of(spec))]
    elif isinstance(found, Pattern):
        lines = [f"{found.id} — pattern for {', '.join(found.spec.stages)}, {found.where}", *pattern_lines(found)[1:]]
        lines[1:1] = [found.spec.title]
        lines += _source_lines(kb, sources_of(found.spec))
    elif isinstance(found, SpaceEntry):
        spec = found.spec
        lines = [f"{found.id} — tuning space ({spec.family}), {found.where}",
                 f"devices: {', '.join(spec.devices)}", f"versions: {_versions(spec)}",
                 f"stages: {', '.join(spec.stages)}"]
        for name, value in spec.model_dump(exclude_none=True).items():
            if name in ("id", "family", "devices", "stages", "source", "confidence", "triton", "triton_xpu",
                        "backends", "device_facts", "note") or value in ([], {}):
                continue
            lines.append(f"{name}: {json.dumps(value)}")
        if spec.note:
            lines.append(f"note: {spec.note}")
        lines += [f"confidence: {spec.confidence}", *_source_lines(kb, sources_of(spec))]
    elif isinstance(found, DeviceEntry):
        lines = [f"{found.id} — device: {found.name} (backend {found.backend}, vendor {found.vendor}), "
                 f"{found.path}:{found.line}"]
        match = found.spec.match
        lines.append(f"recognised by: names {match.names}, architectures {match.architectures}, "
                     f"device ids {[hex(i) for i in match.device_ids]}, properties {match.properties}")
        if found.notes:
            lines.append("notes: " + " ".join(found.notes.split()))
        lines += [fact_line(name, fact) for name, fact in found.facts().items()]
        ids = sorted({s for f in found.facts().values() for s in f.sources})
        lines += _source_lines(kb, ids)
    elif isinstance(found, SourceSpec):
        users = [i for i in kb.all_ids() if entry_id in _entry_sources(kb, i)]
        lines = [f"{entry_id} — source: {found.title}"]
        if found.url:
            lines.append(f"url: {found.url}")
        if found.kind:
            lines.append(f"kind: {found.kind}")
        if found.note:
            lines.append(f"note: {found.note}")
        lines.append(f"cited by: {', '.join(users) if users else '(nothing)'}")
    else:  # pragma: no cover - entry() returns only the types above
        lines = [repr(found)]
    return "\n".join(lines).rstrip() + "\n"


def _entry_sources(kb: KnowledgeBase, entry_id: str) -> tuple[str, ...]:
    found = kb.entry(entry_id)
    if isinstance(found, DeviceEntry):
        return tuple(s for f in found.facts().values() for s in f.sources)
    spec = getattr(found, "spec", None)
    return sources_of(spec) if spec is not None else ()
