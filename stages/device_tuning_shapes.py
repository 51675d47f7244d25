"""Stage 7, device_tuning: the per-shape-config tactic (another launch configuration for another class of shapes).

Owns: the ``per-shape-config`` tactic (KB ``tune-per-shape-dispatch``) and the shape classes it dispatches on. The
launch-parameter search picks one configuration at the primary timed shape; a problem timed at several shapes
(``bench-gpu``, ``bench-gpu-1``, ...) may run another one faster at a decode-like shape. For each other timed shape
whose shape argument differs from the primary's by :data:`CLASS_RATIO` or more:

1. the **shape class**: the launch's scalar argument that carries that dim (found in the traces: its value equals the
   dim at every traced variant), or else a plain axis of its grid that does (a batch dim only the grid sees:
   ``grid = (cdiv(N, BLOCK_N), B)``), a test on the host expression the launch passes for it (``M <= 128``), the
   threshold between the classes derived from the timed shapes' values of the dim (the geometric middle between the
   shape and the nearest timed value across, rounded down to a power of two); where no dim differs that much, a
   shape with a dim that is odd there (no multiple of 128, above a decode step's rows: issue 34's odd class) and
   not at the primary gets the class ``N % 128 != 0 and N > 64``, whose first configurations are those whose
   programs fill the last wave of the device's cores better there;
2. **coverage**: the correctness gate's own shapes (:meth:`xeforge.problem.Problem.correctness_variants`: every
   variant and the ragged shapes) must put at least one shape in the branch and one in the rest, or the class is
   not proposed, and the tactic says why: every configuration is verified at shapes it serves;
3. **configurations**: the incumbent's and the launch search's verified trials (this run's trial store, fastest
   first) and the KB's seeds for the device, each also with its tile along the dim fitted to the class's size, each
   passing ``kb.check_config`` like the search's; at most :data:`CONFIGS_PER_CLASS` per class;
4. **the candidate**: :func:`xeforge.rewrite.tiling.dispatch.dispatch` at the launch site, wherever it is —
   ``if M <= 128: kernel[grid_a](..., BLOCK_M=16, ...) else: kernel[grid](...)`` — the incumbent's launch unchanged
   in the ``else`` branch, so it is the incumbent at the primary shape by construction; it asks gate 3 to time every
   shape (``Candidate.time_all_shapes``), where the weighted objective must improve beyond the noise and no shape
   may be slower than its own margin;
5. **the other way round**: the launch search's fastest verified configurations for every shape but the class's,
   whose branch keeps the incumbent's launch — a tile the search rejected because it was slower at the decode-like
   shape alone (:data:`PRIMARY_WINNERS` per class);
6. **the combination** (:meth:`PerShapeConfig.follow_up`): with winners for two parts of the shapes or more (two
   classes, or a class and the other shapes), one dispatch with every part's winner, judged the same way: a class's
   winner may be a configuration, a swap-AB copy or split-K (on the H100, gemm_relu's M=16 gained 1.65x from
   split-K and its other shapes 1.42-1.47x from the search's 128 x 256 tile; only one of the two could be adopted);
7. **swap-AB for few rows**: for a class of the tile's rows (``M <= 128``), the class's first configurations again
   with its branch launching a swap-AB copy of the kernel (``<kernel>_swapab``, the tile computed transposed:
   :func:`xeforge.rewrite.device_tuning.swap_ab.swapped_branch`), the other shapes keeping the kernel as it is;
8. **split-K for few tiles**: for a class of smaller shapes whose output tiles leave the device's cores idle,
   split-K only in that class (``if M <= 128:`` the split copy of the kernel and its summing or epilogue kernel;
   ``else:`` the incumbent's launch), sized as the split-k tactic sizes it, at the class's first timed shape;
9. **the GEMV form for decode-sized M**: for a class of the tile's rows whose timed shapes have at most
   :data:`~xeforge.rewrite.device_tuning.gemv.GEMV_ROWS` rows, its branch launching a copy of the kernel whose K
   loop multiplies and sums instead of ``tl.dot`` (``<kernel>_gemv``: :mod:`xeforge.rewrite.device_tuning.gemv`),
   one row a program;
10. **a split reduction for few long rows**: for a class of smaller shapes whose programs leave the device's cores
   idle (cross-entropy at 16 tokens over a 128k vocabulary, decode attention at batch 1), where split-K offers
   nothing: its branch launches ``<kernel>_split``, SPLIT programs per program over slices of the kernel's
   reduction loop, and ``<kernel>_combine``, which combines their max, sums and rescaled sums and runs the rest
   (:mod:`xeforge.rewrite.device_tuning.splitred`);
11. **rows that share loads**, proposed before the class's configurations: for a class of more rows than the primary
   shape's along a grid axis of one program a row (a GEMV at B = 8 against B = 1), its branch launches
   ``<kernel>_dotrows``, 16 rows a program with the GEMV's sum as ``tl.dot`` on the matrix unit
   (:mod:`xeforge.rewrite.device_tuning.rows_dot`), then ``<kernel>_rows<R>``, R rows a program, each row's work
   written out and what does not depend on the row (the weight's tile) loaded once
   (:mod:`xeforge.rewrite.device_tuning.shared_rows`).

Each class's candidates come in the order above, and the classes take turns (each one's first before any one's
second), so that a time budget that judges only the first few still reaches every class.

Where it does not apply, it says why: on the interpreter (nothing to rank), with one timed shape, at an
``@triton.autotune``'d kernel (its key already picks a configuration per shape), at a kernel launched from several
places, or where no shape argument or grid axis separates the timed shapes.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from stages.base import Applicability, Candidate, StageContext, Tactic, TrialOutcome
from stages.device_tuning_splitk import core_count, split_values
from xeforge.analysis.observe import traces
from xeforge.kb.kernel_facts import roles_by_use
from xeforge.kb.roles import names_for
from xeforge.kernel_model import KernelModel, LaunchSite, axis_blocks, parse_kernel, parse_python, pure_expression
from xeforge.problem import Variant, source_hash
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import (OPTION_KEYS, apply_config, current_config, describe, kb_configs,
                                            kb_errors, kb_rejects, measured_configs, no_change, option_keys,
                                            traced_options, tunable)
from xeforge.rewrite.device_tuning import gemv, rows_dot, shared_rows, splitk, splitred
from xeforge.rewrite.device_tuning.swap_ab import swap_ab, swapped_branch
from xeforge.rewrite.tiling.dispatch import Branch, dispatch, launch_statement
from xeforge.rewrite.persistent import launched_programs
from xeforge.rewrite.tiling.host_rule import heuristic_made
from xeforge.rewrite.tiling.grid import _cdiv_args, launch_bindings, launch_grid, single_launch
from xeforge.shape_classes import DECODE_ROWS, TILE_MULTIPLE

#: a timed shape is a class of its own when one shape argument differs from the primary's by this factor or more
CLASS_RATIO = 4
#: candidates per shape class (each one is timed at every shape)
CONFIGS_PER_CLASS = 4
#: of those, how many also go to the class's branch as a swap-AB copy of the kernel
SWAPPED_PER_CLASS = 2
#: GEMV-form configurations tried for a class of decode-sized M
GEMV_PER_CLASS = 3
#: configurations of the rows-on-the-matrix-unit copy tried for a class of more rows
DOT_ROWS_CONFIGS = 2
#: SPLIT_K values tried for a class whose output tiles leave cores idle (the split runs only in that class)
SPLIT_PER_CLASS = 2
#: the launch search's verified trials and the KB's seeds considered per class
FROM_SEARCH = 3
FROM_KB = 3
#: the seeds of the device's space for few rows (KB ``max_rows``) considered per class of few rows
FROM_KB_FEW_ROWS = 3
#: the launch search's configurations tried the other way round: for every shape but a class's (which keeps the
#: incumbent's launch)
PRIMARY_WINNERS = 2
#: how much fuller (of one wave of the cores) a configuration's last wave must be at an odd class's shape to be tried
#: first there
FULLER_BY = 0.1
#: the smallest tile a fitted configuration uses along the class's dim (tl.dot's minimum on the GPUs xeforge targets;
#: a smaller seed of the KB, e.g. Intel's 8-row DPAS tile, is taken as the KB gives it)
MIN_FIT = 16
#: the host expressions a test may read: names, attributes, indexing, arithmetic and these tensor methods
PURE_METHODS = {"size", "numel", "dim", "stride"}


@dataclass(frozen=True)
class ShapeClass:
    """The shapes one branch of the dispatch serves: ``expr op threshold`` on the dim ``dim``."""

    dim: str
    param: str  # the kernel parameter that carries the dim
    expr: str  # the host expression the launch passes for it
    op: str  # "<=" (smaller than the primary's), ">", or "%" (no multiple of ``threshold``: an odd size)
    threshold: int
    serves: tuple[str, ...]  # the timed shapes in the class
    block: str | None = None  # the block size that tiles the dim (the grid axis over it), when one does
    size: int = 0  # the dim at the (first) timed shape it serves
    checked: tuple[str, ...] = ()  # the correctness shapes in the class

    @property
    def test(self) -> str:
        if self.op == "%":  # odd, above a decode step's rows (those have a class of their own)
            expr = self.expr if _atom(self.expr) else f"({self.expr})"
            return f"{expr} % {self.threshold} != 0 and {expr} > {DECODE_ROWS}"
        return f"{self.expr} {self.op} {self.threshold}"

    def holds(self, dims: dict[str, Any]) -> bool:
        v = dims.get(self.dim)
        if not isinstance(v, int):
            return False
        if self.op == "%":
            return _odd(v, self.threshold)
        return v <= self.threshold if self.op == "<=" else v > self.threshold


def _odd(v: int, multiple: int = TILE_MULTIPLE) -> bool:
    """A size of issue 34's odd class: no multiple of the tile, above a decode step's rows."""
    return v > DECODE_ROWS and v % multiple != 0


def _atom(expr: str) -> bool:
    """``expr`` reads as one operand (a name, an attribute, a subscript, a call): no parentheses needed around it."""
    try:
        node = parse_python(expr, mode="eval").body
    except SyntaxError:
        return False
    return isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))


@dataclass(frozen=True)
class Proposal:
    """What one candidate of the tactic changes, so its verdict can be combined with another's: ``kind`` "config"
    (the class's branch launches ``config``), "swap" / "split" / "gemv" / "splitred" / "rows" / "dotrows" (the branch
    launches a swap-AB, split-K or GEMV-form copy, a split reduction, or a copy serving several rows a program by
    copies of its statements or through ``tl.dot``; its ``what`` says how) or "else" (``config`` for every shape but
    the class's, whose branch keeps the incumbent's)."""

    cls: ShapeClass
    kind: str
    config: dict[str, Any]
    what: str = ""


@dataclass
class Plan:
    site: LaunchSite
    classes: list[ShapeClass] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why a timed shape got no class of its own


def _floor_pow2(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(x, 1.0)))))


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _pure(expr: str) -> bool:
    """Whether a test may evaluate ``expr`` once more before the launch: names, attributes, indexing, arithmetic and
    :data:`PURE_METHODS` only."""
    try:
        tree = parse_python(expr, mode="eval")
    except SyntaxError:
        return False
    return pure_expression(tree, PURE_METHODS)


def shape_arguments(ctx: StageContext, site: LaunchSite) -> tuple[dict[str, tuple[str, str]], str]:
    """dim -> (kernel parameter, host expression) for the launch's scalar arguments that carry a spec dim (their
    traced value equals the dim at every traced variant), and why some could not be used."""
    m = ctx.model
    fn = m.functions[site.kernel]
    try:
        exprs = launch_bindings(site, fn, m.source)
    except NotApplicable as exc:
        return {}, str(exc)
    seen: dict[str, dict[str, Any]] = {}  # parameter (or "grid axis <n>") -> {variant: value}
    variants = ctx.problem.spec.variants
    for name, tr in traces(ctx.problem, ctx.source).items():
        if isinstance(tr, str):
            continue
        la = next((la for la in tr.launches if la.kernel == site.kernel and
                   (la.site is None or la.site.line == site.line)), None)
        if la is None:
            continue
        for p, arg in la.args.items():
            if arg.kind == "scalar" and isinstance(arg.value, int) and not isinstance(arg.value, bool):
                seen.setdefault(p, {})[name] = arg.value
        if isinstance(la.grid, tuple):  # a dim no argument carries may still size the grid (a batch axis)
            for ax, g in enumerate(la.grid):
                seen.setdefault(f"grid axis {ax}", {})[name] = g
    exprs.update(_grid_exprs(m, site))
    if not seen:
        return {}, f"forward was not traced at the timed shapes, so no argument of {site.kernel} is known to carry a dim"
    out: dict[str, tuple[str, str]] = {}
    impure: list[str] = []
    for dim in sorted({d for v in variants.values() for d, x in v.dims.items() if isinstance(x, int)}):
        for p in [*fn.params, *sorted(k for k in exprs if k.startswith("grid axis "))]:
            vals = seen.get(p)
            if not vals or len(set(vals.values())) < 2:
                continue
            if all(variants[n].dims.get(dim) == v for n, v in vals.items()):
                if not _pure(exprs.get(p, "")):
                    impure.append(f"{dim} is passed as {exprs.get(p)!r} (line {site.line}), which a test would "
                                  "evaluate a second time")
                    continue
                if dim not in out or p == dim:
                    if p.startswith("grid axis ") and dim in out:
                        continue  # an argument that carries the dim is the plainer test
                    out[dim] = (p, exprs[p])
    return out, "; ".join(impure)


def _grid_exprs(model: KernelModel, site: LaunchSite) -> dict[str, str]:
    """``grid axis <n>`` -> the host expression of that axis, for the axes a test can read at the launch: the
    plain ones (``B``, ``x.shape[0]``), not ``cdiv(...)`` (a block size's axis) nor a META grid's own argument."""
    grid = launch_grid(model, site)
    if grid is None:
        return {}
    out = {}
    for ax, el in enumerate(grid.elements):
        if _cdiv_args(el) is not None:
            continue
        if grid.meta and any(isinstance(n, ast.Name) and n.id == grid.meta for n in ast.walk(el)):
            continue
        out[f"grid axis {ax}"] = (ast.get_source_segment(model.source, el) or ast.unparse(el)).strip()
    return out


def _block_on(model: KernelModel, site: LaunchSite, expr: str, param: str | None = None) -> str | None:
    """The tunable block size that tiles the grid axis ``cdiv(<expr>, BLOCK)``, if one does; else the one the kernel
    tiles its parameter ``param`` by itself (a persistent kernel's ``tiles_m = tl.cdiv(M, BLOCK_M)``)."""
    grid = launch_grid(model, site)
    names = tunable(model, site)
    if grid is not None:
        axes = axis_blocks(model.functions[site.kernel])
        for ax, el in enumerate(grid.elements):
            cd = _cdiv_args(el)
            if cd is None:
                continue
            if (ast.get_source_segment(model.source, cd[0]) or ast.unparse(cd[0])).strip() == expr.strip():
                return next((n for n in axes.get(ax, []) if n in names), None)
    if param is None:
        return None
    for node in ast.walk(model.functions[site.kernel].node):
        cd = _cdiv_args(node)
        if cd is not None and isinstance(cd[0], ast.Name) and cd[0].id == param and isinstance(cd[1], ast.Name) \
                and cd[1].id in names:
            return cd[1].id
    return None


def _odd_dim(ratios: list[tuple], timed: list[Variant]) -> tuple | None:
    """Of a timed shape's dims carried by an argument (``ratios``' rows: ratio, dim, param, expr, its value, the
    primary's), the one that is odd there (no multiple of :data:`TILE_MULTIPLE`, issue 34's odd class: 3000, 1000,
    a vocabulary of 32003; above a decode step's rows) and not at the primary, where the fewest other timed shapes
    are odd too; None where there is none. Such a shape ends its tiles part-filled and its rows off the line the
    aligned ones start on: on an H100 (2026-12-07) gemm_square's persistent loop ran 1.05x at 4096^3 and 0.93x at
    3000 x 4096 x 3000, one class for the tactics until then."""
    found = [r for r in ratios if _odd(r[4]) and not _odd(r[5])]
    if not found:
        return None
    return min(found, key=lambda r: sum(isinstance(t.dims.get(r[1]), int) and _odd(t.dims[r[1]]) for t in timed))


def _classes(ctx: StageContext, site: LaunchSite, args: dict[str, tuple[str, str]], timed: list[Variant],
             shapes: list[Variant]) -> tuple[list[ShapeClass], list[str]]:
    primary = timed[0]
    out: list[ShapeClass] = []
    skipped: list[str] = []
    for v in timed[1:]:
        ratios = []
        for dim, (param, expr) in sorted(args.items()):
            a, b = v.dims.get(dim), primary.dims.get(dim)
            if isinstance(a, int) and isinstance(b, int) and a > 0 and b > 0:
                ratios.append((max(a, b) / min(a, b), dim, param, expr, a, b))
        big = [r for r in ratios if r[0] >= CLASS_RATIO]
        odd = _odd_dim(ratios, timed)
        if not big and odd is None:
            seen = ", ".join(f"{d} {a} vs {b}" for _, d, _, _, a, b in ratios) or "no dim carried by an argument"
            skipped.append(f"{v.name}: no shape argument or grid axis of {site.kernel} (line {site.line}) differs from "
                           f"{primary.name}'s by {CLASS_RATIO}x or more, or is odd (no multiple of {TILE_MULTIPLE}) "
                           f"where the primary's is not ({seen})")
            continue
        if big:
            _, dim, param, expr, a, b = max(big, key=lambda r: r[0])
            values = sorted({t.dims[dim] for t in timed if isinstance(t.dims.get(dim), int)})
            if a < b:
                across = min(x for x in values if x > a)
                op, threshold = "<=", max(_floor_pow2(math.sqrt(a * across)), a)
            else:
                across = max(x for x in values if x < a)
                op, threshold = ">", max(_floor_pow2(math.sqrt(a * across)), across)
        else:
            _, dim, param, expr, a, b = odd
            op, threshold = "%", TILE_MULTIPLE
        cls = ShapeClass(dim, param, expr, op, threshold, (), _block_on(ctx.model, site, expr, param), a)
        cls = replace(cls, serves=tuple(t.name for t in timed[1:] if cls.holds(t.dims)))
        if any(c.test == cls.test for c in out):
            continue
        checked = tuple(s.name for s in shapes if cls.holds(s.dims))
        rest = [s.name for s in shapes if not cls.holds(s.dims)]
        if not checked or not rest:
            where = ", ".join(f"{s.name} ({dim}={s.dims.get(dim)})" for s in shapes)
            side = f"into {cls.test}" if not checked else f"outside {cls.test}"
            skipped.append(f"{v.name}: no correctness shape falls {side} (the correctness gate runs {where}), so "
                           "that branch's configuration would go unverified")
            continue
        out.append(replace(cls, checked=checked))
    return out, skipped


def shape_classes(ctx: StageContext, site: LaunchSite) -> tuple[list[ShapeClass], list[str]]:
    """The classes of the timed shapes other than the primary at ``site`` (a test on a shape argument the launch
    passes, each reached by a correctness shape on both sides) and why a timed shape got none; NotApplicable where
    no class forms. Also read by the block_io stage, to keep a rewrite off the class of shapes it lost at."""
    timed = ctx.problem.timed_variants(ctx.device.kind)
    args, why = shape_arguments(ctx, site)
    if not args:
        raise NotApplicable(f"no scalar argument of {site.kernel} (line {site.line}) carries a spec dim"
                            + (f" ({why})" if why else ""))
    shapes = ctx.problem.correctness_variants(ctx.device.kind, getattr(ctx.settings, "ragged_shapes", True))
    classes, skipped = _classes(ctx, site, args, timed, shapes)
    if not classes:
        raise NotApplicable("; ".join(skipped) or "no timed shape forms a class of its own")
    return classes, skipped


def _lost_classes(ctx: StageContext, outcome: TrialOutcome, classes_of: dict[str, list[ShapeClass]]
                 ) -> tuple[str, list[ShapeClass], float] | None:
    """(kernel, the classes of the shapes it lost at, its objective) for a candidate gate 3 turned down for a loss at
    some timed shapes while faster at others, where each shape it lost at has a class of its own at the kernel's
    launch and no such class holds a shape it won at; None otherwise (it lost at the primary, or nowhere, or
    passed). A stage that rewrote the kernel then offers it again with its rewrite off in those classes (block_io's
    descriptors, the persistent loop). ``classes_of`` caches the classes per kernel across outcomes."""
    perf = next((g for g in getattr(outcome.verdict, "gates", []) if g.gate == "3-performance"), None)
    d = perf.details if perf is not None and perf.status == "fail" else {}
    kernel = outcome.candidate.params.get("kernel")
    if not d.get("blocked_by") or not d.get("improved") or not kernel:
        return None
    lost = [s["variant"] for s in d.get("shapes", []) if s["speedup"] < 1.0]
    if kernel not in classes_of:
        try:
            classes_of[kernel] = shape_classes(ctx, single_launch(ctx.model, kernel))[0]
        except NotApplicable:
            classes_of[kernel] = []
    off = [c for c in classes_of[kernel] if any(v in c.serves for v in lost)]
    if not off or any(not any(v in c.serves for c in off) for v in lost) or \
            any(v in c.serves for c in off for v in d["improved"]):
        return None
    return kernel, off, d.get("objective", 0.0)


def off_where_lost(ctx: StageContext, outcomes: list[TrialOutcome], off_where: Callable[[str, str, list[str]], str],
                   tactic: str, how: str) -> list[Candidate]:
    """A stage's follow-up for a rewrite that lost at a class of shapes only: of ``outcomes``, the one with the best
    objective that :func:`_lost_classes` gives classes for, again with ``off_where(source, kernel, tests)`` turning
    the rewrite off in them, timed at every shape; [] where none. ``how`` says what the candidate keeps there."""
    best: tuple[float, Candidate] | None = None
    classes_of: dict[str, list[ShapeClass]] = {}
    for o in outcomes:
        lost = _lost_classes(ctx, o, classes_of)
        if lost is None:
            continue
        kernel, off, objective = lost
        try:
            src = off_where(o.candidate.source, kernel, [c.test for c in off])
        except NotApplicable:
            continue
        kept = "; ".join(f"{c.test} ({', '.join(c.serves)})" for c in off)
        cand = Candidate(src, tactic, f"{o.candidate.description}; {how}: {kept}",
                         params={**o.candidate.params, "off_where": [c.test for c in off]}, time_all_shapes=True)
        if best is None or objective > best[0]:
            best = (objective, cand)
    return [best[1]] if best is not None else []


def _idle_cores_class(ctx: StageContext, cls: ShapeClass) -> tuple[int, str, Variant] | None:
    """(cores, where the count came from, the class's first timed shape) for a class of smaller shapes (``<=``),
    where a split (of K, of a reduction loop) is sized; None for a class of larger ones or without a core count."""
    if cls.op != "<=":
        return None
    cores, where = core_count(ctx)
    variant = next((v for v in ctx.problem.timed_variants(ctx.device.kind) if v.name in cls.serves), None)
    return None if cores is None or variant is None else (cores, where, variant)


def chain_coverage(classes: list[ShapeClass], shapes: list[Variant]) -> str | None:
    """Why a dispatch over ``classes`` in this order (the first test that holds wins, the rest to ``else``) would
    leave a branch no correctness shape reaches; None when every branch is reached."""
    reached = {c.test: [] for c in classes}
    rest = []
    for s in shapes:
        hit = next((c for c in classes if c.holds(s.dims)), None)
        (reached[hit.test] if hit is not None else rest).append(s.name)
    empty = [t for t, names in reached.items() if not names] + (["else"] if not rest else [])
    return f"no correctness shape reaches the branch(es) {', '.join(empty)}" if empty else None


class PerShapeConfig(Tactic):
    name = "per-shape-config"
    summary = ("another launch configuration for another class of timed shapes (a decode-like M): a small dispatch on "
               "the shape arguments at the launch, the incumbent's launch kept for the primary shape (or for the "
               "class, with the search's configuration for the rest)")

    def __init__(self, target: Callable[[KernelModel], LaunchSite | None]) -> None:
        self._target = target  # the launch-parameter search's choice of launch (stages.device_tuning.target_site)
        self._proposed: dict[str, Proposal] = {}  # candidate source hash -> what it changes

    # -------------------------------------------------------------------------------------------------- planning
    def plan(self, ctx: StageContext) -> Plan:
        """The shape classes to dispatch on, or NotApplicable with the reason."""
        if not getattr(ctx.device, "can_time", False):
            raise NotApplicable("nothing to rank on the interpreter (a per-shape configuration is chosen by timing "
                                "every timed shape; the CPU interpreter times nothing)")
        kind = ctx.device.kind
        timed = ctx.problem.timed_variants(kind)
        if len(timed) < 2:
            raise NotApplicable(f"one timed shape ({timed[0].name}): nothing to dispatch on (a spec with bench-gpu-1, "
                                "... gives other shapes)")
        m = ctx.model
        site = self._target(m)
        if site is None:
            raise NotApplicable("no launch with block sizes to tune (see launch-params)")
        fn = m.functions[site.kernel]
        if fn.is_autotuned:
            key = ", ".join(fn.autotune_key) or "its key"
            raise NotApplicable(f"{site.kernel} (line {fn.line}) is @triton.autotune'd: its key ({key}) already picks "
                                "a configuration per shape")
        sites = [s.line for s in m.launches if s.kernel == site.kernel]
        if len(sites) > 1:
            raise NotApplicable(f"{site.kernel} is launched from {len(sites)} places (lines "
                                f"{', '.join(map(str, sites))}): a dispatch splits one launch")
        launch_statement(m, site)
        if not set(tunable(m, site)) - set(heuristic_made(m, site)) and not self._option_configs(ctx, site):
            raise NotApplicable(f"{site.kernel} at line {site.line} has no block size a configuration may change "
                                "(none its @triton.heuristics sets: Triton sets those over the launch's), and no "
                                "launch option (num_warps, num_stages) the search or the KB would set another way")
        classes, skipped = shape_classes(ctx, site)
        return Plan(site, classes, skipped)

    def check(self, ctx: StageContext) -> Applicability:
        try:
            plan = self.plan(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        parts = [f"{c.test} for {', '.join(c.serves)} ({c.dim}={c.size}; verified at {', '.join(c.checked)})"
                 for c in plan.classes]
        left = f"; left out: {'; '.join(plan.skipped)}" if plan.skipped else ""
        return Applicability(True, f"{plan.site.kernel} at line {plan.site.line}: {'; '.join(parts)}; else the "
                                   f"incumbent's configuration{left}")

    # -------------------------------------------------------------------------------------------------- configs
    def configs(self, ctx: StageContext, site: LaunchSite, cls: ShapeClass) -> list[dict[str, Any]]:
        """Up to :data:`CONFIGS_PER_CLASS` KB-valid configurations for ``cls``, each different from the incumbent's:
        for a class of few rows the seeds of the device's space for such shapes first (three epilogue-graph ports on
        an H100, 2026-12-06, at 16 x 4096 x 4096: 1.8-2.5x over the incumbent there, where its tile cut to 16 rows
        gave 0.95-1.13x), then the incumbent's, the search's verified trials and the KB's seeds, each fitted to the
        class first."""
        m = ctx.model
        fn = m.functions[site.kernel]
        # what the kernel's @triton.heuristics makes, Triton sets over a branch's launch: the branches leave it
        heur = heuristic_made(m, site)
        names = [n for n in tunable(m, site) if n not in heur]
        current = {k: v for k, v in current_config(m, site).items() if k not in heur}
        measured = measured_configs(ctx.run_dir, site.kernel, FROM_SEARCH, tactics=("launch-params",))
        seeds = kb_configs(ctx, ctx.source, site.kernel, FROM_KB)
        out: list[dict[str, Any]] = []
        keys = tuple(k for k in option_keys(fn) if k not in heur)
        there = {**traced_options(m, site, cls.serves[0]), **current}  # what the class's shape runs with now
        fuller = self._fuller_waves(ctx, site, cls, current, [*measured, *seeds], names)
        for cfg in [*self._few_rows(ctx, site, cls), *fuller, current, *measured, *seeds]:
            full = {**current, **{k: v for k, v in cfg.items() if k in names or k in keys}}
            for option in (self._fit(full, cls), full):
                if option in out or no_change(there, option) or kb_rejects(ctx, option, fn):
                    continue
                out.append(option)
            if len(out) >= CONFIGS_PER_CLASS:
                break
        return out[:CONFIGS_PER_CLASS]

    @staticmethod
    def _fuller_waves(ctx: StageContext, site: LaunchSite, cls: ShapeClass, current: dict[str, Any],
                      pool: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
        """For a class of odd sizes (``%``): of the search's trials, the KB's seeds and the incumbent's tile with one
        block halved, those whose programs at the class's first timed shape fill their last wave of the device's
        cores better than the incumbent's (by :data:`FULLER_BY` of a wave or more), fullest first. gemm_square's
        128 x 256 tiles at 3000 x 4096 x 3000 are 288 programs, 2.2 waves of an H100's 132 cores; 128 x 128 tiles are
        576, 4.4 waves. Each is counted from its own launch (traced at that shape); [] for other classes, without
        a core count, or where the launch's programs cannot be counted."""
        cores, _ = core_count(ctx)
        variant = next((v for v in ctx.problem.timed_variants(ctx.device.kind) if v.name in cls.serves), None)
        if cls.op != "%" or cores is None or variant is None:
            return []

        def fill(cfg: dict[str, Any]) -> float | None:
            try:
                src = apply_config(ctx.source, site.kernel, cfg) if cfg != current else ctx.source
                n = launched_programs(parse_kernel(src), site.kernel, ctx.problem, variant)
            except (NotApplicable, SyntaxError):
                return None
            return None if not n or n <= cores else n / (cores * -(-n // cores))

        base = fill(current)
        if base is None:
            return []
        roles = roles_by_use(ctx.model.functions[site.kernel])
        tiles = [*names_for("block_m", names, roles), *names_for("block_n", names, roles)]
        halved = [{**current, k: current[k] // 2} for k in tiles
                  if isinstance(current.get(k), int) and not isinstance(current[k], bool) and current[k] >= 2 * MIN_FIT]
        scored = []
        for cfg in [*halved, *pool]:
            full = {**current, **{k: v for k, v in cfg.items() if k in current}}
            if full == current or any(full == c for _, _, c in scored):
                continue
            f = fill(full)
            if f is not None and f >= base + FULLER_BY:
                scored.append((-f, len(scored), full))
        return [c for _, _, c in sorted(scored, key=lambda t: (t[0], t[1]))]

    @staticmethod
    def _few_rows(ctx: StageContext, site: LaunchSite, cls: ShapeClass) -> list[dict[str, Any]]:
        """For a class of few rows tiled by the kernel's M block (``M <= 64`` over ``BLOCK_M``): the seeds of the
        device's space for such shapes (KB ``max_rows``: narrow tiles along N, a long K step and deeper pipelines,
        so that a weight-bound GEMM keeps every core streaming), before the large-M tiles fitted to the class."""
        fn = ctx.model.functions[site.kernel]
        if cls.op != "<=" or cls.block is None or not names_for("block_m", [cls.block], roles_by_use(fn)):
            return []
        return kb_configs(ctx, ctx.source, site.kernel, FROM_KB_FEW_ROWS, rows=cls.size)

    @staticmethod
    def _option_configs(ctx: StageContext, site: LaunchSite) -> list[dict[str, Any]]:
        """Launch options other than the incumbent's, for a launch whose block sizes the host makes per shape
        (``BLOCK = next_power_of_2(N)``, one row a program): the launch search's verified trials and the KB's
        seeds, options only. A decode-sized class may want other warps than the heuristic gives every shape."""
        current = {**traced_options(ctx.model, site), **current_config(ctx.model, site)}
        heur = heuristic_made(ctx.model, site)  # set by Triton over the launch's: not a branch's to change
        keys = tuple(k for k in option_keys(ctx.model.functions[site.kernel]) if k not in heur)
        out = []
        for cfg in [*measured_configs(ctx.run_dir, site.kernel, FROM_SEARCH, tactics=("launch-params",)),
                    *kb_configs(ctx, ctx.source, site.kernel, FROM_KB)]:
            opts = {k: v for k, v in cfg.items() if k in keys}
            if opts and not no_change(current, opts) and opts not in out:
                out.append(opts)
        return out

    @staticmethod
    def _fit(cfg: dict[str, Any], cls: ShapeClass) -> dict[str, Any]:
        """``cfg`` with its tile along the class's dim no larger than the class needs (a 16-row tile for M=16)."""
        if cls.block is None or cls.op != "<=" or not isinstance(cfg.get(cls.block), int):
            return cfg
        fit = max(MIN_FIT, _next_pow2(cls.size))
        return {**cfg, cls.block: fit} if cfg[cls.block] > fit else cfg

    # -------------------------------------------------------------------------------------------------- candidates
    def _candidate(self, ctx: StageContext, kernel: str, branches: list[tuple[ShapeClass, dict[str, Any]]],
                   description: str, params: dict[str, Any]) -> Candidate | None:
        try:
            src = dispatch(ctx.source, kernel, [Branch(c.test, cfg) for c, cfg in branches])
        except (NotApplicable, LookupError):
            return None
        return Candidate(src, self.name, description, kind="search", params=params, time_all_shapes=True)

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            plan = self.plan(ctx)
        except NotApplicable:
            return []
        kernel = plan.site.kernel
        current = current_config(ctx.model, plan.site)
        self._proposed.clear()
        per_class = []
        for cls in plan.classes:
            out: list[Candidate] = []
            per_class.append(out)
            # rows that share the weight first: another tile alone still reads it once per row (gemv_decode at B = 8
            # on an H100, 2026-12-07: three such configurations 0.67-0.94x of the incumbent there)
            out.extend(self._shared_rows(ctx, plan.site, cls, current))
            cfgs = self.configs(ctx, plan.site, cls)
            for cfg in cfgs:
                changed = {k: v for k, v in cfg.items() if current.get(k) != v}
                desc = (f"{kernel}: if {cls.test} ({', '.join(cls.serves)}): {describe(changed)}; else the "
                        "incumbent's launch")
                cand = self._candidate(ctx, kernel, [(cls, cfg)], desc, dict(cfg))
                if cand is not None and cand.source != ctx.source:
                    self._proposed[source_hash(cand.source)] = Proposal(cls, "config", cfg)
                    out.append(cand)
            out.extend(self._swapped(ctx, kernel, cls, cfgs[:SWAPPED_PER_CLASS], current))
            split = self._split(ctx, kernel, cls)
            out.extend(split or self._split_reduction(ctx, kernel, cls))
            out.extend(self._gemv(ctx, plan.site, cls, current))
            out.extend(self._primary_winners(ctx, plan.site, cls, current))
        # the classes take turns, each's first candidate before any's second: under a time budget the tactic judges
        # its first few, and a class listed last (gemm_square's odd shape after its decode class's ten) would get none
        return [c for turn in itertools.zip_longest(*per_class) for c in turn if c is not None]

    def _record(self, cand: Candidate, proposal: Proposal) -> Candidate:
        self._proposed[source_hash(cand.source)] = proposal
        return cand

    def _swapped(self, ctx: StageContext, kernel: str, cls: ShapeClass, cfgs: list[dict[str, Any]],
                 current: dict[str, Any]) -> list[Candidate]:
        """For a class of few rows: its branch launches a swap-AB copy of the kernel (the tile computed transposed,
        N on the matrix unit's deep side; :mod:`xeforge.rewrite.device_tuning.swap_ab`) with each of the class's
        first configurations, the other shapes keep the kernel as it is."""
        if cls.op != "<=" or cls.block is None:
            return []
        try:
            rows = swap_ab(ctx.source, kernel)[1].shape[0]
        except NotApplicable:
            return []
        if rows != cls.block:  # few columns are not what swapping helps: the class must be of the tile's rows
            return []
        return self._copies(ctx, kernel, cls, cfgs, current, swapped_branch, "swap",
                            f"a swap-AB copy ({kernel}_swapab)")

    def _copies(self, ctx: StageContext, kernel: str, cls: ShapeClass, cfgs: list[dict[str, Any]],
                current: dict[str, Any], branch: Callable[[str, str, str, str], str], kind: str,
                copy: str) -> list[Candidate]:
        """One candidate per configuration: the class's branch launching a rewritten copy of the kernel (``branch``:
        :func:`swapped_branch`, :func:`gemv.gemv_branch`) with it, the other shapes keeping the incumbent's launch;
        a copy the knowledge base refuses is left out."""
        out, flag = [], {"swap": "swap_ab", "gemv": "gemv", "rows": "shared_rows", "dotrows": "dot_rows"}[kind]
        for cfg in cfgs:
            try:
                src = branch(dispatch(ctx.source, kernel, [Branch(cls.test, cfg)]), ctx.source, kernel, cls.test)
            except (NotApplicable, LookupError):
                return out
            if kb_errors(ctx, src):
                continue
            changed = {k: v for k, v in cfg.items() if current.get(k) != v}
            what = f"{copy} with {describe(changed) or 'the incumbent configuration'}"
            desc = f"{kernel}: if {cls.test} ({', '.join(cls.serves)}): {what}; else the incumbent's launch"
            out.append(self._record(Candidate(src, self.name, desc, kind="search", params={**cfg, flag: True},
                                              time_all_shapes=True), Proposal(cls, kind, cfg, what)))
        return out

    def _split(self, ctx: StageContext, kernel: str, cls: ShapeClass) -> list[Candidate]:
        """For a class of smaller shapes whose output tiles leave the device's cores idle (M = 16 at a 128-row
        tile: one row of tiles): split-K only there (:func:`xeforge.rewrite.device_tuning.splitk.apply` with
        ``when``: ``if M <= 128:`` the split copy and its second kernel, ``else:`` the incumbent's launch). Sized
        like the split-k tactic, at the class's first timed shape."""
        sized = _idle_cores_class(ctx, cls)
        if sized is None:
            return []
        cores, where, variant = sized
        try:
            plan = splitk.find(ctx.source, ctx.problem)
            if plan.kernel != kernel:
                return []
            tiles, steps = splitk.sizes(ctx.source, plan, ctx.problem, variant)
        except NotApplicable:
            return []
        if tiles >= cores:
            return []
        out = []
        for s in split_values(tiles, steps, cores)[:SPLIT_PER_CLASS]:
            try:
                src = splitk.apply(ctx.source, plan, s, when=cls.test)
            except NotApplicable:
                return out
            if kb_errors(ctx, src):
                continue
            what = (f"split-K, {s} programs per output tile ({tiles} tiles at {variant.name} for {cores} cores, "
                    f"{where}), partial tiles summed in order{' by the epilogue kernel' if plan.epilogue else ''}")
            desc = f"{kernel}: if {cls.test} ({', '.join(cls.serves)}): {what}; else the incumbent's launch"
            out.append(self._record(Candidate(src, self.name, desc, kind="search",
                                              params={splitk.PARAM: s, "when": cls.test}, time_all_shapes=True),
                                    Proposal(cls, "split", {}, what)))
        return out

    def _split_reduction(self, ctx: StageContext, kernel: str, cls: ShapeClass) -> list[Candidate]:
        """For a class of smaller shapes whose programs leave the device's cores idle: the kernel's reduction loop
        split over SPLIT programs per program and their partial states combined by a second kernel, only there
        (:func:`xeforge.rewrite.device_tuning.splitred.apply` with ``when``), sized at the class's first timed
        shape; a loop whose length is read from memory (a sequence length) is sized by the programs alone."""
        sized = _idle_cores_class(ctx, cls)
        if sized is None:
            return []
        cores, where, variant = sized
        try:
            plan = splitred.find(ctx.source, kernel)
            programs, steps = splitred.sizes(ctx.source, plan, ctx.problem, variant)
        except NotApplicable:
            return []
        if programs >= cores:
            return []
        out = []
        for s in splitred.split_values(programs, steps, cores)[:SPLIT_PER_CLASS]:
            try:
                src = splitred.apply(ctx.source, plan, s, when=cls.test)
            except NotApplicable:
                return out
            if kb_errors(ctx, src):
                continue
            length = f"{steps} loop steps" if steps is not None else "a loop whose length is read from memory"
            what = (f"a split reduction, {s} programs per program ({programs} programs and {length} at "
                    f"{variant.name} for {cores} cores, {where}), combined in slice order by {plan.combine_kernel}")
            desc = f"{kernel}: if {cls.test} ({', '.join(cls.serves)}): {what}; else the incumbent's launch"
            out.append(self._record(Candidate(src, self.name, desc, kind="search",
                                              params={splitred.PARAM: s, "when": cls.test}, time_all_shapes=True),
                                    Proposal(cls, "splitred", {}, what)))
        return out

    def _gemv(self, ctx: StageContext, site: LaunchSite, cls: ShapeClass, current: dict[str, Any]) -> list[Candidate]:
        """For a class of decode-sized rows (every timed shape it serves has at most ``gemv.GEMV_ROWS``): its branch
        launches the GEMV form of the kernel (``<kernel>_gemv``: the K loop's ``tl.dot`` as a multiply and a sum,
        one row a program; :mod:`xeforge.rewrite.device_tuning.gemv`), the other shapes keep the kernel."""
        if cls.op != "<=" or cls.block is None:
            return []
        timed = [v for v in ctx.problem.timed_variants(ctx.device.kind) if v.name in cls.serves]
        sizes = [v.dims.get(cls.dim) for v in timed]
        if not sizes or not all(isinstance(n, int) and n <= gemv.GEMV_ROWS for n in sizes):
            return []
        kernel = site.kernel
        try:
            _, form = gemv.gemv_form(ctx.source, kernel)
        except NotApplicable:
            return []
        if form.rows != cls.block:  # the class must be of the tile's rows
            return []
        names = set(tunable(ctx.model, site)) | set(OPTION_KEYS)
        return self._copies(ctx, kernel, cls, gemv.gemv_configs(form, current, names)[:GEMV_PER_CLASS], current,
                            gemv.gemv_branch, "gemv", f"the GEMV form ({kernel}{gemv.SUFFIX}: tl.dot as a multiply "
                            "and a sum)")

    def _shared_rows(self, ctx: StageContext, site: LaunchSite, cls: ShapeClass,
                     current: dict[str, Any]) -> list[Candidate]:
        """For a class of more rows than the primary shape's along a grid axis of one program a row (``grid =
        (cdiv(N, BLOCK_N), B)`` at B = 8 against B = 1): its branch launches the copy through ``tl.dot`` first
        (:meth:`_dot_rows`), then ``<kernel>_rows<R>``, R rows a program
        with what does not depend on the row loaded once (:mod:`xeforge.rewrite.device_tuning.shared_rows`), for
        each R of :data:`~xeforge.rewrite.device_tuning.shared_rows.ROWS` up to the class's size; the other shapes
        keep the kernel. Each with the launch search's fastest verified configuration, then the incumbent's, fitted for
        several rows a program (:func:`~xeforge.rewrite.device_tuning.shared_rows.fit_config`)."""
        if cls.op != ">" or not cls.param.startswith("grid axis "):
            return []
        kernel, axis = site.kernel, int(cls.param.rsplit(" ", 1)[1])
        # the launch search's fastest configuration first (gemv_decode on an H100, 2026-12-07: the copy at the
        # start's 32 x 128 tile gained 1.49x at B = 8 and stayed at 0.36x of torch.compile, where the search's
        # 4 x 1024 tile ran B = 1 2.15x faster), then the incumbent's
        names = set(tunable(ctx.model, site)) | set(OPTION_KEYS)
        best = measured_configs(ctx.run_dir, kernel, 1, tactics=("launch-params",), by_primary=True)
        cfgs = [c for c in ({**current, **{k: v for k, v in b.items() if k in names}} for b in best)
                if c != current] + [current]
        out = self._dot_rows(ctx, site, cls, current, axis)
        try:
            plans = {r: shared_rows.share_rows(ctx.source, kernel, axis, r)[1] for r in shared_rows.ROWS
                     if r <= cls.size}
        except NotApplicable:
            return out
        seen: list[tuple[int, dict[str, Any]]] = []
        for cfg in cfgs:
            for rows, plan in plans.items():
                fitted = shared_rows.fit_config(cfg)
                if (rows, fitted) in seen:
                    continue
                seen.append((rows, fitted))
                branch = functools.partial(shared_rows.rows_branch, axis=axis, rows=rows)
                out += self._copies(ctx, kernel, cls, [fitted], current, branch, "rows",
                                    f"{kernel}{shared_rows.SUFFIX}{rows} ({plan.describe().split(': ', 1)[1]})")
        return out

    def _dot_rows(self, ctx: StageContext, site: LaunchSite, cls: ShapeClass, current: dict[str, Any],
                  axis: int) -> list[Candidate]:
        """The class's branch launching ``<kernel>_dotrows``: 16 rows a program, the GEMV's sum as ``tl.dot`` on the
        matrix unit (:mod:`xeforge.rewrite.device_tuning.rows_dot`), with the KB's tiles for few rows."""
        try:
            dot_src = rows_dot.dot_rows(ctx.source, site.kernel, axis)[0]
        except NotApplicable:
            return []
        # the copy is a GEMM of 16 rows: the KB's space for few rows, read on the copy's own names
        cfgs = [{**current, **cfg} for cfg in kb_configs(ctx, dot_src, site.kernel, DOT_ROWS_CONFIGS,
                                                         rows=rows_dot.ROWS)]
        branch = functools.partial(rows_dot.dot_branch, axis=axis)
        return self._copies(ctx, site.kernel, cls, cfgs, current, branch, "dotrows",
                            f"{site.kernel}{rows_dot.SUFFIX} ({rows_dot.ROWS} rows a program through tl.dot)")

    def _primary_winners(self, ctx: StageContext, site: LaunchSite, cls: ShapeClass,
                         current: dict[str, Any]) -> list[Candidate]:
        """The other way round: the launch search's verified configurations (fastest at the primary shape first) for
        every shape but the class's, and the incumbent's launch kept for the class. A configuration the search
        rejected because it was faster at the primary shape but slower at a decode-like one (on the H200: kb09's
        128 x 256 tile, 0.87x at M=16) gets the shapes it wins at; gate 3 times every shape, as for the others."""
        names = tunable(ctx.model, site)
        fn = ctx.model.functions[site.kernel]
        out = []
        for cfg in measured_configs(ctx.run_dir, site.kernel, PRIMARY_WINNERS, tactics=("launch-params",),
                                    by_primary=True):
            full = {**current, **{k: v for k, v in cfg.items() if k in names or k in OPTION_KEYS}}
            if full == current or kb_rejects(ctx, full, fn):
                continue
            try:
                retiled = apply_config(ctx.source, site.kernel, full)
                src = dispatch(retiled, site.kernel, [Branch(cls.test, current)])
            except (NotApplicable, LookupError):
                continue
            changed = {k: v for k, v in full.items() if current.get(k) != v}
            desc = (f"{site.kernel}: if {cls.test} ({', '.join(cls.serves)}): the incumbent's launch; else "
                    f"{describe(changed)} (a configuration of the launch search, for the other shapes)")
            out.append(self._record(Candidate(src, self.name, desc, kind="search", params=dict(full),
                                              time_all_shapes=True), Proposal(cls, "else", full)))
        return out

    def follow_up(self, ctx: StageContext, outcomes: list[TrialOutcome]) -> list[Candidate]:
        """One dispatch with the winner of every part of the shapes that has one, when two parts or more do: each
        class's best accepted candidate (a configuration, or a swap-AB, split-K or GEMV-form copy) and the best
        configuration for the other shapes (:meth:`_primary_winners`). A copy goes in as the candidate that won (its
        ``else`` branch then takes the other shapes' configuration); with a copy, only one class is combined."""
        best: dict[str, tuple[float, Proposal, Candidate]] = {}  # class test ("" for the other shapes) -> winner
        for o in outcomes:
            got = self._proposed.get(source_hash(o.candidate.source))
            v = o.verdict
            if got is None or v is None or not v.accepted or not v.speedup:
                continue
            part = "" if got.kind == "else" else got.cls.test
            if part not in best or v.speedup > best[part][0]:
                best[part] = (v.speedup, got, o.candidate)
        rest = best.pop("", None)
        try:
            plan = self.plan(ctx)
        except NotApplicable:
            return []
        kernel = plan.site.kernel
        order = [c.test for c in plan.classes]
        winners = sorted(best.values(), key=lambda w: order.index(w[1].cls.test) if w[1].cls.test in order
                         else len(order))
        copies = [w for w in winners if w[1].kind != "config"]
        if copies and len(winners) == 1 and rest is not None and rest[1].cls.test == copies[0][1].cls.test:
            _, won, cand = copies[0]
            try:  # the copy's candidate as verified; its else branch, the only launch of the kernel, retiled
                src = apply_config(cand.source, kernel, rest[1].config)
            except (NotApplicable, LookupError):
                return []
            parts = [f"if {won.cls.test}: {won.what}"]
        else:
            winners = [w for w in winners if w[1].kind == "config"]
            if len(winners) + (rest is not None) < 2:
                return []
            if rest is not None and rest[1].cls.test not in best:
                # the other shapes' winner kept the incumbent's launch for its class: so does the combination
                keep = (0.0, replace(rest[1], kind="config", config=current_config(ctx.model, plan.site)), None)
                winners = sorted([*winners, keep], key=lambda w: order.index(w[1].cls.test)
                                 if w[1].cls.test in order else len(order))
            shapes = ctx.problem.correctness_variants(ctx.device.kind, getattr(ctx.settings, "ragged_shapes", True))
            if chain_coverage([w[1].cls for w in winners], shapes) is not None:
                return []
            try:  # a branch's configuration is whole over the tunable sizes; a launch option the incumbent leaves
                # to its default and the other shapes' configuration sets reaches the branch too: gate 3 judges
                # the combination as built, at every shape
                base = apply_config(ctx.source, kernel, rest[1].config) if rest is not None else ctx.source
                src = dispatch(base, kernel, [Branch(w[1].cls.test, w[1].config) for w in winners])
            except (NotApplicable, LookupError):
                return []
            parts = [f"if {w[1].cls.test}: {describe(w[1].config)}" for w in winners]
        current = current_config(ctx.model, plan.site)
        other = ({k: v for k, v in rest[1].config.items() if current.get(k) != v} if rest is not None else {})
        desc = (f"{kernel}: the per-shape winners combined: " + "; ".join(parts)
                + (f"; else {describe(other)} (the search's, for the other shapes)" if rest is not None
                   else "; else the incumbent's launch"))
        return [Candidate(src, self.name, desc, kind="search", params={}, time_all_shapes=True)]
