"""Divisibility hints for the integer arguments that lose Triton's own at some timed shapes.

Owns :func:`argument_roles` (which integer parameter of a kernel strides a tensor or bounds a mask, from the
analysis of its accesses), :func:`plan` and :func:`apply`. Triton specializes an integer argument on being a
multiple of 16 and nothing finer: at a hidden size of 3000 (a multiple of 8) a bf16 row stride of 3000 elements is
6000 bytes, every row 16-byte aligned, yet the kernel is compiled as if nothing were known, and its loads and masked
stores along those rows fall to narrower vectors (:mod:`xeforge.analysis.alignment` names such arguments). The
rewrite gives the compiler what the value is at run time: the kernel gets ``HINT_<arg>: tl.constexpr`` and, first
thing, ``if HINT_<arg> > 1: <arg> = (<arg> // HINT_<arg>) * HINT_<arg>``, a product with a constant whose
divisibility Triton's axis analysis carries into every address and mask made from it (``tl.multiple_of`` on a
kernel argument is dropped: its attribute has no op to sit on). The launch passes the largest power of two that
divides the value, up to 16 (``_xeforge_pow2(K)``), computed from the value itself, so the hint is true at every
shape by construction and the product is the value; each distinct hint is a compiled specialization of its own.
Compiled for sm_90 at gemm_square's 3000 x 4096 x 3000 (bf16), the B tile loads go from scalar ``ld.global.b16`` to
16-byte ``cp.async`` and the C stores from scalar to ``st.global.v4``, as at 4096 (tests/test_align_hints.py).
Whether a shape then runs faster is gate 3's to say.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import libcst as cst

from xeforge.analysis.alignment import (BOUND_ROLE, DIVISIBILITY, LOOP_ROLE, SCALAR_ROLE, STRIDE_ROLE,
                                       alignment_by_shape)
from xeforge.analysis.observe import traces
from xeforge.kernel_model import KernelModel, parse_kernel
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import statements
from xeforge.rewrite.tiling import BlockPtr, KernelAnalysis, Mask, Poly, Ptr
from xeforge.rewrite.tiling.edit import FunctionEdit, LaunchEdit, add_module_function, edit_function, edit_launch
from xeforge.rewrite.tiling.grid import launch_bindings, single_launch

PREFIX = "HINT_"
HELPER = "_xeforge_pow2"
HELPER_CODE = f'''\
def {HELPER}(x):
    """The largest power of two, up to {DIVISIBILITY}, that divides the integer x (1 for 0 or a negative x): a
    divisibility hint that holds at this call (xeforge, memory_access)."""
    x = int(x)
    return min({DIVISIBILITY}, x & -x) if x > 0 else 1
'''
#: host expressions a hint may evaluate a second time: names, attributes, t.stride(i), t.size(i), t.shape[i]
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(\.(stride|size)\(-?\d+\)|\.shape\[-?\d+\])?$")


def argument_roles(model: KernelModel) -> dict[tuple[str, str], str]:
    """(kernel, parameter) -> its role where the analysis of the kernel's accesses tells: a stride of a tensor
    (:data:`~xeforge.analysis.alignment.STRIDE_ROLE` + the tensor), a bound of its masks, else an offset of scalar
    accesses only or a loop's trip count. A block pointer's strides (and where its matrix starts) stride its
    tensor and its shape bounds its boundary checks, as a mask's bounds do: Triton lowers it to the same masked
    vector loads where it makes no TMA copy (gemm_tall_k at 1000 x 65536 x 1000, on the H200)."""
    roles: dict[tuple[str, str], str] = {}
    for name, fn in model.functions.items():
        try:
            accesses = KernelAnalysis(fn, model.functions).accesses
        except Exception:  # noqa: BLE001 — code the analysis does not read: no roles for that kernel
            continue
        for acc in accesses:
            if isinstance(acc.ptr, BlockPtr):
                starts = [*acc.ptr.strides, *([acc.ptr.start] if acc.ptr.start is not None else [])]
                for sym in set().union(*(p.symbols() for p in starts)) & set(fn.params):
                    roles.setdefault((name, sym), f"{STRIDE_ROLE}{acc.ptr.base}")
                for sym in set().union(*(p.symbols() for p in acc.ptr.shape)) & set(fn.params):
                    roles.setdefault((name, sym), BOUND_ROLE)
            if isinstance(acc.ptr, Ptr):
                for t in acc.ptr.offs.terms:
                    if (sym := t.stride.single_symbol()) is not None:
                        roles.setdefault((name, sym), f"{STRIDE_ROLE}{acc.ptr.base}")
        for acc in accesses:  # then what places a vector access's start (``h * stride_h + tl.arange(...)``)
            if isinstance(acc.ptr, Ptr):
                starts = [t.vec.start for t in acc.ptr.offs.terms] + [acc.ptr.offs.scalar]
                for sym in set().union(*(p.symbols() for p in starts)) & set(fn.params):
                    roles.setdefault((name, sym), f"{STRIDE_ROLE}{acc.ptr.base}")
            if isinstance(acc.mask, Mask):
                for b in acc.mask.bounds:
                    if (sym := b.limit.single_symbol()) is not None:
                        roles.setdefault((name, sym), BOUND_ROLE)
        # what is left: a parameter that only offsets scalar loads and stores (one element each), or only counts a
        # loop's trips; neither has an alignment for a hint to give
        params = set(fn.params)
        for acc in accesses:
            if isinstance(acc.ptr, Poly):
                for sym in acc.ptr.symbols() & params:  # the base pointer too: only integers are findings
                    roles.setdefault((name, sym), SCALAR_ROLE)
        for node in ast.walk(fn.node):
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                    isinstance(node.iter.func, ast.Name) and node.iter.func.id in ("range", "static_range"):
                for a in node.iter.args:
                    for n in ast.walk(a):
                        if isinstance(n, ast.Name) and n.id in params:
                            roles.setdefault((name, n.id), LOOP_ROLE)
    return roles


def findings(problem, source: str | None = None) -> list[dict]:
    """The integer arguments of ``source`` (default: the start) that lose Triton's divisibility-by-16 hint at some
    timed shapes (:func:`~xeforge.analysis.alignment.alignment_by_shape`, read from the traces of the ``bench-*``
    shapes, the primary first), each with its role where :func:`argument_roles` tells."""
    source = problem.kernel_source if source is None else source
    names = sorted(n for n in problem.spec.variants if n.startswith("bench-"))
    if len(names) < 2:
        return []
    primary = problem.timing_variant("cuda").name
    shapes = [primary, *(n for n in names if n != primary)]
    try:
        roles = argument_roles(parse_kernel(source))
    except Exception:  # noqa: BLE001 — a file the kernel model does not read: the findings come without roles
        roles = {}
    return alignment_by_shape(traces(problem, source), shapes, roles)


def dropped_hints(model: KernelModel, kernel: str) -> list[str]:
    """The kernel's own ``tl.multiple_of`` / ``tl.max_contiguous`` calls on a parameter itself, as written with their
    line: the compiler drops them (the hint is an attribute of the op that made the value, and an argument has none;
    an argument's divisibility comes from the JIT's specialization alone, by 16)."""
    fn = model.functions.get(kernel)
    if fn is None:
        return []
    params = set(fn.params)
    return [f"{ast.unparse(c)} (line {c.lineno})" for c in ast.walk(fn.node)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr in ("multiple_of", "max_contiguous") and c.args
            and isinstance(c.args[0], ast.Name) and c.args[0].id in params]


@dataclass
class HintPlan:
    kernel: str
    args: dict[str, str]  # parameter -> the host expression the launch passes
    findings: list[dict]  # the alignment findings behind it (shape, value, role)
    dropped: list[str] = field(default_factory=list)  # the kernel's own hints on arguments, which do nothing

    def describe(self) -> str:
        at = sorted({f"{f['arg']}={f['value']} at {f['shape']}" for f in self.findings})
        own = (f"; its own {', '.join(self.dropped)} does nothing: the compiler drops a hint on an argument"
               if self.dropped else "")
        return (f"{self.kernel}: divisibility hints for {', '.join(self.args)} (the largest power of two up to "
                f"{DIVISIBILITY} that divides each, passed per call; {'; '.join(at)}{own})")


def plan(source: str, findings: list[dict]) -> list[HintPlan]:
    """One plan per kernel with findings whose argument is a stride or a mask bound and whose value keeps a power
    of two of at least 2 (an odd value has nothing to give); NotApplicable with the reason where none is left."""
    if not findings:
        raise NotApplicable("every integer argument is a multiple of 16 at every timed shape, or never is: Triton's "
                            "own divisibility hint covers them")
    model = parse_kernel(source)
    why: list[str] = []
    by_kernel: dict[str, list[dict]] = {}
    for f in findings:
        role, v = f.get("role") or "", f["value"]
        if role in (SCALAR_ROLE, LOOP_ROLE):
            why.append(f"{f['kernel']}'s {f['arg']} is {role}: no vector access's alignment depends on it")
        elif not (role.startswith(STRIDE_ROLE) or role == BOUND_ROLE):
            why.append(f"{f['kernel']}'s {f['arg']} is neither a stride nor a mask bound the analysis reads")
        elif v % 2:
            why.append(f"{f['kernel']}'s {f['arg']} = {v} at {f['shape']} is odd: no power of two to hint")
        else:
            by_kernel.setdefault(f["kernel"], []).append(f)
    out = []
    for kernel, found in by_kernel.items():
        fn = model.functions.get(kernel)
        if fn is None or any(p.startswith(PREFIX) for p in fn.params):
            why.append(f"{kernel} has its hints already" if fn is not None else f"{kernel} is not in the file")
            continue
        try:
            bind = launch_bindings(single_launch(model, kernel), fn, source)
        except NotApplicable as exc:
            why.append(str(exc))
            continue
        args = {}
        for f in found:
            host = bind.get(f["arg"], "")
            if _PLAIN.match(host.strip()):
                args.setdefault(f["arg"], host.strip())
            else:
                why.append(f"{kernel}'s {f['arg']} is passed as {host or 'nothing'}, which a hint would evaluate again")
        if args:
            out.append(HintPlan(kernel, args, [f for f in found if f["arg"] in args], dropped_hints(model, kernel)))
    if not out:
        raise NotApplicable("; ".join(dict.fromkeys(why)))
    return out


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) \
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def apply(source: str, p: HintPlan) -> str:
    """The kernel hinted and its launch passing the hints (the helper added once to the module)."""
    model = parse_kernel(source)
    site = single_launch(model, p.kernel)
    names = {a: f"{PREFIX}{a}" for a in p.args}
    # ``tl.multiple_of`` on a kernel argument is silently dropped (its attribute has no op to sit on); a product
    # with the constant carries the divisibility through Triton's axis analysis, and is the value itself here
    lines = [f"if {h} > 1:\n    {a} = ({a} // {h}) * {h}" for a, h in names.items()]

    def body(original, updated, line_of):
        doc = 1 if updated and _is_docstring(updated[0]) else 0  # the hints go after a docstring
        return [*updated[:doc], *statements("\n".join(lines) + "\n"), *updated[doc:]]

    # the launch first: the kernel's new lines would move it
    src = edit_launch(source, LaunchEdit(p.kernel, site.line, set_kwargs={h: f"{HELPER}({p.args[a]})"
                                                                          for a, h in names.items()}))
    src = edit_function(src, FunctionEdit(p.kernel, body=body, new_params=[f"{h}: tl.constexpr" for h in
                                                                           names.values()]))
    if f"def {HELPER}(" not in src:
        src = add_module_function(src, HELPER, HELPER_CODE)
    return src
