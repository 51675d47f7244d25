"""Stage 7, device_tuning: tile sizes, ``num_warps``, ``num_stages`` (and on xpu ``grf_mode``/``warp_size``).

Owns: the launch-parameter search tactic — find the literal constexpr block sizes and launch options at the
launch site of the kernel that matters most, draw alternatives from the knowledge base's tuning space for
the device and kernel family (a small built-in space when no KB entry applies), prune what the KB
constraints forbid, keep grid sizes consistent with the block sizes, and hand the candidates to the
verifier. The pipeline keeps the best verified one.

The stage's other tactics live beside it, in this order (each one works on the best kernel of the ones before):
``split-k`` (:mod:`stages.device_tuning_splitk`, SPLIT_K programs per output tile over slices of K when a GEMM's
tiles leave cores idle; first, because the swizzle would make the 2D grid 1D and the search should tune the
split kernel), ``group-swizzle`` (:mod:`stages.device_tuning_swizzle`, grouped tile order, before the search so
it tunes GROUP_SIZE_M) and ``rows-per-program`` (:mod:`stages.device_tuning_rows`, ROWS rows per program for
kernels that start one tiny program per row, last so ROWS is sized from the tuned block).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from stages.base import Applicability, Candidate, Issue, Stage, StageContext, Tactic
from stages.device_tuning_rows import RowsPerProgram
from stages.device_tuning_splitk import SplitK
from stages.device_tuning_swizzle import GroupedTileOrder
from xeforge.codemod import grid_axis_literal, set_grid_block, set_launch_kwargs
from xeforge.kernel_model import JitFunction, KernelModel, LaunchSite, axis_blocks, dotted_name

BLOCK_HINTS = ("BLOCK", "TILE", "GROUP_SIZE")


def kernel_family(model: KernelModel, fn: JitFunction, declared: str | None = None) -> str:
    """The knowledge-base family whose tuning space fits ``fn``: the spec's kind, unless the kernel cannot be one.

    A matrix product written without ``tl.dot`` (a decode GEMV: each program reduces its outputs' rows over K
    with ``tl.sum``) is ``gemv``: GEMM tiles (64-256 outputs a program) starve it of programs. Any other kernel
    without ``tl.dot`` in a gemm/attention problem (an epilogue kernel) is classified by its body.
    """
    calls = [c.name for c in model.calls if c.function == fn.name]
    dots = sum(1 for c in calls if c.endswith(".dot"))
    reduces = any(c.rsplit(".", 1)[-1] in {"sum", "max", "min", "reduce", "argmax"} for c in calls)
    if declared in {"gemm", "attention"} and not dots:
        return "gemv" if declared == "gemm" and reduces else ("reduction" if reduces else "elementwise")
    if declared in {"gemm", "gemv", "reduction", "elementwise", "attention"}:
        return declared
    if dots >= 2 and any(c.endswith(".exp") or c.endswith(".exp2") for c in calls):
        return "attention"
    if dots:
        return "gemm"
    if reduces:
        return "reduction"
    return "elementwise"


def _is_pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def target_site(model: KernelModel) -> LaunchSite | None:
    """The launch worth tuning first: a kernel with tl.dot, else the first launch with literal block sizes."""
    def score(site: LaunchSite) -> tuple:
        fn = model.functions[site.kernel]
        has_dot = any(c.name.endswith(".dot") and c.function == fn.name for c in model.calls)
        return (not has_dot, site.line)

    sites = [s for s in model.launches if tunable_names(model, s)[0] and not model.functions[s.kernel].is_autotuned]
    return min(sites, key=score) if sites else None


def grid_literals(model: KernelModel, site: LaunchSite) -> list[int]:
    """The literal block sizes in ``cdiv(x, <int>)`` calls of the grid used by ``site`` (inline or a variable)."""
    import ast

    expr = model.segment(site.node.func.slice)
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return []
    if isinstance(node, ast.Name):
        fn = next((f for f in ast.walk(model.tree) if isinstance(f, ast.FunctionDef) and f.name == site.function), None)
        assigns = [a for a in ast.walk(fn) if isinstance(a, ast.Assign) and a.lineno < site.line
                   and any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets)] if fn else []
        node = max(assigns, key=lambda a: a.lineno).value if assigns else node
    out = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and len(call.args) == 2 and (dotted_name(call.func) or "").endswith("cdiv") \
                and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, int):
            out.append(call.args[1].value)
    return out


def tunable_names(model: KernelModel, site: LaunchSite) -> tuple[list[str], dict[str, str]]:
    """Constexprs at ``site`` the search may change, and why each other block-like constexpr is left alone."""
    fn = model.functions[site.kernel]
    axes = axis_blocks(fn)
    # grid literals that no program-id axis explains (e.g. a swizzled 1D grid cdiv(M, 128) * cdiv(N, 128)): a block
    # of that value may size the grid in a way the search cannot follow, so it is left alone
    unexplained = list(grid_literals(model, site))
    for ax, names in axes.items():
        for n in names:
            if site.constexprs.get(n) in unexplained:
                unexplained.remove(site.constexprs[n])
                break
    ok, why = [], {}
    for name, value in site.constexprs.items():
        if not any(h in name.upper() for h in BLOCK_HINTS):
            continue
        if not _is_pow2(value):
            why[name] = f"{name}={value!r} is not a power-of-two literal"
            continue
        coupled = [ax for ax, names in axes.items() if name in names]
        if not coupled and value in unexplained:
            why[name] = (f"{name}={value} may size the grid (cdiv(..., {value}) at the launch) through an index "
                         "computation the search cannot follow")
            continue
        if coupled:
            kind, lit = grid_axis_literal(model.source, site.kernel, site.line, coupled[0])
            if lit != value:
                why[name] = f"{name} sizes grid axis {coupled[0]}, whose size is not cdiv(..., {value}) at the launch"
                continue
        ok.append(name)
    return ok, why


def _fallback_space(site: LaunchSite, names: list[str], device_kind: str) -> dict[str, list[Any]]:
    space: dict[str, list[Any]] = {}
    for n in names:
        v = site.constexprs[n]
        if "GROUP" in n.upper():
            space[n] = sorted({1, 4, 8, v})
        else:
            space[n] = sorted({max(16, v // 2), v, min(256, v * 2), min(256, v * 4)})
    space["num_warps"] = sorted({4, 8, site.options.get("num_warps", 4)})
    if device_kind == "cuda":
        space["num_stages"] = sorted({2, 3, 4, site.options.get("num_stages", 3)})
    return space


class LaunchParamSearch(Tactic):
    name = "launch-params"
    summary = "search block sizes, num_warps and num_stages at the launch site within the KB's valid space"

    def check(self, ctx: StageContext) -> Applicability:
        m = ctx.model
        if not m.launches:
            return Applicability(False, "no kernel launch found in Model.forward")
        site = target_site(m)
        if site is None:
            reasons = []
            for s in m.launches:
                if m.functions[s.kernel].is_autotuned:
                    reasons.append(f"{s.kernel} is already @triton.autotune'd")
                else:
                    _, why = tunable_names(m, s)
                    reasons.append(f"{s.kernel}: " + ("; ".join(why.values()) or "no literal block-size constexprs"))
            return Applicability(False, "no launch with literal block sizes to search (" + "; ".join(reasons) + ")")
        names, why = tunable_names(m, site)
        extra = f" (left alone: {'; '.join(why.values())})" if why else ""
        return Applicability(True, f"{site.kernel} at line {site.line}: {', '.join(names)} + launch options{extra}")

    def configs(self, ctx: StageContext, site: LaunchSite, names: list[str]) -> list[dict[str, Any]]:
        m = ctx.model
        fn = m.functions[site.kernel]
        current = {**{n: site.constexprs[n] for n in names}, **site.options}
        budget = ctx.settings.tuning_budget if ctx.device.can_time else ctx.settings.cpu_tuning_budget
        pool: list[dict[str, Any]] = []
        kb_space = None
        if ctx.kb is not None and ctx.device_id:
            try:
                kb_space = ctx.kb.space(ctx.device_id, kernel_family(m, fn, ctx.problem.spec.kind), ctx.triton)
            except (KeyError, LookupError, AttributeError):
                kb_space = None
        n_seeds = 0
        if kb_space is not None:
            for cfg in kb_space.configs(names):
                pool.append({k: v for k, v in cfg.items() if k in names or k in
                             ("num_warps", "num_stages", "grf_mode", "warp_size")})
            n_seeds = len(getattr(kb_space, "seeds", []) or [])
        else:
            space = _fallback_space(site, names, ctx.device.kind)
            keys = list(space)
            pool = [dict(zip(keys, vals)) for vals in itertools.product(*(space[k] for k in keys))]
        seen, out = set(), []
        # the KB's seeds (configurations known to be good on the device) first, in order; then a deterministic
        # shuffle of the rest, so a small budget still samples the whole space rather than one corner of it
        rest = pool[n_seeds:]
        random.Random(f"{site.kernel}:{sorted(current.items())}").shuffle(rest)
        pool = pool[:n_seeds] + rest
        for cfg in pool:
            full = {**current, **cfg}
            key = tuple(sorted(full.items()))
            if key in seen or full == current:
                continue
            seen.add(key)
            if ctx.kb is not None and ctx.device_id:
                try:
                    if ctx.kb.check_config(full, ctx.device_id, ctx.triton, fn):
                        continue
                except AttributeError:
                    pass
            out.append(cfg)
            if len(out) >= budget:
                break
        return out

    def propose(self, ctx: StageContext) -> list[Candidate]:
        m = ctx.model
        site = target_site(m)
        if site is None:
            return []
        names, _ = tunable_names(m, site)
        axes = axis_blocks(m.functions[site.kernel])
        out = []
        for cfg in self.configs(ctx, site, names):
            src = set_launch_kwargs(ctx.source, site.kernel, site.line, cfg)
            for name in names:
                if name in cfg and cfg[name] != site.constexprs[name]:
                    for ax, ax_names in axes.items():
                        if name in ax_names:
                            src = set_grid_block(src, site.kernel, site.line, ax, site.constexprs[name], cfg[name])
            desc = ", ".join(f"{k}={v}" for k, v in cfg.items())
            out.append(Candidate(src, self.name, f"{site.kernel}: {desc}", kind="search", params=cfg))
        return out


def _detect_defaults(ctx: StageContext) -> list[Issue]:
    out = []
    for site in ctx.model.launches:
        if "num_warps" not in site.options and not ctx.model.functions[site.kernel].is_autotuned:
            out.append(Issue("device_tuning", "default-warps", f"{site.kernel} launches with default num_warps",
                             site.line))
        small = [f"{k}={v}" for k, v in site.constexprs.items() if "BLOCK" in k.upper() and _is_pow2(v) and v <= 32]
        if small:
            out.append(Issue("device_tuning", "small-tiles", f"{site.kernel} uses small fixed tiles ({', '.join(small)})",
                             site.line))
    return out


STAGE = Stage(
    name="device_tuning",
    order=7,
    goal="pick tile sizes, num_warps, num_stages, grf_mode, warp_size and GROUP_SIZE_M for the device",
    kb_topics=("tiles", "warps", "grf", "slm", "swizzle"),
    # split-K first: it needs the 2D grid the swizzle replaces, and the search then tunes the split kernel;
    # swizzle before the search: GROUP_SIZE_M becomes searchable; row batching last: ROWS is sized from the tuned block
    tactics=[SplitK(), GroupedTileOrder(), LaunchParamSearch(), RowsPerProgram()],
    detectors=[_detect_defaults],
)
