"""Stage 7, device_tuning: the wave-tail tactic (a partial last wave of output tiles run in smaller tiles).

Owns the ``wave-tail`` tactic. Where a GEMM launch's output tiles at some timed shape fill the device's cores a whole
number of times and then only part of once more (gemm_square at 3000 x 4096 x 3000 in 128 x 256 tiles on an H100:
288 tiles, 2.2 waves of 132, timed in the time of 3), the launch is split per call by
:func:`xeforge.rewrite.device_tuning.wave_tail.wave_tail`: whole waves of the kernel's tiles on the first rows, the
rows left over at half the tile's rows and columns (and at most 4 warps), each launch the kernel as written on a
row slice. What it reads:

- the launch: the one that runs at the timed shape with the partial wave (a per-shape dispatch's branch, too);
- the rows: the problem's row dim (:func:`xeforge.shape_classes.rows_dim`), the launch's argument that carries it
  (its host name), and the block size that tiles it;
- the row tensors: the launch's tensor arguments whose first dim is the rows at every traced shape (the trace's
  shapes), each passed as a plain name;
- the decision at each timed shape, with the helper the file will run (:func:`~xeforge.rewrite.device_tuning.
  wave_tail.rows_at`): the tactic applies where it splits at one timed shape or more.

The candidate asks gate 3 to time every shape (``Candidate.time_all_shapes``): where the split is not taken the
launch runs as written. On the interpreter it does not apply: there is nothing to time.
"""

from __future__ import annotations

import ast
import math
from typing import Any

from stages.base import Applicability, Candidate, StageContext, Tactic
from stages.device_tuning_shapes import block_on, shape_arguments
from stages.device_tuning_splitk import core_count
from xeforge.analysis.observe import traces
from xeforge.kernel_model import LaunchSite
from xeforge.rewrite.device_tuning import wave_tail as wt
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import current_config, describe, kb_rejects
from xeforge.rewrite.tiling.grid import gemm_kernels, launch_bindings, launch_grid
from xeforge.rewrite.tiling.tactics import RewriteMemo
from xeforge.shape_classes import rows_dim

#: the fewest rows a tail tile keeps
MIN_TAIL_ROWS = 16


class WaveTail(Tactic):
    name = "wave-tail"
    summary = ("a GEMM launch whose output tiles leave a last wave far from full runs whole waves of its tiles, then "
               "the rows left over in smaller tiles over every core (decided per call)")

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, why = self._memo.get(ctx, self._build)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, why)

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            (src, params), why = self._memo.get(ctx, self._build)
        except NotApplicable:
            return []
        return [Candidate(src, self.name, why, kind="search", params=params, time_all_shapes=True)]

    # ------------------------------------------------------------------------------------------------ planning
    def _build(self, ctx: StageContext) -> tuple[tuple[str, dict[str, Any]], str]:
        if not getattr(ctx.device, "can_time", False):
            raise NotApplicable("nothing to time on the interpreter (the split is for a partial last wave of tiles on "
                                "a GPU's cores)")
        cores, where = core_count(ctx)
        if cores is None:
            raise NotApplicable("the device's core count is unknown (name a knowledge-base device with --target)")
        rows = rows_dim(ctx.problem.spec)
        if rows is None:
            raise NotApplicable("the problem's first input is not a (rows, columns) matrix with a named row dim")
        m = ctx.model
        kernels = gemm_kernels(m)
        if not kernels:
            raise NotApplicable("no launched kernel calls tl.dot")
        kernel = kernels[0]
        traced = {n: t for n, t in traces(ctx.problem, ctx.source).items() if not isinstance(t, str)}
        timed = ctx.problem.timed_variants(ctx.device.kind)
        hits, reasons = [], []
        for v in timed:
            tr = traced.get(v.name)
            la = next((la for la in tr.launches if la.kernel == kernel), None) if tr is not None else None
            if la is None or not isinstance(la.grid, tuple) or la.site is None:
                reasons.append(f"{v.name}: {kernel} was not traced there")
                continue
            site = next((s for s in m.launches if s.kernel == kernel and s.line == la.site.line), None)
            if site is None:
                continue
            try:
                plan = self._plan(ctx, site, rows, cores)
            except NotApplicable as exc:
                reasons.append(f"{v.name}: {exc}")
                continue
            tiles = math.prod(int(g) for g in la.grid)
            n_rows = v.dims.get(rows)
            if not isinstance(n_rows, int) or tiles <= cores:
                reasons.append(f"{v.name}: {tiles} tiles fit one wave of {cores} cores")
                continue
            blocks, small_blocks = -(-n_rows // plan["block"]), -(-n_rows // plan["small_block"])
            small_tiles = small_blocks * (tiles // blocks) * plan["col_ratio"]
            split = wt.rows_at(n_rows, tiles, plan["block"], small_tiles, plan["small_block"], plan["area"], cores)
            if split:
                hits.append((v, site, plan, tiles, split))
            else:
                waves = tiles / cores
                reasons.append(f"{v.name}: {tiles} tiles are {waves:.2f} waves of {cores} cores, where a split would "
                               f"not save {wt.MIN_SAVING} of a wave and {wt.MIN_SHARE:.0%} of them")
        if not hits:
            raise NotApplicable(f"no timed shape leaves a last wave a split would fill ({'; '.join(reasons)})")
        sites = {h[1].line for h in hits}
        if len(sites) > 1:
            raise NotApplicable(f"the shapes with a partial last wave run {kernel} from {len(sites)} launches")
        v, site, plan, tiles, split = hits[0]
        src = wt.wave_tail(ctx.source, kernel, site.line, plan["expr"], plan["tensors"], plan["block"],
                           plan["small"], plan["small_block"], plan["area"], cores)
        at = ", ".join(f"{h[0].name} ({h[3]} tiles: {h[4]} rows in whole waves)" for h in hits)
        why = (f"{kernel} at line {site.line}: whole waves of {plan['block']}-row tiles, then the rows left in "
               f"{describe(plan['small'])} tiles over all {cores} cores ({where}), decided per call; splits at {at}; "
               f"row slices of {', '.join(plan['tensors'])}")
        return (src, {"kernel": kernel, **plan["small"]}), why

    def _plan(self, ctx: StageContext, site: LaunchSite, rows: str, cores: int) -> dict[str, Any]:
        m = ctx.model
        args, why = shape_arguments(ctx, site)
        if rows not in args:
            raise NotApplicable(f"no argument of {site.kernel} (line {site.line}) carries the rows {rows}"
                                + (f" ({why})" if why else ""))
        param, expr = args[rows]
        if not expr.isidentifier():
            raise NotApplicable(f"the rows are passed as {expr!r} (line {site.line}), not a name")
        block_m = block_on(m, site, expr, param)
        if block_m is None:
            raise NotApplicable(f"no block size of {site.kernel} tiles {rows}")
        # the columns' block: the block of a dim the grid counts tiles over (not the K loop's step)
        grid = launch_grid(m, site)
        in_grid = {n.id for el in (grid.elements if grid is not None else []) for n in ast.walk(el)
                   if isinstance(n, ast.Name)}
        cols = [d for d in args if d != rows and args[d][1] in in_grid]
        block_n = next((b for d in cols if (b := block_on(m, site, args[d][1], args[d][0])) not in (None, block_m)),
                       None)
        cur = current_config(m, site)
        bm, bn = cur.get(block_m), cur.get(block_n) if block_n else None
        if not isinstance(bm, int) or bm // 2 < MIN_TAIL_ROWS:
            raise NotApplicable(f"{block_m}={bm}: no smaller tile of at least {MIN_TAIL_ROWS} rows for the tail")
        small = {block_m: bm // 2}
        if isinstance(bn, int) and bn // 2 >= 16:
            small[block_n] = bn // 2
        if isinstance(cur.get("num_warps"), int) and cur["num_warps"] > 4:
            small["num_warps"] = 4
        if kb_rejects(ctx, {**cur, **small}, m.functions[site.kernel]):
            raise NotApplicable(f"the knowledge base refuses the tail's tile {describe(small)}")
        return {"expr": expr, "block": bm, "small": small, "small_block": bm // 2,
                "area": wt.area_of(cur, {**cur, **small}, block_m, block_n if block_n in small else None),
                "col_ratio": 2 if block_n in small else 1,
                "tensors": self._row_tensors(ctx, site, rows)}

    @staticmethod
    def _row_tensors(ctx: StageContext, site: LaunchSite, rows: str) -> list[str]:
        """The launch's tensor arguments whose first dim is the rows at every traced shape, as plain host names."""
        m = ctx.model
        bind = launch_bindings(site, m.functions[site.kernel], m.source)
        seen: dict[str, bool] = {}
        for name, tr in traces(ctx.problem, ctx.source).items():
            if isinstance(tr, str):
                continue
            variant = ctx.problem.spec.variants.get(name)
            n_rows = variant.dims.get(rows) if variant is not None else None
            la = next((la for la in tr.launches if la.kernel == site.kernel and la.site is not None
                       and la.site.line == site.line), None)
            if la is None or not isinstance(n_rows, int):
                continue
            for p, arg in la.args.items():
                if arg.kind == "descriptor" and arg.shape and arg.shape[0] == n_rows:
                    raise NotApplicable(f"{p} is a tensor descriptor over the rows (line {site.line}): it cannot be "
                                        "passed as a row slice")
                if arg.kind == "tensor":
                    seen[p] = seen.get(p, True) and bool(arg.shape) and arg.shape[0] == n_rows
        params = [p for p, ok in seen.items() if ok]
        if not params:
            raise NotApplicable(f"no tensor argument of {site.kernel} has the rows {rows} as its first dim")
        out = []
        for p in params:
            host = (bind.get(p) or "").strip()
            if not host.isidentifier():
                raise NotApplicable(f"{p} is passed as {host!r} (line {site.line}): a row slice needs a plain name")
            out.append(host)
        return out
