"""The schema of every knowledge-base file kind (pydantic, strict, unknown keys rejected).

Owns: one model per entry kind — :class:`SourceSpec` (``sources.yaml``), :class:`ConstraintSpec`
(``constraints/``), :class:`PatternSpec` (``patterns/``), :class:`SpaceSpec` (``spaces/``); device entries
live in :mod:`xeforge.kb.facts` — and one model per file (:data:`FILE_KINDS`): each file is a mapping
with exactly one top-level key naming its kind (``device:``, ``constraints:``, ...), so a file can be
linted on its own. Cross-references (device ids, source ids, fact names, template placeholders,
duplicate ids) are checked by :mod:`xeforge.kb.loader`, which has the whole base in view.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from xeforge.kb._base import ID_PATTERN, STAGES, Backend, Confidence, Family, KBModel, Severity, Stage
from xeforge.kb.checks import CheckSpec
from xeforge.kb.facts import DeviceSpec
from xeforge.kb.versions import VersionRange, VersionRangeError


@functools.lru_cache(maxsize=None)
def parsed_range(text: str) -> VersionRange:
    return VersionRange(text)


def _check_range(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        VersionRange(value)
    except VersionRangeError as exc:
        raise PydanticCustomError("version_range", "{problem}", {"problem": str(exc)}) from None
    return value


class Ranged(KBModel):
    """Triton-version gating: ``triton`` (upstream) and ``triton_xpu`` (Intel's fork) PEP 440 ranges."""

    triton: str | None = None
    triton_xpu: str | None = None

    @field_validator("triton", "triton_xpu")
    @classmethod
    def check_version_range(cls, value: str | None) -> str | None:
        return _check_range(value)

    def range(self, which: str) -> VersionRange | None:
        text = getattr(self, which)
        return None if text is None else parsed_range(text)


class Gated(Ranged):
    """Fields shared by every entry that applies to some devices and Triton versions."""

    devices: list[str] = Field(default_factory=list)
    backends: list[Backend] = Field(default_factory=list)
    device_facts: dict[str, bool | int | str] = Field(default_factory=dict)


class SourceSpec(KBModel):
    title: str
    url: str | None = None
    kind: str | None = None
    note: str | None = None


class ConstraintSpec(Gated):
    id: str = Field(pattern=ID_PATTERN)
    title: str
    stages: list[Stage] = Field(default_factory=list)  # stages whose KB slice lists it; empty = all
    severity: Severity = "error"
    check: CheckSpec
    message: str
    fix: str
    why: str | None = None
    source: str | list[str]
    confidence: Confidence


class PatternSpec(Gated):
    id: str = Field(pattern=ID_PATTERN)
    stage: Stage | list[Stage]
    title: str
    when: str
    before: str | None = None
    after: str | None = None
    effect: str
    source: str | list[str]
    confidence: Confidence
    tags: list[str] = Field(default_factory=list)
    tactic: str | None = None  # the rules-engine tactic that applies it, when one does
    # later stages whose candidates are also proposed on top of this tactic's rewrite of their incumbent, where
    # the rewrite was not adopted at its own stage (slower alone, faster combined; timed against the incumbent)
    basis_for: list[Stage] = Field(default_factory=list)

    @property
    def stages(self) -> tuple[str, ...]:
        return (self.stage,) if isinstance(self.stage, str) else tuple(self.stage)

    @model_validator(mode="after")
    def basis_for_later_stages(self) -> "PatternSpec":
        if self.basis_for and not self.tactic:
            raise PydanticCustomError("basis_for", "basis_for without a tactic: nothing to rewrite the incumbent with",
                                      {"fix": "add 'tactic: <the rules-engine tactic of this pattern's stage>'"})
        last = max(STAGES.index(s) for s in self.stages)
        early = [s for s in self.basis_for if STAGES.index(s) <= last]
        if early:
            raise PydanticCustomError("basis_for", "basis_for names stages that do not come after {stage}: {early} "
                                      "(a rewrite can only be the basis of a later stage's candidates)",
                                      {"stage": ", ".join(self.stages), "early": ", ".join(early),
                                       "fix": f"name stages after {self.stages[-1]} in basis_for, or remove them"})
        return self


class Seed(KBModel):
    """A configuration worth trying first (keys: roles and options; missing options = backend default)."""

    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    block_size: int | None = None
    head_dim: int | None = None
    group_size_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    grf_mode: str | None = None
    warp_size: int | None = None


#: tunable fields of a space, in the order configurations vary (last varies fastest)
SPACE_FIELDS: tuple[str, ...] = (
    "block_m",
    "block_n",
    "block_k",
    "block_size",
    "group_size_m",
    "num_warps",
    "num_stages",
    "grf_mode",
    "warp_size",
)
#: fields that are launch options (the rest are constexpr roles)
OPTION_FIELDS: tuple[str, ...] = ("num_warps", "num_stages", "grf_mode", "warp_size")


class SpaceValues(KBModel):
    block_m: list[int] | None = None
    block_n: list[int] | None = None
    block_k: list[int] | None = None
    block_size: list[int] | None = None
    group_size_m: list[int] | None = None
    num_warps: list[int] | None = None
    num_stages: list[int] | None = None
    grf_mode: list[str] | None = None
    warp_size: list[int] | None = None


class SpaceVariant(SpaceValues, Ranged):
    """Version-gated replacement of some fields (and seeds) of a space."""

    seeds: list[Seed] | None = None
    note: str | None = None


class SpaceSpec(SpaceValues, Gated):
    id: str = Field(pattern=ID_PATTERN)
    family: Family
    stages: list[Stage] = Field(default_factory=lambda: ["device_tuning", "autotuning"])
    seeds: list[Seed] = Field(default_factory=list)
    variants: list[SpaceVariant] = Field(default_factory=list)
    #: a space for a class of few rows only (decode-sized M: the tile's rows at most this); the family's space
    #: without it serves every other lookup
    max_rows: int | None = Field(default=None, ge=1)
    source: str | list[str]
    confidence: Confidence
    note: str | None = None


#: IR texts a recognizer may read (the keys of Triton's ``kernel.asm``; ``sass`` disassembled from the cubin)
IR_KINDS = ("ttir", "ttgir", "llir", "ptx", "sass", "amdgcn")
IrKind = Literal["ttir", "ttgir", "llir", "ptx", "sass", "amdgcn"]
#: facts every compiled kernel has (from its metadata and the driver), beside the recognizers' own
METADATA_FACTS = ("regs", "spills", "shared_bytes", "num_warps", "num_stages", "threads_per_warp", "grf_mode",
                  "max_threads", "dot_calls", "programs", "device_cores", "core_fill", "idle_cores", "waves",
                  "wave_fill", "launches", "grf_recompiled")


class RecognizerSpec(Gated):
    """A fact read from one IR of a compiled kernel: how many times ``pattern`` (a Python regex) matches, and with
    ``capture``, the distinct values of its groups (joined by ``.``) as a second fact."""

    id: str = Field(pattern=ID_PATTERN)
    title: str
    ir: IrKind
    pattern: str
    fact: str = Field(pattern=r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")
    capture: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")
    source: str | list[str]
    confidence: Confidence
    note: str | None = None

    @field_validator("pattern")
    @classmethod
    def check_pattern(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise PydanticCustomError("regex", "not a valid regular expression: {problem}",
                                      {"problem": str(exc)}) from None
        return value


class Condition(KBModel):
    """One test of a fact: ``above`` / ``below`` a number or another fact's value (named as a string),
    ``equals`` a value, ``has`` an item (a captured list), or ``missing`` (the fact was not found)."""

    fact: str
    above: float | str | None = None
    below: float | str | None = None
    equals: bool | int | float | str | None = None
    has: str | None = None
    missing: bool | None = None

    @model_validator(mode="after")
    def one_test(self) -> "Condition":
        tests = [k for k in ("above", "below", "equals", "has", "missing") if getattr(self, k) is not None]
        if len(tests) != 1:
            raise PydanticCustomError("condition", "give exactly one of above, below, equals, has, missing "
                                      "(got {got})", {"got": ", ".join(tests) or "none"})
        return self


class DiagnosisSpec(Gated):
    """A cause read from a compiled kernel's facts (every ``when`` condition holds), and what addresses it: a stage
    and, for the rules engine, the tactics it tries first."""

    id: str = Field(pattern=ID_PATTERN)
    title: str
    when: list[Condition] = Field(min_length=1)
    cause: str
    stage: Stage
    tactics: list[str] = Field(default_factory=list)
    # a fact that bounds what addressing the cause can gain: the share of the device the kernel uses (``core_fill``,
    # programs per core); the gain is at most 1 / that share, and the rules engine tries the findings with the
    # largest such bound first
    share: str | None = None
    source: str | list[str]
    confidence: Confidence


class SourcesFile(KBModel):
    sources: dict[str, SourceSpec]


class DeviceFile(KBModel):
    device: DeviceSpec


class ConstraintsFile(KBModel):
    constraints: list[ConstraintSpec]


class PatternsFile(KBModel):
    patterns: list[PatternSpec]


class SpacesFile(KBModel):
    spaces: list[SpaceSpec]


class RecognizersFile(KBModel):
    recognizers: list[RecognizerSpec]


class DiagnosesFile(KBModel):
    diagnoses: list[DiagnosisSpec]


#: top-level key -> (file model, the folder it normally lives in)
FILE_KINDS: dict[str, tuple[type[KBModel], str]] = {
    "sources": (SourcesFile, ""),
    "device": (DeviceFile, "devices"),
    "constraints": (ConstraintsFile, "constraints"),
    "patterns": (PatternsFile, "patterns"),
    "spaces": (SpacesFile, "spaces"),
    "recognizers": (RecognizersFile, "recognizers"),
    "diagnoses": (DiagnosesFile, "diagnoses"),
}


def sources_of(entry: Any) -> tuple[str, ...]:
    src = getattr(entry, "source", None)
    if src is None:
        return ()
    return (src,) if isinstance(src, str) else tuple(src)
