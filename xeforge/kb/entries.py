"""One loaded entry of the knowledge base, and what is said of a gated entry's spec.

Owns: :class:`Entry` (a validated spec with where it was written) and its kinds :class:`Constraint`,
:class:`Pattern`, :class:`SpaceEntry`,
:class:`Recognizer` and :class:`Diagnosis`; :func:`gate_applies` (whether a gated spec applies to a device under a
Triton version), :func:`applies_to_text` (the same condition in words) and :func:`fill` (a constraint's message
or fix with its placeholders filled). :mod:`xeforge.kb.render` (the text views) and :mod:`xeforge.kb.knowledge`
(the loaded base, which measures its selections through those views) both build on it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

from xeforge.kb.checks import CHECKS
from xeforge.kb.facts import DeviceEntry
from xeforge.kb.schema import ConstraintSpec, DiagnosisSpec, Gated, PatternSpec, RecognizerSpec, SpaceSpec
from xeforge.kb.versions import TritonInfo, version_applies


@dataclass
class Entry:
    """An entry of the base with where it was written (``path`` as displayed, 1-based ``line``)."""

    spec: Any
    path: str
    line: int

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def applies(self, device: DeviceEntry, triton: TritonInfo) -> bool:
        """Whether the entry applies to ``device`` under ``triton`` (its gating; a space overrides this)."""
        return gate_applies(self.spec, device, triton)


def gate_applies(spec: Gated, device: DeviceEntry, triton: TritonInfo) -> bool:
    """Whether a gated entry applies to ``device`` under ``triton`` (see :mod:`xeforge.kb.versions`)."""
    if (spec.devices or spec.backends) and device.id not in spec.devices and device.backend not in spec.backends:
        return False
    for name, expected in spec.device_facts.items():
        if device.value(name) != expected:
            return False
    return version_applies(spec.range("triton"), spec.range("triton_xpu"), triton)


def applies_to_text(spec: Gated) -> str:
    parts = []
    if spec.devices:
        parts.append("devices " + ", ".join(spec.devices))
    if spec.backends:
        parts.append("backends " + ", ".join(spec.backends))
    text = " or ".join(parts) if parts else "all devices"
    if spec.device_facts:
        text += " where " + ", ".join(f"{k}={v}" for k, v in spec.device_facts.items())
    return text


def fill(template: str, fields: dict[str, Any]) -> str:
    """Fill ``{name}`` / ``{name!r}`` placeholders; unknown ones stay as written (without conversions)."""
    out = []
    for literal, name, spec, conv in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        if name in fields:
            value = fields[name]
            value = repr(value) if conv == "r" else (str(value) if conv in (None, "s") else ascii(value))
            out.append(format(value, spec or ""))
        else:
            out.append("{" + name + "}")
    return "".join(out)


@dataclass
class Constraint(Entry):
    spec: ConstraintSpec

    @property
    def severity(self) -> str:
        return self.spec.severity

    def for_stage(self, stage: str) -> bool:
        return not self.spec.stages or stage in self.spec.stages

    @property
    def scope(self) -> str:
        return CHECKS[self.spec.check.kind].scope


@dataclass
class Pattern(Entry):
    spec: PatternSpec


@dataclass
class SpaceEntry(Entry):
    spec: SpaceSpec

    def applies(self, device: DeviceEntry, triton: TritonInfo) -> bool:
        return device.id in self.spec.devices and version_applies(
            self.spec.range("triton"), self.spec.range("triton_xpu"), triton
        )


@dataclass
class Recognizer(Entry):
    spec: RecognizerSpec


@dataclass
class Diagnosis(Entry):
    spec: DiagnosisSpec
