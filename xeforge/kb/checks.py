"""The registry of machine-checkable conditions that constraints name in their ``check:`` block.

Owns: one parameter model and one evaluator per condition kind, registered by name in :data:`CHECKS`.
A constraint's YAML says ``check: {kind: value_range, option: num_warps, max_fact: max_num_warps}``; the
parameters are validated by the kind's model at load time (so lint reports a wrong parameter with its
line), and the evaluator turns a kernel (its :class:`~xeforge.kb.kernel_facts.LaunchConfig` s and calls)
into :class:`Finding` s whose fields fill the constraint's ``message`` / ``fix`` templates.

Two scopes: ``config`` kinds look at one configuration at a time (a launch site, a ``triton.Config``, or a
tuner candidate via ``check_config``); ``source`` kinds look at the kernel source (calls, names) and are
skipped by ``check_config``. Adding a kind: a params model with ``kind: Literal["name"]``, an evaluator, a
``describe`` function, the placeholders it fills, then ``_register``; lint and the schema pick it up.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import Field

from xeforge.kb._base import KBModel
from xeforge.kb.facts import DeviceEntry, DotShape
from xeforge.kb.kernel_facts import LaunchConfig, attribute_uses
from xeforge.kb.roles import ROLE_PATTERNS, first_int, values_for
from xeforge.kb.versions import TritonInfo
from xeforge.kernel_model import KernelModel

Role = Literal["block_m", "block_n", "block_k", "block_size", "head_dim", "group_size_m"]
assert set(Role.__args__) == set(ROLE_PATTERNS)  # type: ignore[attr-defined]

#: placeholders every message/fix template may use
COMMON_PLACEHOLDERS = frozenset({"rule", "device", "device_name", "triton", "kernel"})


@dataclass
class Finding:
    """One breach found by a check: the source line (None for a bare config) and template fields."""

    line: int | None
    fields: dict[str, Any] = field(default_factory=dict)
    kernel: str | None = None


@dataclass
class CheckContext:
    device: DeviceEntry
    triton: TritonInfo
    model: KernelModel | None
    configs: list[LaunchConfig]
    elem_bytes: int | None = None


@dataclass(frozen=True)
class CheckKind:
    name: str
    params: type[KBModel]
    evaluate: Callable[[Any, CheckContext], list[Finding]]
    describe: Callable[[Any, DeviceEntry | None], str]
    placeholders: frozenset[str]
    scope: Literal["config", "source"]
    #: parameter names that hold a device fact name (checked by lint against the device schema)
    fact_params: tuple[str, ...] = ()


CHECKS: dict[str, CheckKind] = {}


def _register(kind: CheckKind) -> None:
    CHECKS[kind.name] = kind


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fmt_values(values: list[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def _option_value(cfg: LaunchConfig, option: str, device: DeviceEntry) -> Any:
    if option in cfg.values:
        return cfg.values[option]
    return device.default_option(option)


# -- power_of_two --------------------------------------------------------------------------------------
class PowerOfTwo(KBModel):
    """Named launch options and constexprs of the given roles (and every ``tl.arange`` bound) are 2^k."""

    kind: Literal["power_of_two"]
    options: list[str] = Field(default_factory=list)
    roles: list[Role] = Field(default_factory=list)
    arange_bounds: bool = False


def _power_of_two(p: PowerOfTwo, ctx: CheckContext) -> list[Finding]:
    out = []
    for cfg in ctx.configs:
        named: dict[str, Any] = {}
        for option in p.options:
            if option in cfg.values:
                named[option] = cfg.values[option]
        for role in p.roles:
            named.update(values_for(role, cfg.values, cfg.roles))
        if p.arange_bounds:
            named.update({n: cfg.values[n] for n in sorted(cfg.arange_bounds) if n in cfg.values})
        for name, value in named.items():
            if _is_int(value) and (value <= 0 or value & (value - 1)):
                lower = 1 << (value.bit_length() - 1) if value > 0 else 1
                out.append(
                    Finding(cfg.line, {"name": name, "value": value, "lower": lower, "upper": lower * 2}, cfg.kernel)
                )
    return out


def _describe_power_of_two(p: PowerOfTwo, device: DeviceEntry | None) -> str:
    parts = list(p.options)
    if p.roles:
        parts.append("constexprs of roles " + "/".join(p.roles))
    if p.arange_bounds:
        parts.append("every tl.arange bound")
    single = len(parts) == 1 and not p.roles and not p.arange_bounds
    return " and ".join(parts) + (" must be a power of two" if single else " must be powers of two")


_register(
    CheckKind(
        "power_of_two",
        PowerOfTwo,
        _power_of_two,
        _describe_power_of_two,
        frozenset({"name", "value", "lower", "upper"}),
        "config",
    )
)


# -- value_range ---------------------------------------------------------------------------------------
class ValueRange(KBModel):
    """A launch option lies in ``[min, max]``; ``max_fact`` takes the maximum from a device fact."""

    kind: Literal["value_range"]
    option: str
    min: int | None = None
    max: int | None = None
    max_fact: str | None = None


def _value_range(p: ValueRange, ctx: CheckContext) -> list[Finding]:
    limit = p.max if p.max is not None else (ctx.device.value(p.max_fact) if p.max_fact else None)
    out = []
    for cfg in ctx.configs:
        value = cfg.values.get(p.option)
        if not _is_int(value):
            continue
        if (p.min is not None and value < p.min) or (limit is not None and value > limit):
            out.append(
                Finding(
                    cfg.line,
                    {"option": p.option, "value": value, "min": p.min, "max": limit, "fact": p.max_fact or ""},
                    cfg.kernel,
                )
            )
    return out


def _describe_value_range(p: ValueRange, device: DeviceEntry | None) -> str:
    limit = p.max if p.max is not None else (device.value(p.max_fact) if device and p.max_fact else None)
    bounds = []
    if p.min is not None:
        bounds.append(f">= {p.min}")
    if limit is not None:
        src = f" ({p.max_fact})" if p.max_fact else ""
        bounds.append(f"<= {limit}{src}")
    elif p.max_fact:
        bounds.append(f"<= the device's {p.max_fact} (unknown for this device: not checked)")
    return f"{p.option} must be " + " and ".join(bounds)


_register(
    CheckKind(
        "value_range",
        ValueRange,
        _value_range,
        _describe_value_range,
        frozenset({"option", "value", "min", "max", "fact"}),
        "config",
        ("max_fact",),
    )
)


# -- allowed_values ------------------------------------------------------------------------------------
class AllowedValues(KBModel):
    """A launch option, when set, takes one of ``values`` (type matters: ``'256'`` is not ``256``)."""

    kind: Literal["allowed_values"]
    option: str
    values: list[str | int]


def _allowed_values(p: AllowedValues, ctx: CheckContext) -> list[Finding]:
    out = []
    for cfg in ctx.configs:
        if p.option in cfg.values:
            value = cfg.values[p.option]
            if not any(type(value) is type(v) and value == v for v in p.values):
                out.append(
                    Finding(
                        cfg.line,
                        {"option": p.option, "value": value, "allowed": _fmt_values(p.values)},
                        cfg.kernel,
                    )
                )
    return out


_register(
    CheckKind(
        "allowed_values",
        AllowedValues,
        _allowed_values,
        lambda p, d: f"{p.option} must be {'one of ' if len(p.values) > 1 else ''}{_fmt_values(p.values)}",
        frozenset({"option", "value", "allowed"}),
        "config",
    )
)


# -- value_in_fact -------------------------------------------------------------------------------------
class ValueInFact(KBModel):
    """A launch option, when set, is one of the values of a device fact (e.g. ``subgroup_sizes``)."""

    kind: Literal["value_in_fact"]
    options: list[str]
    fact: str


def _value_in_fact(p: ValueInFact, ctx: CheckContext) -> list[Finding]:
    allowed = ctx.device.value(p.fact)
    if not isinstance(allowed, list):
        return []
    out = []
    for cfg in ctx.configs:
        for option in p.options:
            value = cfg.values.get(option)
            if value is not None and value not in allowed:
                out.append(
                    Finding(
                        cfg.line,
                        {"option": option, "value": value, "allowed": _fmt_values(allowed), "fact": p.fact},
                        cfg.kernel,
                    )
                )
    return out


def _describe_value_in_fact(p: ValueInFact, device: DeviceEntry | None) -> str:
    allowed = device.value(p.fact) if device else None
    shown = _fmt_values(allowed) if isinstance(allowed, list) else f"the device's {p.fact}"
    return f"{'/'.join(p.options)} must be one of {shown}"


_register(
    CheckKind(
        "value_in_fact",
        ValueInFact,
        _value_in_fact,
        _describe_value_in_fact,
        frozenset({"option", "value", "allowed", "fact"}),
        "config",
        ("fact",),
    )
)


# -- option_max_when -----------------------------------------------------------------------------------
class OptionMaxWhen(KBModel):
    """When ``when_option`` is one of ``when_values``, ``option`` (or its backend default) is <= ``max``."""

    kind: Literal["option_max_when"]
    option: str
    max: int
    when_option: str
    when_values: list[str | int]


def _option_max_when(p: OptionMaxWhen, ctx: CheckContext) -> list[Finding]:
    out = []
    for cfg in ctx.configs:
        trigger = cfg.values.get(p.when_option)
        if trigger is None or not any(type(trigger) is type(v) and trigger == v for v in p.when_values):
            continue
        value = _option_value(cfg, p.option, ctx.device)
        if _is_int(value) and value > p.max:
            out.append(
                Finding(
                    cfg.line,
                    {"option": p.option, "value": value, "max": p.max, "when_option": p.when_option,
                     "when_value": trigger},
                    cfg.kernel,
                )
            )
    return out


_register(
    CheckKind(
        "option_max_when",
        OptionMaxWhen,
        _option_max_when,
        lambda p, d: f"{p.option} <= {p.max} when {p.when_option} is {_fmt_values(p.when_values)}",
        frozenset({"option", "value", "max", "when_option", "when_value"}),
        "config",
    )
)


# -- option_spelling -----------------------------------------------------------------------------------
class OptionSpelling(KBModel):
    """Under this version the option known as ``canonical`` is spelled ``spelling``; ``rejected`` names fail."""

    kind: Literal["option_spelling"]
    canonical: str
    spelling: str
    rejected: list[str]


def _option_spelling(p: OptionSpelling, ctx: CheckContext) -> list[Finding]:
    out = []
    for cfg in ctx.configs:
        for name in p.rejected:
            if name in cfg.values:
                out.append(
                    Finding(
                        cfg.line,
                        {"option": name, "value": cfg.values[name], "spelling": p.spelling,
                         "canonical": p.canonical},
                        cfg.kernel,
                    )
                )
    return out


_register(
    CheckKind(
        "option_spelling",
        OptionSpelling,
        _option_spelling,
        lambda p, d: f"the {p.canonical} option is spelled {p.spelling!r} ({_fmt_values(p.rejected)} is rejected)",
        frozenset({"option", "value", "spelling", "canonical"}),
        "config",
    )
)


# -- forbidden_options ---------------------------------------------------------------------------------
class ForbiddenOptions(KBModel):
    """None of these launch options / ``triton.Config`` keys may be set."""

    kind: Literal["forbidden_options"]
    options: list[str]


def _forbidden_options(p: ForbiddenOptions, ctx: CheckContext) -> list[Finding]:
    return [
        Finding(cfg.line, {"option": name, "value": cfg.values[name]}, cfg.kernel)
        for cfg in ctx.configs
        for name in p.options
        if name in cfg.values
    ]


_register(
    CheckKind(
        "forbidden_options",
        ForbiddenOptions,
        _forbidden_options,
        lambda p, d: f"launch options {_fmt_values(p.options)} must not be set",
        frozenset({"option", "value"}),
        "config",
    )
)


# -- forbidden_calls -----------------------------------------------------------------------------------
class ForbiddenCalls(KBModel):
    """No call to these functions (``tl.x`` also matches ``triton.language.x``); ``methods`` also catches
    method-call spellings such as ``ptr.advance(...)`` inside jit functions."""

    kind: Literal["forbidden_calls"]
    calls: list[str]
    methods: list[str] = Field(default_factory=list)


def _forbidden_calls(p: ForbiddenCalls, ctx: CheckContext) -> list[Finding]:
    if ctx.model is None:
        return []
    out = [
        Finding(c.line, {"call": c.name, "function": c.function}, c.function)
        for c in ctx.model.calls_to(*p.calls)
    ]
    if p.methods:
        for c in ctx.model.calls:
            head, _, last = c.name.rpartition(".")
            if (
                last in p.methods
                and head
                and head.split(".")[0] not in ("tl", "triton")
                and c.function in ctx.model.functions
            ):
                out.append(Finding(c.line, {"call": c.name, "function": c.function}, c.function))
    return out


_register(
    CheckKind(
        "forbidden_calls",
        ForbiddenCalls,
        _forbidden_calls,
        lambda p, d: "no calls to " + ", ".join(p.calls + [f".{m}()" for m in p.methods]),
        frozenset({"call", "function"}),
        "source",
    )
)


# -- forbidden_names -----------------------------------------------------------------------------------
class ForbiddenNames(KBModel):
    """No reference to these names (e.g. ``tl.float64``) inside jit functions."""

    kind: Literal["forbidden_names"]
    names: list[str]


def _forbidden_names(p: ForbiddenNames, ctx: CheckContext) -> list[Finding]:
    if ctx.model is None:
        return []
    return [Finding(line, {"name": name}) for name, line in attribute_uses(ctx.model, set(p.names))]


_register(
    CheckKind(
        "forbidden_names",
        ForbiddenNames,
        _forbidden_names,
        lambda p, d: "jit code must not use " + ", ".join(p.names),
        frozenset({"name"}),
        "source",
    )
)


# -- min_dot_shape -------------------------------------------------------------------------------------
class MinDotShape(KBModel):
    """In kernels that call ``tl.dot``, the tile constexprs of the given roles reach the device minimum
    (``fact``: a ``{m, n, k}`` shape). When a ``head_dim`` constexpr is present (attention), ``block_n`` is
    also a K extent (P @ V)."""

    kind: Literal["min_dot_shape"]
    fact: str
    m_roles: list[Role] = Field(default_factory=lambda: ["block_m"])
    n_roles: list[Role] = Field(default_factory=lambda: ["block_n", "head_dim"])
    k_roles: list[Role] = Field(default_factory=lambda: ["block_k", "head_dim"])


def _min_dot_shape(p: MinDotShape, ctx: CheckContext) -> list[Finding]:
    shape = ctx.device.value(p.fact)
    if not isinstance(shape, DotShape):
        return []
    out = []
    for cfg in ctx.configs:
        if not cfg.uses_dot:
            continue
        k_roles = list(p.k_roles)
        if values_for("head_dim", cfg.values, cfg.roles) and "block_n" not in k_roles:
            k_roles.append("block_n")
        seen: set[tuple[str, str]] = set()
        for dim, roles, minimum in (("M", p.m_roles, shape.m), ("N", p.n_roles, shape.n), ("K", k_roles, shape.k)):
            for role in roles:
                for name, value in values_for(role, cfg.values, cfg.roles):
                    if _is_int(value) and value < minimum and (name, dim) not in seen:
                        seen.add((name, dim))
                        out.append(
                            Finding(
                                cfg.line,
                                {"name": name, "value": value, "dim": dim, "min": minimum,
                                 "shape": f"{shape.m}x{shape.n}x{shape.k}"},
                                cfg.kernel,
                            )
                        )
    return out


def _describe_min_dot(p: MinDotShape, device: DeviceEntry | None) -> str:
    shape = device.value(p.fact) if device else None
    if isinstance(shape, DotShape):
        return f"tl.dot tiles at least M>={shape.m}, N>={shape.n}, K>={shape.k} (16-bit inputs)"
    return f"tl.dot tiles at least the device's {p.fact} (unknown for this device: not checked)"


_register(
    CheckKind(
        "min_dot_shape",
        MinDotShape,
        _min_dot_shape,
        _describe_min_dot,
        frozenset({"name", "value", "dim", "min", "shape"}),
        "config",
        ("fact",),
    )
)


# -- slm_estimate --------------------------------------------------------------------------------------
class SlmEstimate(KBModel):
    """Estimated shared local memory of a ``tl.dot`` kernel stays within a device fact (bytes).

    ``multistage`` (NVIDIA): num_stages * (BM*BK + BK*BN) * elem bytes (attention: (BM*D + num_stages*2*BN*D)).
    ``single_stage`` (XPU, operands staged through SLM once): (BM*BK + BK*BN) * elem bytes.
    ``elem_bytes`` is the assumed element size when the caller does not pass the dtype."""

    kind: Literal["slm_estimate"]
    model: Literal["multistage", "single_stage"]
    fact: str
    elem_bytes: int = 2


def _slm_estimate(p: SlmEstimate, ctx: CheckContext) -> list[Finding]:
    limit = ctx.device.value(p.fact)
    if not _is_int(limit):
        return []
    eb = ctx.elem_bytes or p.elem_bytes
    out = []
    for cfg in ctx.configs:
        if not cfg.uses_dot:
            continue
        roles = cfg.roles
        bm, bn, bk = (first_int(r, cfg.values, roles) for r in ("block_m", "block_n", "block_k"))
        d = first_int("head_dim", cfg.values, roles)
        stages = _option_value(cfg, "num_stages", ctx.device)
        stages = stages if _is_int(stages) and stages > 0 else 1
        if p.model == "single_stage":
            stages = 1
        if bm and bn and bk:
            estimate = stages * (bm * bk + bk * bn) * eb
            formula = f"{stages} x ({bm}x{bk} + {bk}x{bn}) x {eb} B"
        elif bm and bn and d:
            estimate = (bm * d + stages * 2 * bn * d) * eb
            formula = f"({bm}x{d} + {stages} x 2 x {bn}x{d}) x {eb} B"
        else:
            continue
        if estimate > limit:
            out.append(
                Finding(
                    cfg.line,
                    {"estimate": estimate, "limit": limit, "estimate_kb": estimate // 1024,
                     "limit_kb": limit // 1024, "num_stages": stages, "elem_bytes": eb, "formula": formula},
                    cfg.kernel,
                )
            )
    return out


def _describe_slm(p: SlmEstimate, device: DeviceEntry | None) -> str:
    limit = device.value(p.fact) if device else None
    shown = f"{limit // 1024} KB" if _is_int(limit) else f"the device's {p.fact}"
    how = "num_stages x (BM*BK + BK*BN)" if p.model == "multistage" else "(BM*BK + BK*BN)"
    return f"estimated shared memory {how} x {p.elem_bytes} B (unless the dtype is known) <= {shown}"


_register(
    CheckKind(
        "slm_estimate",
        SlmEstimate,
        _slm_estimate,
        _describe_slm,
        frozenset({"estimate", "limit", "estimate_kb", "limit_kb", "num_stages", "elem_bytes", "formula"}),
        "config",
        ("fact",),
    )
)


# -- work_group_size -----------------------------------------------------------------------------------
class WorkGroupSize(KBModel):
    """num_warps x warp size <= a device fact. Kernels that use DPAS run with ``dot_warp_size`` lanes
    (the backend forces it) on devices whose ``triton_uses_dpas`` is true."""

    kind: Literal["work_group_size"]
    fact: str
    dot_warp_size: int | None = None


def _work_group_size(p: WorkGroupSize, ctx: CheckContext) -> list[Finding]:
    limit = ctx.device.value(p.fact)
    if not _is_int(limit):
        return []
    out = []
    for cfg in ctx.configs:
        warps = _option_value(cfg, "num_warps", ctx.device)
        if cfg.uses_dot and p.dot_warp_size and ctx.device.value("triton_uses_dpas"):
            lanes = p.dot_warp_size
        else:
            lanes = cfg.values.get("warp_size", cfg.values.get("threads_per_warp"))
            if lanes is None:
                lanes = ctx.device.default_option("warp_size")
        if _is_int(warps) and _is_int(lanes) and warps * lanes > limit:
            out.append(
                Finding(
                    cfg.line,
                    {"num_warps": warps, "warp_size": lanes, "work_items": warps * lanes, "limit": limit},
                    cfg.kernel,
                )
            )
    return out


def _describe_wg(p: WorkGroupSize, device: DeviceEntry | None) -> str:
    limit = device.value(p.fact) if device else None
    shown = str(limit) if _is_int(limit) else f"the device's {p.fact}"
    extra = f" ({p.dot_warp_size} lanes for DPAS kernels)" if p.dot_warp_size else ""
    return f"num_warps x warp_size{extra} <= {shown} work-items"


_register(
    CheckKind(
        "work_group_size",
        WorkGroupSize,
        _work_group_size,
        _describe_wg,
        frozenset({"num_warps", "warp_size", "work_items", "limit"}),
        "config",
        ("fact",),
    )
)


# -- block_ptr_last_stride_one -------------------------------------------------------------------------
class BlockPtrLastStrideOne(KBModel):
    """Each ``tl.make_block_ptr`` passes ``strides`` as a literal tuple whose last element is the literal 1."""

    kind: Literal["block_ptr_last_stride_one"]


def _block_ptr_last_stride(p: BlockPtrLastStrideOne, ctx: CheckContext) -> list[Finding]:
    if ctx.model is None:
        return []
    out = []
    for call in ctx.model.calls_to("tl.make_block_ptr"):
        node = call.node
        strides = next((k.value for k in node.keywords if k.arg == "strides"), None)
        if strides is None and len(node.args) > 2:
            strides = node.args[2]
        ok = (
            isinstance(strides, (ast.Tuple, ast.List))
            and strides.elts
            and isinstance(strides.elts[-1], ast.Constant)
            and strides.elts[-1].value == 1
        )
        if not ok:
            text = ctx.model.segment(strides) if strides is not None else "(missing)"
            out.append(Finding(call.line, {"strides": text, "function": call.function}, call.function))
    return out


_register(
    CheckKind(
        "block_ptr_last_stride_one",
        BlockPtrLastStrideOne,
        _block_ptr_last_stride,
        lambda p, d: "tl.make_block_ptr strides end in the literal 1",
        frozenset({"strides", "function"}),
        "source",
    )
)


CheckSpec = Annotated[
    Union[tuple(kind.params for kind in CHECKS.values())],  # type: ignore[valid-type]
    Field(discriminator="kind"),
]


def evaluate(spec: Any, ctx: CheckContext) -> list[Finding]:
    return CHECKS[spec.kind].evaluate(spec, ctx)


def describe(spec: Any, device: DeviceEntry | None = None) -> str:
    return CHECKS[spec.kind].describe(spec, device)


def check_params(spec: Any) -> dict[str, Any]:
    """The parameters of a check as plain data (for JSON / explain)."""
    return spec.model_dump(exclude_defaults=False)
