"""Stage 7, device_tuning: tile sizes, ``num_warps``, ``num_stages`` (and on xpu ``grf_mode``/``warp_size``).

Owns: the launch-parameter search tactic — find the block sizes (literal or an expression with one value at every
shape: :func:`xeforge.rewrite.tiling.configs.tunable_names`; or values the host computes per shape, a heuristic's
tuple, a ``**cfg`` table, ``next_power_of_2`` of a row, which a configuration sets right where they are made:
:mod:`xeforge.rewrite.tiling.host_rule`) and launch options at the launch site of the kernel
that matters most, draw alternatives from the knowledge base's tuning space for the device and kernel family (a
small built-in space when no KB entry applies; a block size no role of the space names, a split-KV kernel's
``BLOCK_SEQ``, by its own neighbours), prune what the KB constraints forbid, keep grid sizes consistent
with the block sizes (and a split sized per call with the split launch it counts: :func:`splitk.follow`), and
hand the candidates to the verifier. The pipeline keeps the best verified one. An
``@triton.autotune``'d kernel is searched by pinning: each of its own configurations and the KB's is written at
the launch with the decorator removed, so the verifier times them one by one (where the autotuner prunes its
configs, the decorator stays with the pinned config first and the user's pruning deciding: :func:`autotune.pin`).
A value the kernel's ``@triton.heuristics`` makes is set in its decorator entry, where Triton reads it.

The stage's other tactics live beside it, in this order (each one works on the best kernel of the ones before):
``split-k`` (:mod:`stages.device_tuning_splitk`, SPLIT_K programs per output tile over slices of K when a GEMM's
tiles leave cores idle; first, because the swizzle would make the 2D grid 1D and the search should tune the
split kernel), ``split-reduction`` (:mod:`stages.device_tuning_splitred`, the same for a kernel that is not a GEMM:
SPLIT programs per program over slices of a long reduction loop — a running max, sums, sums rescaled by the max —
combined in order by a second kernel), ``group-swizzle`` (:mod:`stages.device_tuning_swizzle`, grouped tile order, before the search so
it tunes GROUP_SIZE_M), ``swap-ab`` (:mod:`stages.device_tuning_swap`, after the search: the GEMM's tile computed
transposed so that N fills the matrix unit's deep side at decode-sized M, timed at every shape),
``per-shape-config`` (:mod:`stages.device_tuning_shapes`, right after the search: where the
spec times several shapes, another configuration for the class of a shape far from the primary one — a decode-like
M — as a small dispatch at the launch, ``if M <= 128: kernel[grid_a](..., BLOCK_M=16, ...) else: <the searched
launch>``, drawn from the search's verified trials and the KB's seeds, every branch reached by a correctness shape,
gate 3 timing every shape; on the interpreter and at an ``@triton.autotune``'d kernel it does not apply) and
``epilogue-halves`` (:mod:`stages.device_tuning_epilogue`, a GEMM's epilogue on the two column halves of its tuned
tile, fewer live registers where a heavy epilogue spills), ``rows-per-program`` (:mod:`stages.device_tuning_rows`,
ROWS rows per program for kernels that start one tiny program per row, so ROWS is sized from the tuned block) and
``host-descriptors`` (:mod:`stages.device_tuning_host_desc`: the tuned kernel's tensor descriptors built on the
host where the KB says the device gains), and last ``second-launch-params`` (:class:`SecondLaunchSearch`, on a GPU:
the same search at the forward's next launch with block sizes, a generated second pass or a split's summing kernel,
in what is left of the stage's share).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from stages.base import (Applicability, Candidate, Issue, Stage, StageContext, Tactic, compiled_facts,
                         incumbent_spills)
from stages.device_tuning_epilogue import EpilogueHalves
from stages.device_tuning_host_desc import HostDescriptors
from stages.device_tuning_rows import RowsPerProgram
from stages.device_tuning_shapes import PerShapeConfig
from stages.device_tuning_splitk import SplitK, bench_variant
from stages.device_tuning_splitred import SplitReduction
from stages.device_tuning_swap import SwapAB
from stages.device_tuning_swizzle import GroupedTileOrder
from xeforge.analysis.launches import autotune_configs, bindings, block_params, live_launches, observed
from xeforge.kb.roles import first_int
from xeforge.kernel_model import KernelModel, LaunchSite
from xeforge.rewrite import NotApplicable, autotune
from xeforge.rewrite.device_tuning import splitk
from xeforge.rewrite.tiling.configs import (OPTION_KEYS, apply_config, current_config, kb_rejects, kernel_family,
                                            no_change, option_keys, traced_options, tunable_names)
from xeforge.rewrite.tiling.host_rule import changes_nothing, host_made


def target_site(model: KernelModel, primary: str | None = None) -> LaunchSite | None:
    """The launch worth tuning first, of the kernels that really run: one with tl.dot, else the first launch with
    tunable block sizes or an ``@triton.autotune`` list to pin; of a kernel launched from several places (a
    per-shape dispatch's branches), the one the traces saw run at the ``primary`` variant, gate 3's first shape."""
    def score(site: LaunchSite) -> tuple:
        fn = model.functions[site.kernel]
        has_dot = any(c.name.endswith(".dot") and c.function == fn.name for c in model.calls)
        seen = observed(model, site) if primary else {}
        elsewhere = bool(seen) and not any(primary in per for per in seen.values())
        return (not has_dot, elsewhere, site.line)

    sites = [s for s in live_launches(model) if _pinnable(model, s) or
             (not model.functions[s.kernel].is_autotuned and tunable_names(model, s)[0])]
    if not sites:  # block sizes the host computes (next_power_of_2 of a row): the launch options are still searched
        sites = [s for s in live_launches(model) if not model.functions[s.kernel].is_autotuned
                 and sum(o.kernel == s.kernel for o in model.launches) == 1]
    return min(sites, key=score) if sites else None


def _pinnable(model: KernelModel, site: LaunchSite) -> bool:
    """An autotuned kernel whose configurations are known (literal or traced) and launched from one place."""
    return model.functions[site.kernel].is_autotuned and bool(autotune_configs(model, site.kernel)) and \
        sum(s.kernel == site.kernel for s in model.launches) == 1


def _fallback_space(current: dict[str, Any], names: list[str], device_kind: str) -> dict[str, list[Any]]:
    space: dict[str, list[Any]] = {}
    for n in names:
        v = current[n]
        if "GROUP" in n.upper():
            space[n] = sorted({1, 4, 8, v})
        else:
            space[n] = sorted({max(16, v // 2), v, min(256, v * 2), min(256, v * 4)})
    space["num_warps"] = sorted({4, 8, current.get("num_warps", 4)})
    if device_kind == "cuda":
        space["num_stages"] = sorted({2, 3, 4, current.get("num_stages", 3)})
    return space


def _role_less(current: dict[str, Any], names: list[str], varied: set[str]) -> list[dict[str, Any]]:
    """One configuration per neighbour (half, double, a quarter, four times) of each tunable block size the tuning
    space never varies (``varied``: the names its configurations set) — one that plays no role the space keys on
    (a split-KV kernel's BLOCK_SEQ), or whose role the family's space leaves out (an elementwise kernel's column
    block called BLOCK_N) — the others as they are."""
    out = []
    for n in names:
        v = current.get(n)
        if n in varied or not isinstance(v, int) or isinstance(v, bool) or v < 1:
            continue
        out += [{n: w} for w in (v // 2, v * 2, v // 4, v * 4) if w >= 1]
    return out


def _acc_per_warp(cfg: dict[str, Any]) -> float | None:
    """Accumulator elements each warp holds in a GEMM tile (BLOCK_M x BLOCK_N / num_warps), halved where the
    configuration asks for Intel's large register file: the register pressure a configuration puts on the
    epilogue. None where the configuration names no M/N tile or warps."""
    m, n, w = first_int("block_m", cfg), first_int("block_n", cfg), cfg.get("num_warps")
    if not (m and n and isinstance(w, int) and w > 0):
        return None
    return m * n / w / (2 if str(cfg.get("grf_mode")) in ("large", "256") else 1)


def fewer_registers_first(pool: list[dict[str, Any]], current: dict[str, Any]) -> list[dict[str, Any]]:
    """``pool`` with the configurations that hold a smaller accumulator per warp than ``current`` first, each group
    in its own order: where the incumbent spills, a configuration as large as it spills as well."""
    now = _acc_per_warp(current)
    if now is None:
        return pool
    smaller = [c for c in pool if (p := _acc_per_warp({**current, **c})) is not None and p < now]
    return smaller + [c for c in pool if c not in smaller]


class LaunchParamSearch(Tactic):
    name = "launch-params"
    summary = ("search block sizes, num_warps and num_stages at the launch site within the KB's valid space "
               "(an @triton.autotune'd kernel: each of its configs and the KB's, pinned at the launch)")

    def _site(self, ctx: StageContext) -> LaunchSite | None:
        """The launch this search tunes: the one that matters most (:func:`target_site`)."""
        return target_site(ctx.model, bench_variant(ctx).name)

    def check(self, ctx: StageContext) -> Applicability:
        m = ctx.model
        if not m.launches:
            return Applicability(False, "no kernel launch found in the file")
        site = self._site(ctx)
        if site is None:
            reasons = []
            for s in live_launches(m):
                if m.functions[s.kernel].is_autotuned:
                    reasons.append(f"{s.kernel} is @triton.autotune'd with configs that are neither literal nor "
                                   "traced" if not autotune_configs(m, s.kernel) else
                                   f"{s.kernel} is @triton.autotune'd and launched from several places")
                else:
                    _, why = tunable_names(m, s)
                    reasons.append(f"{s.kernel}: " + ("; ".join(why.values()) or "no block-size constexprs"))
            return Applicability(False, "no launch with block sizes to search (" + "; ".join(reasons) + ")")
        if m.functions[site.kernel].is_autotuned:
            n = len(autotune_configs(m, site.kernel))
            return Applicability(True, f"{site.kernel} at line {site.line}: its {n} @triton.autotune config(s) and "
                                       "the KB's, each pinned at the launch (decorator removed)")
        names, why = tunable_names(m, site)
        extra = f" (left alone: {'; '.join(why.values())})" if why else ""
        if spills := incumbent_spills(ctx.diagnosis, site.kernel):
            extra += (f"; it spills {spills} registers, so configurations with a smaller accumulator per warp "
                      "are tried first")
        what = f"{', '.join(names)} + launch options" if names else "the launch options (num_warps, num_stages)"
        return Applicability(True, f"{site.kernel} at line {site.line}: {what}{extra}")

    def _current(self, m: KernelModel, site: LaunchSite) -> tuple[list[str], dict[str, Any], list[dict[str, Any]]]:
        """The names to search, the configuration to search around, and configurations to try first."""
        fn = m.functions[site.kernel]
        if fn.is_autotuned:
            own = autotune_configs(m, site.kernel)
            blocks = block_params(fn)
            names = sorted({k for c in own for k in c if k in blocks})
            return names, dict(own[0]), [dict(c) for c in own]
        names, _ = tunable_names(m, site)
        return names, current_config(m, site), []

    def configs(self, ctx: StageContext, site: LaunchSite, names: list[str]) -> list[dict[str, Any]]:
        m = ctx.model
        fn = m.functions[site.kernel]
        _, current, first = self._current(m, site)
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
            for cfg in kb_space.configs(names, kernel=fn):
                pool.append({k: v for k, v in cfg.items() if k in names or k in
                             ("num_warps", "num_stages", "grf_mode", "warp_size")})
            n_seeds = len(getattr(kb_space, "seeds", []) or [])
            # block sizes no role of the KB's space names (a split-KV kernel's BLOCK_SEQ): the space never varies
            # them, so each gets its own neighbours right after the seeds, the rest of the launch as it is
            pool[n_seeds:n_seeds] = _role_less(current, names, {k for cfg in pool for k in cfg})
        else:
            space = _fallback_space(current, names, ctx.device.kind)
            keys = list(space)
            pool = [dict(zip(keys, vals)) for vals in itertools.product(*(space[k] for k in keys))]
        # a cap at or above every traced value of a block the host sizes from the row changes nothing: dropped
        made = host_made(m, site) if not fn.is_autotuned else {}
        pool = [{k: v for k, v in cfg.items() if not (k in made and changes_nothing(m, site, made[k], v))}
                for cfg in pool]
        # what the launch runs with now, options the host computes included (a num_warps heuristic's value at the
        # primary shape): a configuration that only sets those is the incumbent again; num_stages only where the
        # kernel loops (a one-pass kernel compiles the same at any)
        effective = {**traced_options(m, site), **current} if not fn.is_autotuned else current
        keys = option_keys(fn)
        pool = [{k: v for k, v in cfg.items() if k not in OPTION_KEYS or k in keys} for cfg in pool]
        seen, out = set(), []
        # the KB's seeds first (configurations known to be good on the device), in order; then an autotuned kernel's
        # own configurations, each pinned (its autotuner already picks the best of them at run time, so pinning
        # one rarely gains: measured on the H200, a budget spent on them left the KB's tiles untried); then a
        # deterministic shuffle of the rest, so a small budget still samples the whole space, not one corner of it
        rest = pool[n_seeds:]
        random.Random(f"{site.kernel}:{sorted(current.items())}").shuffle(rest)
        pool = pool[:n_seeds] + first + rest
        if incumbent_spills(ctx.diagnosis, site.kernel):  # the launch as compiled: num_warps from the facts
            warps = compiled_facts(ctx.diagnosis, site.kernel).get("num_warps")
            pool = fewer_registers_first(pool, {**({"num_warps": warps} if warps else {}), **effective})
        for cfg in pool:
            full = {**current, **cfg}
            key = tuple(sorted(full.items()))
            if not cfg or key in seen or (not first and no_change(effective, cfg)):
                continue
            seen.add(key)
            if kb_rejects(ctx, full, fn):
                continue
            out.append(full if first else cfg)
            if len(out) >= budget:
                break
        return out

    def propose(self, ctx: StageContext) -> list[Candidate]:
        m = ctx.model
        site = self._site(ctx)
        if site is None:
            return []
        several = sum(s.kernel == site.kernel for s in m.launches) > 1
        names, _, _ = self._current(m, site)
        pinned = m.functions[site.kernel].is_autotuned
        kind = getattr(ctx.device, "kind", "cuda")
        out = []
        for cfg in self.configs(ctx, site, names):
            try:
                src = autotune.pin(ctx.source, site.kernel, cfg, kind) if pinned else \
                    splitk.follow(apply_config(ctx.source, site.kernel, cfg, line=site.line if several else None))
            except NotApplicable:
                continue
            desc = ", ".join(f"{k}={v}" for k, v in cfg.items())
            out.append(Candidate(src, self.name, f"{site.kernel}: {'pinned ' if pinned else ''}{desc}", kind="search",
                                 params=cfg))
        return out


class SecondLaunchSearch(LaunchParamSearch):
    name = "second-launch-params"
    summary = ("the same search at the forward's next launch with block sizes (a generated second pass, a split's "
               "summing kernel), which the first search leaves as the host sizes it")

    def _site(self, ctx: StageContext) -> LaunchSite | None:
        """The first live launch, other than the first search's, of a kernel launched once, not autotuned, with
        block sizes to search; None on the interpreter (nothing to rank, and the first search's candidates are what
        a CPU run checks). On an H100 (2026-12-07) the read-back epilogues' generated second pass took 0.029 ms at
        4096^3 against torch.compile's 0.020, sized by the host's rule alone."""
        if not getattr(ctx.device, "can_time", False):
            return None
        m = ctx.model
        first = target_site(m, bench_variant(ctx).name)
        for s in live_launches(m):
            if first is not None and s.kernel == first.kernel:
                continue
            if m.functions[s.kernel].is_autotuned or sum(o.kernel == s.kernel for o in m.launches) != 1:
                continue
            if tunable_names(m, s)[0]:
                return s
        return None

    def check(self, ctx: StageContext) -> Applicability:
        if self._site(ctx) is not None:
            return super().check(ctx)
        if not getattr(ctx.device, "can_time", False):
            return Applicability(False, "nothing to rank on the interpreter (the first launch's search is what a CPU "
                                        "run checks)")
        return Applicability(False, "no second launch with block sizes to search (one kernel, or the others "
                                    "autotuned, launched from several places or without block-size constexprs)")


def _detect_defaults(ctx: StageContext) -> list[Issue]:
    out = []
    m = ctx.model
    for site in live_launches(m):
        fn = m.functions[site.kernel]
        warps = bindings(m, site).get("num_warps")
        if warps is None and not fn.is_autotuned:
            out.append(Issue("device_tuning", "default-warps", f"{site.kernel} launches with default num_warps",
                             site.line))
        elif warps is not None and not warps.constant and not fn.is_autotuned:
            out.append(Issue("device_tuning", "host-computed-warps", f"{site.kernel} launches with "
                             f"num_warps={warps.expr}, computed on the host ({warps.why})", site.line))
        blocks = block_params(fn)
        small = [f"{k}={b.value}" for k, b in bindings(m, site).items() if k in blocks and b.constant and
                 isinstance(b.value, int) and not isinstance(b.value, bool) and 0 < b.value <= 32]
        if small:
            out.append(Issue("device_tuning", "small-tiles", f"{site.kernel} uses small fixed tiles ({', '.join(small)})",
                             site.line))
    return out


STAGE = Stage(
    name="device_tuning",
    order=7,
    goal="pick tile sizes, num_warps, num_stages, grf_mode, warp_size and GROUP_SIZE_M for the device",
    kb_topics=("tiles", "warps", "grf", "slm", "swizzle"),
    # split-K first: it needs the 2D grid the swizzle replaces, and the search then tunes the split kernel; the
    # split reduction beside it, for the loops of kernels that are not GEMMs;
    # swizzle before the search: GROUP_SIZE_M becomes searchable; swap-AB after it, timed at every shape; per-shape
    # configurations after them: the primary keeps the searched configuration and the search's trials are there to
    # draw from; the epilogue halves then, of the tuned tile; row batching then: ROWS is sized from the tuned block;
    # host-side descriptors then: they are built from the launch the tactics before settled; the second launch's
    # search last, in what is left of the share
    tactics=[SplitK(), SplitReduction(), GroupedTileOrder(), LaunchParamSearch(), SwapAB(target_site), PerShapeConfig(target_site),
             EpilogueHalves(target_site), RowsPerProgram(), HostDescriptors(), SecondLaunchSearch()],
    detectors=[_detect_defaults],
)
