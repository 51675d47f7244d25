"""Launch configurations for the structural rewrites: drawn from the knowledge base, applied at the launch.

Owns: reading a kernel's current launch configuration (literal block sizes and launch options), drawing
KB-valid alternatives from the device's tuning space (seeds first, filtered by ``kb.check_config``), applying
a configuration to a launch site while keeping a tuple grid consistent with the block sizes, and ranking the
configurations that earlier ``device_tuning`` trials measured (from the run folder's trial store), and refitting
``num_stages`` when the compiler reports a configuration over the device's shared memory.

A structural rewrite that only pays off with larger tiles (descriptors, persistence, swizzling) is proposed
as-is and, on a GPU, also with the top few KB configurations: the verifier times each one, so the stage can
adopt the rewrite together with the tiles it needs.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from xeforge.kernel_model import KernelModel, LaunchSite, axis_blocks, literal, parse_kernel
from xeforge.rewrite.tiling import NotApplicable
from xeforge.kb.roles import first_int
from xeforge.rewrite.tiling_grid import _cdiv_args, launch_grid, launched_kernels_gemm_first, single_launch
from xeforge.rewrite.tiling_edit import LaunchEdit, edit_launch

#: launch options a configuration may carry besides constexprs
OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "grf_mode", "warp_size", "threads_per_warp")


def tunable(model: KernelModel, site: LaunchSite) -> list[str]:
    """Block-size constexprs at ``site`` that a configuration may change: power-of-two literals named like
    tiles, and — when one scales a grid axis — only if that axis is ``cdiv(..., <the same literal>)`` (the
    launch-parameter search's rule, read from the ``ast`` so it costs no libcst pass)."""
    from stages.device_tuning import BLOCK_HINTS

    fn = model.functions[site.kernel]
    axes = axis_blocks(fn)
    grid = launch_grid(model, site)
    out = []
    for name, value in site.constexprs.items():
        if not any(h in name.upper() for h in BLOCK_HINTS):
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0):
            continue
        coupled = [ax for ax, names in axes.items() if name in names]
        if coupled:
            ax = coupled[0]
            el = grid.elements[ax] if grid is not None and grid.kind == "tuple" and ax < len(grid.elements) else None
            cd = _cdiv_args(el) if el is not None else None
            if cd is None or literal(cd[1]) != value:
                continue
        out.append(name)
    return out


def family(model: KernelModel, kernel: str, declared: str | None) -> str:
    from stages.device_tuning import kernel_family

    return kernel_family(model, model.functions[kernel], declared)


def current_config(model: KernelModel, site: LaunchSite) -> dict[str, Any]:
    names = tunable(model, site)
    return {**{n: site.constexprs[n] for n in names}, **site.options}


def kb_configs(ctx: Any, source: str, kernel: str, limit: int, include_current: bool = False) -> list[dict[str, Any]]:
    """Up to ``limit`` KB-valid configurations for ``kernel`` (seeds first), keyed by its own names.

    Empty when no knowledge base, device entry or tuning space applies. ``include_current``: the launch's own
    configuration may be among them (otherwise it is skipped).
    """
    if ctx is None or getattr(ctx, "kb", None) is None or not getattr(ctx, "device_id", None):
        return []
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    fn = model.functions[kernel]
    names = tunable(model, site)
    declared = getattr(getattr(getattr(ctx, "problem", None), "spec", None), "kind", None)
    try:
        space = ctx.kb.space(ctx.device_id, family(model, kernel, declared), ctx.triton)
    except Exception:  # no space for this device/family: the KB raises its own error type; nothing to draw
        return []
    current = current_config(model, site)
    fixed = {k: v for k, v in site.constexprs.items() if k not in names}
    out: list[dict[str, Any]] = []
    try:
        pool = space.configs(names, kernel=fn, functions=model.functions, fixed=fixed)
        for cfg in pool:
            cfg = {k: v for k, v in cfg.items() if k in names or k in OPTION_KEYS}
            if not cfg:
                continue
            full = {**current, **cfg}
            if not include_current and full == current:
                continue
            if full in out:
                continue
            out.append(full)
            if len(out) >= limit:
                break
    except (TypeError, AttributeError):
        return []
    return out


def apply_config(source: str, kernel: str, cfg: dict[str, Any]) -> str:
    """``source`` with ``cfg`` set at the launch of ``kernel``; cdiv(..., BLOCK) grid axes follow the blocks."""
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    fn = model.functions[kernel]
    names = tunable(model, site)
    keep = {k: v for k, v in cfg.items() if k in names or k in OPTION_KEYS}
    unknown = [k for k in cfg if k not in keep and k not in site.constexprs]
    if unknown:
        raise NotApplicable(f"configuration keys {', '.join(unknown)} are not tunable at the launch of {kernel}")
    edit = LaunchEdit(kernel, site.line, set_kwargs={k: repr(v) for k, v in keep.items()})
    axes = axis_blocks(fn)
    grid = launch_grid(model, site)
    changed = {ax: keep[n] for n in keep if n in site.constexprs and keep[n] != site.constexprs[n]
               for ax, ax_names in axes.items() if n in ax_names}
    if changed:
        if grid is None or grid.kind != "tuple":
            raise NotApplicable("the grid is not a tuple of cdiv(..., BLOCK) axes")
        elems = []
        for ax, el in enumerate(grid.elements):
            text = ast.get_source_segment(source, el) or ast.unparse(el)
            if ax in changed:
                cd = _cdiv_args(el)
                func = ast.get_source_segment(source, el.func) or ast.unparse(el.func)
                num = ast.get_source_segment(source, cd[0]) or ast.unparse(cd[0])
                text = f"{func}({num}, {changed[ax]})"
            elems.append(text)
        new = "(" + ", ".join(elems) + ("," if len(elems) == 1 else "") + ")"
        if grid.variable and grid.assign is not None:
            edit.grid_assign = (grid.assign.lineno, new)
        else:
            edit.grid = new
    return edit_launch(source, edit)


def describe(cfg: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def measured_configs(run_dir: Path | None, kernel: str, limit: int) -> list[dict[str, Any]]:
    """Configurations that earlier device_tuning trials of this run verified and timed, fastest first."""
    if run_dir is None:
        return []
    rows: list[tuple[float, dict[str, Any]]] = []
    for meta_path in sorted(Path(run_dir).glob("trials/*/meta.json")):
        vpath = meta_path.parent / "verdict.json"
        try:
            meta = json.loads(meta_path.read_text())
            verdict = json.loads(vpath.read_text()) if vpath.exists() else None
        except (OSError, ValueError):
            continue
        if not verdict or meta.get("stage") != "device_tuning" or not verdict.get("correct"):
            continue
        speed = verdict.get("speedup")
        params = meta.get("params") or {}
        if not params or not isinstance(speed, (int, float)):
            continue
        if not str(meta.get("description", "")).startswith(f"{kernel}:"):
            continue
        rows.append((float(speed), dict(params)))
    rows.sort(key=lambda r: -r[0])
    out: list[dict[str, Any]] = []
    for _, cfg in rows:
        if cfg not in out:
            out.append(cfg)
        if len(out) >= limit:
            break
    return out


def kb_errors(ctx: Any, source: str) -> list[str]:
    """Gate-1 knowledge-base errors of ``source`` for the target (rule id: message), [] without a KB."""
    if ctx is None or getattr(ctx, "kb", None) is None or not getattr(ctx, "device_id", None):
        return []
    try:
        violations = ctx.kb.check(parse_kernel(source), ctx.device_id, ctx.triton)
    except Exception as exc:  # a KB that cannot check this source is reported, not raised
        return [f"kb check failed: {exc}"]
    return [f"{v.rule_id}: {v.message}" for v in violations if v.is_error]


def with_configs(ctx: Any, source: str, kernel: str, limit: int) -> list[tuple[dict[str, Any], str]]:
    """On a device that can time: ``source`` re-tiled with up to ``limit`` KB configurations (config, source).

    Configurations that cannot be applied to the launch are skipped. Empty on the interpreter, where
    candidates are only checked for correctness and a re-tiled copy would not be ranked.
    """
    device = getattr(ctx, "device", None)
    if device is None or not getattr(device, "can_time", False) or limit <= 0:
        return []
    out = []
    for cfg in kb_configs(ctx, source, kernel, limit):
        try:
            out.append((cfg, apply_config(source, kernel, cfg)))
        except (NotApplicable, LookupError):
            continue
    return out



#: Triton's OutOfResources message for shared memory (NVIDIA and Intel backends word it the same)
SMEM_OVER = re.compile(r"out of resource: shared memory, Required: (\d+), Hardware limit: (\d+)")


def fit_stages(source: str, failure: str, elem_bytes: int = 2,
               fixed_scale: float = 1.0) -> tuple[str, dict[str, Any]] | None:
    """``source`` with fewer ``num_stages`` at its GEMM launch, so that what the compiler said it needs fits.

    ``failure`` is the text of a compile failure. The compiler's figure includes what the pipeline stages do not
    (the epilogue's staging tile, e.g. an fp32 C tile stored through a descriptor, which the knowledge base's
    estimate cannot see); each stage holds one BM x BK and one BN x BK operand tile of ``elem_bytes``. The largest
    stage count that fits is chosen. None when the failure is not a shared-memory one or no count fits.

    ``fixed_scale`` scales that non-stage part: 0.5 for ``source`` whose staging tile was halved after the failure
    (``subtile.subtile_stores``); then the launch's own stage count may fit, and ``source`` comes back unchanged.
    """
    m = SMEM_OVER.search(failure or "")
    if m is None:
        return None
    required, limit = int(m.group(1)), int(m.group(2))
    model = parse_kernel(source)
    for kernel in launched_kernels_gemm_first(model):
        try:
            site = single_launch(model, kernel)
        except NotApplicable:
            continue
        cfg = current_config(model, site)
        stages = cfg.get("num_stages")
        bm, bn, bk = (first_int(r, cfg) for r in ("block_m", "block_n", "block_k"))
        if not (isinstance(stages, int) and stages > 1 and bm and bn and bk):
            continue
        per_stage = (bm + bn) * bk * elem_bytes
        fixed = (required - stages * per_stage) * fixed_scale
        top = stages if fixed_scale < 1.0 else stages - 1
        fits = [n for n in range(top, 0, -1) if fixed + n * per_stage <= limit]
        if not fits:
            continue
        if fits[0] == stages:
            new = source
        else:
            try:
                new = apply_config(source, kernel, {"num_stages": fits[0]})
            except (NotApplicable, LookupError):
                continue
        return new, {"kernel": kernel, "num_stages": fits[0], "was": stages,
                     "estimate": int(fixed + fits[0] * per_stage), "limit": limit}
    return None
