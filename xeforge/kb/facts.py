"""Device entries: the schema of ``knowledge_base/devices/*.yaml`` and the :class:`DeviceEntry` the tool uses.

Owns: :class:`Fact` (a value with its source ids, confidence and note), :class:`DeviceFacts` (every fact a
device file may state; an unknown fact name is a lint error), :class:`DeviceSpec` (identity, how to
recognise the device at run time, facts), and :class:`DeviceEntry`, the loaded device with typed
accessors (``entry.cores``, ``entry.peak_flops("bf16")``, ``entry.fact("l2_bytes").source``).
"""

from __future__ import annotations

import re
from typing import Any, Generic, Literal, TypeVar

from pydantic import Field, field_validator

from xeforge.kb._base import ID_PATTERN, Backend, Confidence, DtypeKey, KBModel, dtype_key

T = TypeVar("T")


class Fact(KBModel, Generic[T]):
    """One sourced fact. ``source`` names ids from ``knowledge_base/sources.yaml``."""

    value: T
    unit: str | None = None
    source: str | list[str]
    confidence: Confidence
    note: str | None = None

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,) if isinstance(self.source, str) else tuple(self.source)


class DpasShape(KBModel):
    """The DPAS (XMX) instruction tile: M values, N, and K per input dtype."""

    m: list[int]
    n: int
    k: dict[DtypeKey, int]


class DotShape(KBModel):
    """Smallest ``tl.dot`` operand extents the backend handles well (16-bit inputs): M x N x K."""

    m: int
    n: int
    k: int


class BlockIO(KBModel):
    """2D block load/store support and limits (Intel PVC/BMG)."""

    supported: bool
    min_width_bytes: int | None = None
    min_pitch_bytes: int | None = None
    pitch_multiple_bytes: int | None = None
    base_alignment_bytes: int | None = None
    max_load_height: int | None = None
    max_store_height: int | None = None
    max_row_bytes: int | None = None
    max_width_elements: dict[int, int] | None = None  # element bit width -> max tile width in elements


class TritonDefaults(KBModel):
    """What the backend uses when a launch does not say."""

    num_warps: int
    num_stages: int
    warp_size: int | None = None
    grf_mode: str | None = None


class DeviceFacts(KBModel):
    cores: Fact[int] | None = None
    stacks: Fact[int] | None = None
    cores_per_stack: Fact[int] | None = None
    xmx_engines: Fact[int] | None = None
    xve_per_core: Fact[int] | None = None
    threads_per_xve: Fact[int] | None = None
    peak_tflops: dict[DtypeKey, Fact[float]] = Field(default_factory=dict)
    measured_tflops: dict[DtypeKey, Fact[float]] = Field(default_factory=dict)
    bandwidth_gbs: Fact[float] | None = None
    measured_bandwidth_gbs: Fact[float] | None = None
    memory_gb: Fact[float] | None = None
    l2_bytes: Fact[int] | None = None
    l1_bytes_per_core: Fact[int] | None = None
    slm_bytes_per_core: Fact[int] | None = None
    slm_bytes_per_work_group: Fact[int] | None = None
    registers_per_core: Fact[int] | None = None
    max_registers_per_thread: Fact[int] | None = None
    max_warps_per_core: Fact[int] | None = None
    max_work_group_size: Fact[int] | None = None
    max_num_warps: Fact[int] | None = None
    subgroup_sizes: Fact[list[int]] | None = None
    grf_modes: Fact[list[int]] | None = None
    grf_bytes_per_register: Fact[int] | None = None
    has_fp64: Fact[bool] | None = None
    dpas: Fact[DpasShape] | None = None
    triton_uses_dpas: Fact[bool] | None = None
    min_dot: Fact[DotShape] | None = None
    block_io: Fact[BlockIO] | None = None
    triton_defaults: Fact[TritonDefaults] | None = None


#: fact names a constraint may reference (``fact:`` / ``max_fact:`` parameters, ``device_facts:``)
FACT_NAMES: tuple[str, ...] = tuple(DeviceFacts.model_fields)


class MatchSpec(KBModel):
    """How to recognise the device at run time. ``names`` are regular expressions searched (case-insensitive)
    in the runtime device name; ``architectures`` are substrings of the reported architecture string;
    ``device_ids`` are PCI ids; ``properties`` must all equal the runtime value when it is reported."""

    names: list[str] = Field(default_factory=list)
    architectures: list[str] = Field(default_factory=list)
    device_ids: list[int] = Field(default_factory=list)
    properties: dict[str, int | str | bool] = Field(default_factory=dict)

    @field_validator("names")
    @classmethod
    def _regexes_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"name pattern {pattern!r} is not a valid regular expression ({exc})") from None
        return value


class DeviceSpec(KBModel):
    id: str = Field(pattern=ID_PATTERN)
    name: str
    vendor: Literal["intel", "nvidia", "none"]
    backend: Backend
    generation: str | None = None
    codename: str | None = None
    match: MatchSpec = Field(default_factory=MatchSpec)
    facts: DeviceFacts
    notes: str | None = None


class DeviceEntry:
    """A loaded device. Fact values through properties (None when the KB does not know); the fact itself,
    with ``source`` and ``confidence``, through :meth:`fact`."""

    def __init__(self, spec: DeviceSpec, path: str = "", line: int = 0) -> None:
        self.spec = spec
        self.path = path
        self.line = line

    # -- identity ------------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def vendor(self) -> str:
        return self.spec.vendor

    @property
    def generation(self) -> str | None:
        return self.spec.generation

    @property
    def notes(self) -> str | None:
        return self.spec.notes

    def __repr__(self) -> str:
        return f"DeviceEntry({self.id!r}, backend={self.backend!r})"

    # -- facts ---------------------------------------------------------------------------------------
    def fact(self, name: str) -> Fact[Any] | None:
        """A fact by name; ``peak_tflops.bf16`` / ``measured_tflops.fp16`` address the per-dtype ones."""
        head, _, tail = name.partition(".")
        value = getattr(self.spec.facts, head, None)
        if tail:
            if not isinstance(value, dict):
                return None
            key = dtype_key(tail) or tail
            return value.get(key)
        return value if isinstance(value, Fact) else None

    def value(self, name: str, default: Any = None) -> Any:
        fact = self.fact(name)
        return default if fact is None else fact.value

    def facts(self) -> dict[str, Fact[Any]]:
        """Every stated fact, flattened (``peak_tflops.fp16``), in schema order."""
        out: dict[str, Fact[Any]] = {}
        for name in DeviceFacts.model_fields:
            value = getattr(self.spec.facts, name)
            if isinstance(value, Fact):
                out[name] = value
            elif isinstance(value, dict):
                for key, fact in value.items():
                    out[f"{name}.{key}"] = fact
        return out

    @property
    def cores(self) -> int | None:
        return self.value("cores")

    @property
    def peak_tflops(self) -> dict[str, float]:
        return {k: f.value for k, f in self.spec.facts.peak_tflops.items()}

    @property
    def bandwidth_gbs(self) -> float | None:
        return self.value("bandwidth_gbs")

    @property
    def l2_bytes(self) -> int | None:
        return self.value("l2_bytes")

    @property
    def slm_bytes_per_core(self) -> int | None:
        return self.value("slm_bytes_per_core")

    @property
    def slm_bytes_per_work_group(self) -> int | None:
        return self.value("slm_bytes_per_work_group")

    @property
    def subgroup_sizes(self) -> list[int] | None:
        return self.value("subgroup_sizes")

    @property
    def grf_modes(self) -> list[int] | None:
        return self.value("grf_modes")

    @property
    def max_num_warps(self) -> int | None:
        return self.value("max_num_warps")

    @property
    def max_work_group_size(self) -> int | None:
        return self.value("max_work_group_size")

    @property
    def has_fp64(self) -> bool | None:
        return self.value("has_fp64")

    @property
    def dpas(self) -> DpasShape | None:
        return self.value("dpas")

    @property
    def min_dot(self) -> DotShape | None:
        return self.value("min_dot")

    @property
    def block_io(self) -> BlockIO | None:
        return self.value("block_io")

    @property
    def triton_defaults(self) -> TritonDefaults | None:
        return self.value("triton_defaults")

    def default_option(self, option: str) -> Any:
        """The backend's value for a launch option the kernel does not set (None when unknown)."""
        defaults = self.triton_defaults
        if defaults is None:
            return None
        if option == "threads_per_warp":
            option = "warp_size"
        return getattr(defaults, option, None)

    def peak_flops(self, dtype_name: str) -> float | None:
        """Dense peak in FLOP/s for ``fp16`` / ``bfloat16`` / ``torch.float32`` ..., or None when unknown."""
        key = dtype_key(dtype_name)
        if key is None:
            return None
        fact = self.spec.facts.peak_tflops.get(key)  # type: ignore[call-overload]
        return None if fact is None else fact.value * 1e12

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        gbs = self.bandwidth_gbs
        return None if gbs is None else gbs * 1e9

    # -- recognition ---------------------------------------------------------------------------------
    def match_score(self, props: dict[str, Any]) -> int | None:
        """How well runtime ``props`` fit this entry: None when they contradict it, else a score (0 = no
        positive evidence). Name match 8, PCI id 8, architecture 4, each agreeing property 1."""
        backend = props.get("backend")
        if backend and backend != self.backend:
            return None
        match = self.spec.match
        score = 0
        name = props.get("name")
        if name and any(re.search(p, str(name), re.IGNORECASE) for p in match.names):
            score += 8
        device_id = props.get("device_id")
        if device_id is not None and match.device_ids:
            try:
                did = int(device_id, 0) if isinstance(device_id, str) else int(device_id)
            except (TypeError, ValueError):
                did = None
            if did in match.device_ids:
                score += 8
        arch = props.get("architecture")
        if arch is not None and any(a.lower() in str(arch).lower() for a in match.architectures):
            score += 4
        for key, expected in match.properties.items():
            got = props.get(key)
            if got is None:
                continue
            if got != expected:
                return None
            score += 1
        return score
