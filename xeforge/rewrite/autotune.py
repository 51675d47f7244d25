"""Autotune rewrite: literal launch configurations become a short ``@triton.autotune`` list keyed on shapes.

Owns: planning and applying the autotuning stage's codemod. For the launch of one kernel it

1. collects the key — the kernel's shape arguments: parameters that bound masks, block pointers, loops or
   ``tl.cdiv`` (``M``, ``N``, ``K``, ``n_elements``...), never pointers or strides;
2. writes ``@triton.autotune(configs=[triton.Config({...}, num_warps=..., num_stages=...), ...], key=[...])``
   above ``@triton.jit`` — constexprs in the dict, ``num_warps``/``num_stages`` (and ``num_ctas``/``maxnreg``)
   as keywords; on Intel GPUs ``grf_mode`` and the warp size go in the dict (KB ``autotune-grf-in-config-dict``),
   on other targets they are dropped (KB ``autotune-no-intel-keys-on-nvidia``);
3. removes the autotuned constexprs and options from the launch and turns a tuple grid into
   ``lambda META: (...)`` with ``META["BLOCK_M"]`` in place of the literal block sizes.

A kernel that both loads and stores the same tensor gets ``restore_value`` for it (autotuning runs every
config on the real arguments); one that uses atomics is left alone, since benchmark runs would accumulate.

A kernel that arrives ``@triton.autotune``'d (most kernels people write for NVIDIA) is met where it is:
:func:`extend` appends KB-valid configurations for the device to its own list (``configs=[...]`` literal), and
:func:`pin` removes the decorator and writes one configuration at the launch (the launch-parameter search times
each of the kernel's own configurations this way, and the best one is kept without the first-call tuning).
:func:`with_configs` re-tiles a structural rewrite with the top KB configurations for the stages that propose one
(dtype, block I/O, persistent, swizzle): written at a plain launch, pinned on an autotuned kernel.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from xeforge.analysis.launches import autotune_configs, bindings, launch_options
from xeforge.kb.kernel_facts import roles_by_use
from xeforge.kb.roles import first_int
from xeforge.kernel_model import KernelModel, axis_blocks, parse_kernel
from xeforge.rewrite.tiling import BlockPtr, KernelAnalysis, Mask, NotApplicable, Ptr, is_tl_call
from xeforge.rewrite.tiling.dispatch import undispatch
from xeforge.rewrite.tiling.grid import GridTranslator, launch_grid, launched_kernels_gemm_first, single_launch
from xeforge.rewrite.tiling.configs import OPTION_KEYS, apply_config, current_config, kb_configs, tunable, values_at
from xeforge.rewrite.tiling.host_rule import heuristic_entries, host_made
from xeforge.rewrite.tiling.edit import (LaunchEdit, add_before_function, add_decorator, drop_dict_entries,
                                        edit_launch, extend_decorator_list, remove_decorator, rewrite_decorator_args)

#: options triton.Config takes as keywords
CONFIG_KWARGS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
#: Intel-only options that go in the Config dict on xpu
XPU_DICT_OPTIONS = ("grf_mode", "warp_size", "threads_per_warp")
MAX_CONFIGS = 4


@dataclass
class AutotunePlan:
    kernel: str
    key: list[str]
    tuned: list[str]  # constexprs moved into the configs
    options: list[str]  # launch options moved into the configs
    configs: list[dict[str, Any]]
    grid: str | None  # the new grid expression (None: unchanged)
    restore: list[str] = field(default_factory=list)
    added: int = 0  # configurations appended to a list the kernel already had (0: a new decorator)
    from_heuristics: list[str] = field(default_factory=list)  # entries of its @triton.heuristics the configs take
    replaced_dispatch: int = 0  # branches of a per-shape dispatch this decorator replaces (their configs are listed)

    def describe(self) -> str:
        what = ", ".join(self.tuned + self.options)
        if self.replaced_dispatch:
            return (f"{self.kernel}: @triton.autotune over {len(self.configs)} config(s) of {what}, keyed on "
                    f"{', '.join(self.key)}, in place of the per-shape dispatch of {self.replaced_dispatch} launches "
                    "(each branch's configuration listed)")
        if self.added:
            return (f"{self.kernel}: its own @triton.autotune list of {len(self.configs) - self.added} extended by "
                    f"{self.added} KB configuration(s) of {what}, keyed on {', '.join(self.key) or 'nothing'}")
        return f"{self.kernel}: @triton.autotune over {len(self.configs)} config(s) of {what}, keyed on {', '.join(self.key)}"


def shape_args(an: KernelAnalysis) -> list[str]:
    """Non-constexpr parameters that size the problem (bounds of masks, block pointers, loops, cdiv)."""
    used: set[str] = set()
    for acc in an.accesses:
        if isinstance(acc.mask, Mask):
            for b in acc.mask.bounds:
                used |= b.limit.symbols()
        if isinstance(acc.ptr, BlockPtr):
            for s in acc.ptr.shape:
                used |= s.symbols()
    for node in ast.walk(an.node):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
            for a in node.iter.args[1:2]:
                used |= {n.id for n in ast.walk(a) if isinstance(n, ast.Name)}
        if is_tl_call(node, "cdiv"):
            for a in node.args[:1]:
                used |= {n.id for n in ast.walk(a) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Compare):  # a bound: `offs < n`, also in a branch the access analysis leaves out
            used |= {n.id for c in node.comparators for n in ast.walk(c) if isinstance(n, ast.Name)}
    pointers = {acc.ptr.base for acc in an.accesses if isinstance(acc.ptr, (Ptr, BlockPtr))}
    return [p for p in an.params if p in used and p not in an.constexprs and p not in pointers
            and not p.lower().startswith("stride")]


def plan_autotune(model: KernelModel, kernel: str, configs: list[dict[str, Any]], device_kind: str,
                  include_incumbent: bool = True) -> AutotunePlan:
    """``configs`` follow the launch's own configuration (first, unless ``include_incumbent`` is False)."""
    fn = model.functions[kernel]
    if fn.is_autotuned:
        raise NotApplicable(f"{kernel} is already @triton.autotune'd")
    entries = heuristic_entries(fn.node)  # what @triton.heuristics sets, over anything an autotuner above it passes
    if entries is None:
        raise NotApplicable(f"{kernel} uses @triton.heuristics whose keys are not a literal dict (what it sets is "
                            "not known, so configurations could clash with it)")
    heuristic = set(entries)
    site = single_launch(model, kernel)
    an = KernelAnalysis(fn)
    if any(n for n in ast.walk(fn.node) if isinstance(n, ast.Call) and
           (ast.unparse(n.func).startswith(("tl.atomic_", "triton.language.atomic_")))):
        raise NotApplicable(f"{kernel} uses atomics: autotune benchmark runs would accumulate into its outputs")
    key = shape_args(an)
    if not key:
        raise NotApplicable(f"{kernel} has no shape arguments to key the autotuner on")
    # values the host makes into variables are the autotuner's now (dropped from the launch); those of a dict the
    # launch unpacks (``**cfg``) cannot be dropped there, so they stay the host's
    made = host_made(model, site)
    in_dict = {n for n, m in made.items() if m.target != m.var}
    # a block size its @triton.heuristics makes is tuned where the search may set it (tunable: the grid reads it from
    # META, or a loop steps by it), and so is a launch option it makes: those entries leave the decorator, the
    # autotuner's configs set them (the traced value at the primary shape first); the other entries stay
    names = [n for n in tunable(model, site) if n not in in_dict]
    values = values_at(model, site)
    launch_opts = {**launch_options(model, site),
                   **{k: v for k, v in values.items() if k in OPTION_KEYS and (k in made or k in heuristic)
                      and k not in in_dict}}
    if not names and not launch_opts:
        left = [b.why for n, b in bindings(model, site).items()
                if b.why and not b.constant and b.how != "default" and n not in heuristic]
        if heuristic:
            left.append(f"{', '.join(sorted(heuristic))} come from {kernel}'s @triton.heuristics and none is a block "
                        "size the grid or a loop follows")
        raise NotApplicable(f"{kernel}'s launch has no block sizes or launch options with one value to tune"
                            + (f" ({'; '.join(left)})" if left else ""))
    # the grid must follow META wherever a tuned block sizes a grid axis; a block that sizes it in a way META cannot
    # express (through a local the host computes) stays the host's, and the rest is tuned (rope_cache's BLOCK_H,
    # once the launch search could set it where the host makes it, took its launch options out of autotuning)
    grid_info = launch_grid(model, site)
    if grid_info is None:
        raise NotApplicable(f"the grid of the launch at line {site.line} is not a tuple or a lambda returning one")
    tr = GridTranslator(model, site, an, grid_info)
    coupled = {n for names_ in axis_blocks(fn).values() for n in names_} & set(names)
    if grid_info.kind == "tuple":
        used = {b for el in grid_info.elements for b in tr.blocks_in(el)}
        hidden = coupled - used
        if hidden:
            names = [n for n in names if n not in hidden]
            if not names and not launch_opts:
                raise NotApplicable(f"{', '.join(sorted(hidden))} size(s) the grid in a way the rewrite cannot "
                                    "express with META, and nothing else is left to tune")
    xpu = device_kind == "xpu"
    current = {**{n: values[n] for n in names}, **launch_opts}
    cleaned: list[dict[str, Any]] = []
    for cfg in ([current] if include_incumbent else []) + list(configs):
        c = {k: v for k, v in {**current, **cfg}.items() if (k in names or k in OPTION_KEYS) and k not in in_dict
             and (k not in heuristic or k in names or k in launch_opts)}
        if not xpu:
            c = {k: v for k, v in c.items() if k not in XPU_DICT_OPTIONS}
        if c not in cleaned:
            cleaned.append(c)
        if len(cleaned) >= MAX_CONFIGS:
            break
    if not cleaned:
        raise NotApplicable("no configuration to autotune over")
    options = sorted({k for c in cleaned for k in c if k in OPTION_KEYS} | set(launch_opts))
    new_grid = None
    if grid_info.kind == "tuple":
        tuned_in_grid = {b for el in grid_info.elements for b in tr.blocks_in(el)} & set(names)
        if tuned_in_grid:
            elems = [tr.meta_expr(el) for el in grid_info.elements]
            new_grid = "lambda META: (" + ", ".join(elems) + ("," if len(elems) == 1 else "") + ")"
    else:
        literal_blocks = [b for el in grid_info.elements for b in tr.blocks_in(el)
                          if not _uses_meta(el, grid_info.meta)]
        if literal_blocks:
            raise NotApplicable("the lambda grid divides by literal block sizes")
    loaded = {a.ptr.base for a in an.accesses if a.kind == "load" and isinstance(a.ptr, (Ptr, BlockPtr))}
    stored = {a.ptr.base for a in an.accesses if a.kind == "store" and isinstance(a.ptr, (Ptr, BlockPtr))}
    restore = [p for p in fn.params if p in loaded & stored]
    taken = sorted(k for k in heuristic if k in names or k in options)
    return AutotunePlan(kernel, key, names, options, cleaned, new_grid, restore, from_heuristics=taken)


def _uses_meta(node: ast.AST, meta: str | None) -> bool:
    return meta is not None and any(isinstance(n, ast.Name) and n.id == meta for n in ast.walk(node))


def _config_code(cfg: dict[str, Any], tuned: list[str], xpu: bool) -> str:
    d = {k: v for k, v in cfg.items() if k in tuned or (xpu and k in XPU_DICT_OPTIONS)}
    kw = [f"{k}={v!r}" for k, v in cfg.items() if k in CONFIG_KWARGS]
    inner = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in d.items()) + "}"
    return "triton.Config(" + ", ".join([inner, *kw]) + ")"


def apply_autotune(source: str, plan: AutotunePlan, device_kind: str) -> str:
    xpu = device_kind == "xpu"
    configs = ",\n        ".join(_config_code(c, plan.tuned, xpu) for c in plan.configs)
    key = ", ".join(repr(k) for k in plan.key)
    extra = f",\n    restore_value=[{', '.join(repr(r) for r in plan.restore)}]" if plan.restore else ""
    decorator = (f"triton.autotune(\n    configs=[\n        {configs},\n    ],\n    key=[{key}]{extra},\n)")
    model = parse_kernel(source)
    site = single_launch(model, plan.kernel)
    edit = LaunchEdit(plan.kernel, site.line, drop_kwargs=set(plan.tuned) | set(plan.options))
    if plan.grid is not None:
        g = launch_grid(model, site)
        if g is not None and g.variable and g.assign is not None:
            uses = sum(1 for n in ast.walk(model.tree) if isinstance(n, ast.Name) and n.id == g.variable
                       and isinstance(n.ctx, ast.Load))
            if uses == 1:
                edit.grid_assign = (g.assign.lineno, plan.grid)
            else:
                edit.grid = plan.grid
        else:
            edit.grid = plan.grid
    source = edit_launch(source, edit)
    if plan.from_heuristics:  # Triton would set these over the autotuner's configs
        source = drop_dict_entries(source, plan.kernel, HEURISTICS_DECORATORS, set(plan.from_heuristics))
    return add_decorator(source, plan.kernel, decorator, outermost=True)


def rewrite(source: str, configs: list[dict[str, Any]], device_kind: str, kernel: str | None = None,
            include_incumbent: bool = True) -> tuple[str, AutotunePlan]:
    model = parse_kernel(source)
    names = [kernel] if kernel else launched_kernels_gemm_first(model)
    errors = []
    for name in names:
        src, pool, replaced = source, list(configs), 0
        undone = undispatch(source, name)  # a per-shape dispatch: the autotuner's key picks per shape instead
        if undone is not None:
            src, branch = undone
            pool = [c for c in branch[1:] + pool if c != branch[0]]
            replaced = len(branch)
        try:
            plan = plan_autotune(parse_kernel(src) if undone else model, name, pool, device_kind, include_incumbent)
        except NotApplicable as exc:
            errors.append(f"{name}: {exc}")
            continue
        plan.replaced_dispatch = replaced
        return apply_autotune(src, plan, device_kind), plan
    raise NotApplicable("; ".join(errors) or "no kernel launch found")



AUTOTUNE_DECORATORS = ("triton.autotune", "autotune")
HEURISTICS_DECORATORS = ("triton.heuristics", "heuristics")


def _kwargs_code(cfg: dict[str, Any], device_kind: str) -> dict[str, str]:
    xpu = device_kind == "xpu"
    return {k: repr(v) for k, v in cfg.items() if v is not None and (xpu or k not in XPU_DICT_OPTIONS)}


#: what a pinned configuration of a kernel whose @triton.autotune prunes its configs is run through
PINNED_FIRST = "_xeforge_pinned_first"
_PINNED_FIRST_CODE = f'''def {PINNED_FIRST}(prune_configs_by):
    """xeforge: the configuration listed first (the port's) where the kernel's own pruning keeps it, else the first
    one the pruning keeps; only that one runs, none is timed against another."""
    early = prune_configs_by.get("early_config_prune") if isinstance(prune_configs_by, dict) else None

    def first_kept(configs, named_args, **kwargs):
        kept = list(early(configs, named_args, **kwargs)) if early is not None else list(configs)
        return kept[:1]

    return {{"early_config_prune": first_kept}}
'''


def _prunes(fn: Any) -> bool:
    """``fn``'s ``@triton.autotune`` passes ``prune_configs_by`` (a rule of the user's about which configs may run:
    a K tile inside one quantization group, say)."""
    return any(isinstance(d, ast.Call) and any(k.arg == "prune_configs_by" for k in d.keywords)
               for d in fn.node.decorator_list)


def pin(source: str, kernel: str, cfg: dict[str, Any], device_kind: str = "cuda") -> str:
    """``source`` with ``kernel``'s ``@triton.autotune`` removed and ``cfg`` written at its launch (its grid reads
    the block sizes from ``META``, which holds the launch's keyword arguments).

    Where the autotuner prunes its configs (``prune_configs_by``), that rule is the user's and stays: the decorator
    is kept with ``cfg`` listed first and a pruning that runs the first config the user's pruning keeps, so ``cfg``
    runs where the rule allows it and the user's own choice elsewhere (int4_dequant_matmul's K tile of 64 broke its
    group size of 32 once pinned at the launch)."""
    model = parse_kernel(source)
    fn = model.functions[kernel]
    if not fn.is_autotuned:
        raise NotApplicable(f"{kernel} is not @triton.autotune'd")
    if _prunes(fn):
        return _pin_within_pruning(source, fn, cfg, device_kind)
    site = single_launch(model, kernel)
    grid = launch_grid(model, site)
    if grid is None:
        raise NotApplicable(f"the grid of the launch at line {site.line} is not a tuple or a lambda returning one")
    unknown = [k for k in cfg if k not in fn.constexpr_params and k not in OPTION_KEYS]
    if unknown:
        raise NotApplicable(f"config keys {', '.join(unknown)} are neither constexprs of {kernel} nor launch options")
    source = edit_launch(source, LaunchEdit(kernel, site.line, set_kwargs=_kwargs_code(cfg, device_kind)))
    return remove_decorator(source, kernel, AUTOTUNE_DECORATORS)  # last: it moves the lines below it


def _pin_within_pruning(source: str, fn: Any, cfg: dict[str, Any], device_kind: str) -> str:
    unknown = [k for k in cfg if k not in fn.constexpr_params and k not in OPTION_KEYS]
    if unknown:
        raise NotApplicable(f"config keys {', '.join(unknown)} are neither constexprs of {fn.name} nor launch options")
    first = _config_code(cfg, [k for k in cfg if k in fn.constexpr_params], device_kind == "xpu")
    source = rewrite_decorator_args(source, fn.name, AUTOTUNE_DECORATORS, {
        "configs": lambda old: f"[{first}, *({old})]",
        "prune_configs_by": lambda old: f"{PINNED_FIRST}({old})"})
    return add_before_function(source, fn.name, _PINNED_FIRST_CODE)


def with_configs(ctx: Any, source: str, kernel: str, limit: int) -> list[tuple[dict[str, Any], str]]:
    """On a device that can time: ``source`` re-tiled with up to ``limit`` KB configurations (config, source).

    A plain launch gets each configuration written at it (:func:`apply_config`, the grid following the blocks); an
    ``@triton.autotune``'d kernel gets each one pinned (:func:`pin`: decorator removed), so a rewrite of an autotuned
    kernel is tried with the same tiles as the same rewrite of a kernel launched with literals (on the H200 the
    autotune style of a problem otherwise kept its own tiles through the dtype and fusion stages). Configurations
    that cannot be applied are skipped. Empty on the interpreter, where candidates are only checked for correctness
    and a re-tiled copy would not be ranked, and where the kernel has no single launch to re-tile (a per-shape
    dispatch).
    """
    device = getattr(ctx, "device", None)
    if device is None or not getattr(device, "can_time", False) or limit <= 0:
        return []
    pinned = parse_kernel(source).functions[kernel].is_autotuned
    kind = getattr(device, "kind", "cuda")
    try:
        configs = kb_configs(ctx, source, kernel, limit)
    except NotApplicable:  # e.g. a per-shape dispatch: several launches, no one configuration to re-tile
        return []
    out = []
    for cfg in configs:
        try:
            out.append((cfg, pin(source, kernel, cfg, kind) if pinned else apply_config(source, kernel, cfg)))
        except (NotApplicable, LookupError):
            continue
    return out


def untuned_tile(source: str, kernel: str, configs: list[dict[str, Any]]) -> bool:
    """Whether the launch of ``kernel`` in ``source`` tiles its output with at most a quarter of the area of every one
    of ``configs`` (a 32 x 32 start against the KB's 128 x 128 and larger tiles): then a rewrite re-tiled with them
    is the more likely gain and goes first. On an H100 (2026-12-06), tensor descriptors at a 32 x 32 tile ran 0.83x and
    a persistent loop over it 0.24x of the incumbent, while descriptors at 128 x 256 ran 4.3x; under a time budget the
    plain candidates had used the stage's share. False for an ``@triton.autotune``'d kernel, a launch without one
    literal tile, or configurations without one."""
    model = parse_kernel(source)
    fn = model.functions[kernel]
    if fn.is_autotuned or not configs:
        return False
    try:
        site = single_launch(model, kernel)
    except NotApplicable:
        return False
    by_use = roles_by_use(fn)

    def area(values: dict[str, Any]) -> int | None:
        m, n = first_int("block_m", values, by_use), first_int("block_n", values, by_use)
        return m * n if m and n else None

    now = area(current_config(model, site))
    tiles = [area(c) for c in configs]
    return now is not None and all(t is not None and 4 * now <= t for t in tiles)


def extend(source: str, kernel: str, configs: list[dict[str, Any]], device_kind: str) -> tuple[str, AutotunePlan]:
    """``source`` with ``configs`` (those not already listed) appended to ``kernel``'s ``@triton.autotune`` list."""
    model = parse_kernel(source)
    fn = model.functions[kernel]
    if not fn.is_autotuned:
        raise NotApplicable(f"{kernel} is not @triton.autotune'd")
    own = autotune_configs(model, kernel)
    tuned = sorted({k for c in own for k in c if k in fn.constexpr_params})
    xpu = device_kind == "xpu"
    new: list[dict[str, Any]] = []
    for cfg in configs:
        c = {k: v for k, v in cfg.items() if k in tuned or k in OPTION_KEYS}
        if not xpu:
            c = {k: v for k, v in c.items() if k not in XPU_DICT_OPTIONS}
        if set(tuned) - set(c):
            continue  # a configuration must set every constexpr the kernel's own list sets
        if c and c not in own and c not in new:
            new.append(c)
        if len(new) >= MAX_CONFIGS:
            break
    if not new:
        raise NotApplicable(f"{kernel}'s @triton.autotune already lists every KB configuration drawn for the device"
                            if configs else f"no KB configuration for {kernel} on this device to add")
    items = [_config_code(c, tuned, xpu) for c in new]
    source = extend_decorator_list(source, kernel, AUTOTUNE_DECORATORS, "configs", items)
    options = sorted({k for c in new for k in c if k in OPTION_KEYS})
    return source, AutotunePlan(kernel, list(fn.autotune_key), tuned, options, own + new, None, added=len(new))
