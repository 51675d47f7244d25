"""The loaded knowledge base and what the rest of xeforge asks of it.

Owns: :class:`KnowledgeBase` — device recognition (:meth:`~KnowledgeBase.match_device`), selection of
every entry that applies to a stage, device and Triton version (:meth:`~KnowledgeBase.select`, never
truncated), enforcement of constraints on a kernel (gate 1, :meth:`~KnowledgeBase.check`) and on a tuner
candidate (:meth:`~KnowledgeBase.check_config`), tuning spaces (:meth:`~KnowledgeBase.space`), and
:meth:`~KnowledgeBase.explain`. Loading and linting live in :mod:`xeforge.kb.loader`; text/JSON rendering
in :mod:`xeforge.kb.render`; one entry (:class:`~xeforge.kb.entries.Constraint`, ``Pattern``, ``SpaceEntry``) and
whether it applies in :mod:`xeforge.kb.entries`.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from xeforge.errors import KnowledgeBaseError
from xeforge.kb._base import DTYPE_BYTES, FAMILIES, STAGES, dtype_key
from xeforge.kb.checks import CheckContext, OptionSpelling, evaluate
from xeforge.kb.entries import Constraint, Diagnosis, Entry, Pattern, Recognizer, SpaceEntry, fill
from xeforge.kb.facts import DeviceEntry
from xeforge.kb.kernel_facts import LaunchConfig, config_for, launch_configs, roles_by_use
from xeforge.kb.render import explain_entry, render_selection, selection_dict
from xeforge.kb.roles import names_for
from xeforge.kb.schema import OPTION_FIELDS, SPACE_FIELDS, SourceSpec
from xeforge.kb.versions import TritonInfo, version_applies
from xeforge.kernel_model import JitFunction, KernelModel


# -- results -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    """A constraint a kernel or configuration breaks. ``line`` is None for a bare configuration."""

    rule_id: str
    line: int | None
    message: str
    fix: str
    severity: str = "error"
    kernel: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def render(self, path: str = "") -> str:
        where = f"{path}:{self.line}" if path and self.line else (f"line {self.line}" if self.line else "config")
        return f"{where}: {self.severity} [{self.rule_id}] {self.message}\n  fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "line": self.line,
            "message": self.message,
            "fix": self.fix,
            "severity": self.severity,
            "kernel": self.kernel,
        }


@dataclass
class TuningSpace:
    """A device's tuning space for one kernel family under one Triton version (variants applied).

    Field values are lists (``None``: not tuned). ``configs`` yields only configurations that
    :meth:`KnowledgeBase.check_config` accepts, seeds first, keyed by the kernel's own constexpr names and
    by the option names this Triton spells (``threads_per_warp`` before triton-xpu 3.6).
    """

    id: str
    device_id: str
    family: str
    triton: TritonInfo
    block_m: list[int] | None = None
    block_n: list[int] | None = None
    block_k: list[int] | None = None
    block_size: list[int] | None = None
    group_size_m: list[int] | None = None
    num_warps: list[int] | None = None
    num_stages: list[int] | None = None
    grf_mode: list[str] | None = None
    warp_size: list[int] | None = None
    seeds: list[dict[str, Any]] = field(default_factory=list)
    max_rows: int | None = None  # a space for a class of at most this many rows (decode-sized M)
    spelling: dict[str, str] = field(default_factory=dict)
    source: tuple[str, ...] = ()
    confidence: str = "unverified"
    note: str | None = None
    path: str = ""
    line: int = 0
    _kb: KnowledgeBase | None = field(default=None, repr=False, compare=False)

    def values(self) -> dict[str, list[Any]]:
        """Tuned fields with their values (option fields under their spelled names)."""
        out: dict[str, list[Any]] = {}
        for name in SPACE_FIELDS:
            vals = getattr(self, name)
            if vals:
                out[self.spelling.get(name, name)] = list(vals)
        return out

    def _keyed(self, fieldname: str, role_names: dict[str, list[str]]) -> list[str]:
        if fieldname in OPTION_FIELDS:
            return [self.spelling.get(fieldname, fieldname)]
        return role_names.get(fieldname, [])

    def configs(
        self,
        constexpr_names: Iterable[str],
        *,
        kernel: JitFunction | None = None,
        functions: dict[str, JitFunction] | None = None,
        fixed: dict[str, Any] | None = None,
        limit: int | None = None,
        dtype: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """KB-valid configurations for a kernel with these constexpr names, seeds first, no duplicates.

        ``fixed``: other literal values of the launch (e.g. ``HEAD_DIM=64``) that constraints should see;
        they are not part of the yielded dicts. ``kernel`` lets the constraints know whether it uses
        ``tl.dot``; without it the family decides (gemm/attention: yes). ``dtype``: of the ``tl.dot`` operands
        (the widest the kernel runs in), for the shared-memory estimate.
        """
        names = list(constexpr_names)
        by_use = roles_by_use(kernel) if kernel is not None else {}  # TM, TN, TK: roles read from their use
        role_names = {f: names_for(f, names, by_use) for f in SPACE_FIELDS if f not in OPTION_FIELDS}
        axes: list[tuple[list[str], list[Any]]] = []
        for fieldname in SPACE_FIELDS:
            vals = getattr(self, fieldname)
            keys = self._keyed(fieldname, role_names)
            if vals and keys:
                axes.append((keys, list(vals)))
        seen: set[tuple[tuple[str, Any], ...]] = set()
        count = 0
        kb = self._kb
        assert kb is not None
        template = config_for({}, kernel, functions, self.family in ("gemm", "attention"))

        def accept(cfg: dict[str, Any]) -> bool:
            key = tuple(sorted(cfg.items()))
            if not cfg or key in seen:
                return False
            seen.add(key)
            probe = replace(template, values={**(fixed or {}), **cfg})
            problems = kb.check_launch_config(probe, self.device_id, self.triton, dtype=dtype)
            return not any(v.is_error for v in problems)

        seeds = ([(self._keyed(f, role_names), v) for f, v in seed.items()] for seed in self.seeds)
        grid = (zip((keys for keys, _ in axes), combo) for combo in itertools.product(*(vals for _, vals in axes)))
        for pairs in itertools.chain(seeds, grid):
            cfg = {key: value for keys, value in pairs for key in keys}
            if accept(cfg):
                yield cfg
                count += 1
                if limit is not None and count >= limit:
                    return

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "device": self.device_id,
            "family": self.family,
            "values": self.values(),
            "seeds": [{self.spelling.get(k, k): v for k, v in s.items()} for s in self.seeds],
            "source": list(self.source),
            "confidence": self.confidence,
            "note": self.note,
            "where": f"{self.path}:{self.line}",
        }


@dataclass
class Selection:
    """Everything the knowledge base holds for one stage, device and Triton version — nothing cut."""

    stage: str
    device: DeviceEntry
    triton: TritonInfo
    constraints: list[Constraint]
    patterns: list[Pattern]
    spaces: list[TuningSpace]
    sources: dict[str, SourceSpec]
    left_out: list[str] = field(default_factory=list)

    def ids(self) -> list[str]:
        return [c.id for c in self.constraints] + [p.id for p in self.patterns] + [s.id for s in self.spaces]

    def render_text(self) -> str:
        return render_selection(self)

    def to_dict(self) -> dict[str, Any]:
        return selection_dict(self)

    def fit(self, budget_chars: int, relevant: Iterable[str] = ()) -> Selection:
        """A copy that renders within ``budget_chars`` when only patterns are dropped.

        Constraints, device facts and spaces are always kept. Patterns are kept by relevance — those whose
        id or tags meet ``relevant`` (ids of detected issues, tags such as ``grf_mode``) first, then in file
        order — and the ids of the dropped ones are listed in ``left_out`` (and in the rendered text).
        """
        wanted = set(relevant)

        def score(p: Pattern) -> int:
            return 0 if (p.id in wanted or wanted.intersection(p.spec.tags)) else 1

        ranked = sorted(self.patterns, key=score)  # stable: file order within a rank
        kept: list[Pattern] = []
        for pattern in ranked:
            trial = Selection(self.stage, self.device, self.triton, self.constraints, kept + [pattern],
                              self.spaces, self.sources)
            if len(trial.render_text()) <= budget_chars:
                kept.append(pattern)
        order = {p.id: i for i, p in enumerate(self.patterns)}
        kept.sort(key=lambda p: order[p.id])
        dropped = [p.id for p in self.patterns if p not in kept]
        return Selection(self.stage, self.device, self.triton, self.constraints, kept, self.spaces,
                         self.sources, dropped)


# -- the base ----------------------------------------------------------------------------------------
class KnowledgeBase:
    def __init__(
        self,
        root: Path | None,
        files: list[str],
        sources: dict[str, SourceSpec],
        devices: dict[str, DeviceEntry],
        constraints: list[Constraint],
        patterns: list[Pattern],
        spaces: list[SpaceEntry],
        recognizers: list[Recognizer] | None = None,
        diagnoses: list[Diagnosis] | None = None,
    ) -> None:
        self.root = root
        self.files = files
        self.sources = sources
        self.devices = devices
        self.constraints = constraints
        self.patterns = patterns
        self.space_entries = spaces
        self.recognizers = list(recognizers or [])
        self.diagnoses = list(diagnoses or [])
        self._applicable: dict[tuple[str, TritonInfo], list[Constraint]] = {}

    def __repr__(self) -> str:
        return (
            f"KnowledgeBase({self.root}, {len(self.devices)} devices, {len(self.constraints)} constraints, "
            f"{len(self.patterns)} patterns, {len(self.space_entries)} spaces)"
        )

    # -- lookup --------------------------------------------------------------------------------------
    def device(self, device_id: str) -> DeviceEntry:
        try:
            return self.devices[device_id]
        except KeyError:
            close = difflib.get_close_matches(str(device_id), list(self.devices), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise KnowledgeBaseError(
                "device", f"unknown device id {device_id!r}", f"{hint}known ids: {', '.join(self.devices)}"
            ) from None

    def entry(self, entry_id: str) -> Entry | DeviceEntry | SourceSpec | None:
        for group in (self.constraints, self.patterns, self.space_entries, self.recognizers, self.diagnoses):
            for item in group:
                if item.id == entry_id:
                    return item
        if entry_id in self.devices:
            return self.devices[entry_id]
        return self.sources.get(entry_id)

    def all_ids(self) -> list[str]:
        return (
            list(self.devices)
            + [c.id for c in self.constraints]
            + [p.id for p in self.patterns]
            + [s.id for s in self.space_entries]
            + list(self.sources)
        )

    def match_device(self, props: dict[str, Any]) -> DeviceEntry | None:
        """The device entry that runtime properties describe, or None (unknown or ambiguous).

        ``props``: ``backend`` ("xpu"/"cuda"/"cpu"), ``name``, and optionally ``architecture``,
        ``device_id`` (PCI id), ``cores`` (Xe-cores = ``gpu_subslice_count`` on XPU, SMs =
        ``multiprocessor_count`` on CUDA; not the XPU ``max_compute_units``, which counts EUs) and other
        properties the device files list under ``match``. A CPU backend without a better match is the
        Triton interpreter. Ambiguous evidence (e.g. only "BMG-G21", which is both B580 and B570) gives None.
        """
        scored: list[tuple[int, DeviceEntry]] = []
        for entry in self.devices.values():
            score = entry.match_score(props)
            if score:
                scored.append((score, entry))
        scored.sort(key=lambda t: -t[0])
        if scored and (len(scored) == 1 or scored[0][0] > scored[1][0]):
            return scored[0][1]
        if not scored and props.get("backend") == "cpu":
            cpu = [d for d in self.devices.values() if d.backend == "cpu"]
            if len(cpu) == 1:
                return cpu[0]
        return None

    # -- selection -----------------------------------------------------------------------------------
    def applicable_constraints(self, device_id: str, triton: TritonInfo) -> list[Constraint]:
        """Every constraint that applies to the device under this Triton (all stages), in file order."""
        key = (device_id, triton)
        if key not in self._applicable:
            device = self.device(device_id)
            self._applicable[key] = [c for c in self.constraints if c.applies(device, triton)]
        return list(self._applicable[key])

    def select(self, stage: str, device_id: str, triton: TritonInfo) -> Selection:
        """Every constraint, pattern, device fact and tuning space for this stage, device and version."""
        if stage not in STAGES:
            close = difflib.get_close_matches(str(stage), STAGES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise KnowledgeBaseError("stage", f"unknown stage {stage!r}", f"{hint}stages: {', '.join(STAGES)}")
        device = self.device(device_id)
        constraints = [c for c in self.constraints if c.for_stage(stage) and c.applies(device, triton)]
        patterns = [p for p in self.patterns if stage in p.spec.stages and p.applies(device, triton)]
        spaces = [
            self._resolve(s, device, triton)
            for s in self.space_entries
            if stage in s.spec.stages and s.applies(device, triton)
        ]
        return Selection(stage, device, triton, constraints, patterns, spaces, self.sources)

    def option_spelling(self, option: str, device_id: str, triton: TritonInfo) -> str:
        """How this Triton spells a launch option (``warp_size`` is ``threads_per_warp`` before xpu 3.6)."""
        for c in self.applicable_constraints(device_id, triton):
            check = c.spec.check
            if isinstance(check, OptionSpelling) and check.canonical == option:
                return check.spelling
        return option

    # -- enforcement ---------------------------------------------------------------------------------
    def _run(
        self, device: DeviceEntry, triton: TritonInfo, model: KernelModel | None, configs: list[LaunchConfig],
        elem_bytes: int | None, scopes: tuple[str, ...],
    ) -> list[Violation]:
        ctx = CheckContext(device, triton, model, configs, elem_bytes)
        fields = {"device": device.id, "device_name": device.name, "triton": str(triton)}
        out: list[Violation] = []
        seen: set[tuple[str, int | None, str]] = set()
        for c in self.applicable_constraints(device.id, triton):
            if c.scope not in scopes:
                continue
            for finding in evaluate(c.spec.check, ctx):
                values = {**fields, "rule": c.id, "kernel": finding.kernel or "", **finding.fields}
                message = fill(c.spec.message, values)
                key = (c.id, finding.line, message)
                if key in seen:
                    continue
                seen.add(key)
                out.append(Violation(c.id, finding.line, message, fill(c.spec.fix, values), c.severity,
                                     finding.kernel))
        out.sort(key=lambda v: (v.line or 0, v.rule_id))
        return out

    @staticmethod
    def _elem_bytes(dtype: str | None) -> int | None:
        key = dtype_key(dtype) if dtype else None
        return DTYPE_BYTES.get(key) if key else None

    def check(
        self, model: KernelModel, device_id: str, triton: TritonInfo, *, dtype: str | None = None
    ) -> list[Violation]:
        """Gate 1: every applicable constraint against the kernel's source, launch sites and autotune
        configs. Returns errors and warnings (``Violation.is_error``); a candidate fails on any error.
        ``dtype`` (of the ``tl.dot`` operands, e.g. ``bfloat16``) sharpens the shared-memory estimate."""
        device = self.device(device_id)
        return self._run(device, triton, model, launch_configs(model), self._elem_bytes(dtype),
                         ("config", "source"))

    def check_config(
        self,
        config: dict[str, Any],
        device_id: str,
        triton: TritonInfo,
        kernel: JitFunction | None = None,
        *,
        family: str | None = None,
        functions: dict[str, JitFunction] | None = None,
        dtype: str | None = None,
    ) -> list[Violation]:
        """Constraints on one launch configuration (``{"BLOCK_M": 128, "num_warps": 8, ...}``).

        Only configuration constraints run (source-level ones do not depend on the config). Whether the
        kernel uses ``tl.dot`` comes from ``kernel`` (with ``functions`` for jit helpers it calls), else from
        ``family`` (gemm/attention: yes; reduction/elementwise: no), else it is unknown and dot-dependent
        rules are skipped.
        """
        assume_dot = None if family is None else family in ("gemm", "attention")
        return self.check_launch_config(config_for(config, kernel, functions, assume_dot), device_id, triton,
                                        dtype=dtype)

    def check_launch_config(
        self, cfg: LaunchConfig, device_id: str, triton: TritonInfo, *, dtype: str | None = None
    ) -> list[Violation]:
        """:meth:`check_config` for a prepared :class:`~xeforge.kb.kernel_facts.LaunchConfig` (the tuner's
        inner loop: whether the kernel uses ``tl.dot`` is worked out once, not per configuration)."""
        device = self.device(device_id)
        return self._run(device, triton, None, [cfg], self._elem_bytes(dtype), ("config",))

    # -- tuning spaces -------------------------------------------------------------------------------
    def _resolve(self, entry: SpaceEntry, device: DeviceEntry, triton: TritonInfo) -> TuningSpace:
        spec = entry.spec
        values: dict[str, Any] = {name: getattr(spec, name) for name in SPACE_FIELDS}
        seeds = [s.model_dump(exclude_none=True) for s in spec.seeds]
        notes = [spec.note] if spec.note else []
        for variant in spec.variants:
            if not version_applies(variant.range("triton"), variant.range("triton_xpu"), triton):
                continue
            for name in SPACE_FIELDS:
                override = getattr(variant, name)
                if override is not None:
                    values[name] = override
            if variant.seeds is not None:
                seeds = [s.model_dump(exclude_none=True) for s in variant.seeds]
            if variant.note:
                notes.append(variant.note)
        spelling = {}
        for option in OPTION_FIELDS:
            spelled = self.option_spelling(option, device.id, triton)
            if spelled != option:
                spelling[option] = spelled
        return TuningSpace(
            id=spec.id,
            device_id=device.id,
            family=spec.family,
            triton=triton,
            seeds=seeds,
            max_rows=spec.max_rows,
            spelling=spelling,
            source=(spec.source,) if isinstance(spec.source, str) else tuple(spec.source),
            confidence=spec.confidence,
            note=" ".join(notes) or None,
            path=entry.path,
            line=entry.line,
            _kb=self,
            **values,
        )

    def space(self, device_id: str, family: str, triton: TritonInfo, rows: int | None = None) -> TuningSpace:
        """The tuning space for a device and kernel family (gemm | gemv | reduction | elementwise | attention).

        ``rows``: a class of shapes with at most this many rows (decode-sized M) asks for the space of such shapes
        (``max_rows`` at least ``rows``, the tightest first) and gets the family's general space where the device
        has none. Without ``rows``, spaces for few rows are never returned.
        """
        if family not in FAMILIES:
            raise KnowledgeBaseError("family", f"unknown kernel family {family!r}", f"use one of: {', '.join(FAMILIES)}")
        device = self.device(device_id)
        found = [e for e in self.space_entries if e.spec.family == family and e.applies(device, triton)]
        if rows is not None:
            few = sorted((e for e in found if e.spec.max_rows is not None and e.spec.max_rows >= rows),
                         key=lambda e: e.spec.max_rows)
            if few:
                return self._resolve(few[0], device, triton)
        for entry in found:
            if entry.spec.max_rows is None:
                return self._resolve(entry, device, triton)
        raise KnowledgeBaseError(
            "spaces",
            f"no tuning space for {family} kernels on {device_id} under {triton}",
            f"add one to knowledge_base/spaces/ with family: {family} and devices: [{device_id}]",
        )

    # -- explanation ---------------------------------------------------------------------------------
    def explain(self, rule_id: str) -> str:
        """Everything about one entry (constraint, pattern, space, device or source), with its citations."""
        found = self.entry(rule_id)
        if found is None:
            close = difflib.get_close_matches(str(rule_id), self.all_ids(), n=3)
            hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
            raise KnowledgeBaseError(
                "explain", f"no knowledge-base entry has the id {rule_id!r}",
                f"{hint}`xeforge kb show --device D --stage S` lists the ids",
            )
        return explain_entry(self, rule_id, found)
