"""Stage 7, device_tuning: the rows-per-program tactic (row batching of tiny per-row programs).

Owns: the ``rows-per-program`` tactic. A kernel that starts one program per row vector (rotary embedding: one
program per (b, s, h) of 64 elements; a norm or softmax over short rows, its reductions on axis 1) gets ROWS rows
per program as a [ROWS, BLOCK] block with :mod:`xeforge.rewrite.device_tuning.rows`. ROWS values are powers of two
that put :data:`ELEMENTS` elements in a program, given the widest ``tl.arange`` at the timing variant (capped by the
row count there; a kernel that reduces its rows up to the largest of them only, so a row that fills a program
alone is not batched); on a GPU each comes with ``num_warps`` 4 and 8 for the verifier to time, on the
interpreter only the default. Listed after the launch-parameter search, so a flat kernel's block size is tuned
first and ROWS is sized from it.
"""

from __future__ import annotations

from typing import Any

from stages.base import Applicability, Candidate, StageContext, Tactic
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning import rows
from xeforge.rewrite.memory import launch_facts
from xeforge.rewrite.tiling.configs import kb_errors
from xeforge.rewrite.tiling.grid import single_launch
from xeforge.rewrite.tiling.tactics import RewriteMemo

#: elements per program that the ROWS values aim at (ROWS * BLOCK); the second is the default
ELEMENTS = (1024, 2048, 4096, 8192)
#: ROWS values when the row length cannot be read from forward
FALLBACK_ROWS = (8, 16, 32)
WARPS = (4, 8)


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def row_shape(ctx: StageContext, plan: rows.RowsPlan) -> tuple[int | None, int | None, str]:
    """(widest arange, rows) at the device's timing variant, None where forward cannot be followed. On the
    interpreter, which times nothing, at the primary GPU shape: the rows a GPU would batch (ci may be one row)."""
    try:
        variant = ctx.problem.timing_variant("xpu" if ctx.device.kind == "cpu" else ctx.device.kind)
        model = ctx.model
        site = single_launch(model, plan.kernel)
        bound = launch_facts(model, site, ctx.problem, variant)
    except Exception:  # a spec or forward neither the trace nor the static evaluation can follow: sized without it
        return None, None, "?"
    if bound is None:
        return None, None, variant.name
    values, sizes = bound
    blocks = []
    for b in plan.blocks:
        v = int(b) if b.isdigit() else values.get(b)
        v = v if _pow2(v) else site.constexprs.get(b)
        blocks.append(v)
    fn = model.functions[plan.kernel]
    for i, (b, v) in enumerate(zip(plan.blocks, blocks)):  # a block the autotuner sets: its widest config's
        tuned = [c[b] for c in fn.autotune_configs if _pow2(c.get(b))]
        if not _pow2(v) and tuned:
            blocks[i] = max(tuned)
    block = max(blocks) if blocks and all(_pow2(b) for b in blocks) else None
    n_rows = sizes[0] if len(sizes) == 1 else None
    return block, n_rows, variant.name


def row_values(block: int | None, n_rows: int | None) -> list[int]:
    """ROWS candidates, the default first."""
    if block:
        values = [max(2, e // block) for e in ELEMENTS]
    else:
        values = list(FALLBACK_ROWS)
    if n_rows:
        cap = 1 << max(0, (n_rows - 1).bit_length())
        values = [min(v, cap) for v in values]
    values = [v for v in dict.fromkeys(values) if v >= 2]
    if len(values) > 1:
        values.insert(0, values.pop(1))
    return values


class RowsPerProgram(Tactic):
    name = "rows-per-program"
    summary = "ROWS rows per program as a [ROWS, BLOCK] block for kernels that start one tiny program per row"

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def _rewrite(self, ctx: StageContext):
        return self._memo.get(ctx, self._build)

    def _build(self, ctx: StageContext) -> tuple[rows.RowsPlan, list[tuple[int, int | None, str]], str]:
        plan = rows.plan(ctx.source)
        block, n_rows, variant = row_shape(ctx, plan)
        values = row_values(block, n_rows)
        if plan.reductions and block:  # a whole row already a program's worth: more rows would only spill
            values = [v for v in values if v * block <= ELEMENTS[-1]]
            if not values:
                raise NotApplicable(f"{plan.kernel}: its rows of [{block}] at {variant} fill a program already "
                                    f"(batching a row reduction stops at {ELEMENTS[-1]} elements a program)")
        if not values:
            raise NotApplicable(f"{plan.kernel}: {n_rows} row(s) at {variant}: nothing to batch")
        site = single_launch(ctx.model, plan.kernel)
        current = site.options.get("num_warps")
        autotuned = ctx.model.functions[plan.kernel].is_autotuned  # its configs set num_warps
        warps = WARPS if getattr(ctx.device, "can_time", False) and not autotuned else (current,)
        configs = [(r, w) for r in values for w in dict.fromkeys(warps)]
        budget = ctx.settings.tuning_budget if getattr(ctx.device, "can_time", False) else 1
        out, bad = [], []
        for r, w in configs[:budget]:
            src = rows.apply_rows(ctx.source, plan, r, w)
            errors = kb_errors(ctx, src)
            if errors:
                bad.append(f"ROWS={r}: {'; '.join(errors)}")
            else:
                out.append((r, w, src))
        if not out:
            raise NotApplicable(f"the batched kernel breaks KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        sized = ", ".join([f"[{block}] vectors" if block else "row length not read from forward",
                           f"{n_rows} rows" if n_rows else "row count not read from forward"]) + f" at {variant}"
        return plan, out, sized

    def check(self, ctx: StageContext) -> Applicability:
        try:
            plan, out, sized = self._rewrite(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        values = ", ".join(str(v) for v in dict.fromkeys(r for r, _, _ in out))
        return Applicability(True, f"{plan.describe()}; ROWS {values} ({sized})")

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            plan, out, _ = self._rewrite(ctx)
        except NotApplicable:
            return []
        param = plan.names[0]
        cands = []
        for i, (r, w, src) in enumerate(out):
            warps = f", num_warps={w}" if w else ""
            cands.append(Candidate(src, self.name, f"{plan.kernel}: {param}={r} rows per program{warps}",
                                   kind="rewrite" if i == 0 else "search",
                                   params={"kernel": plan.kernel, param: r, **({"num_warps": w} if w else {})}))
        return cands
