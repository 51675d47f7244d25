"""Gate 2's comparison of one candidate output against the float64 oracle.

Owns: shape/dtype/type checks, finiteness, elementwise tolerance ``|out - ref| <= atol + rtol*|ref|``, the
constant-output check, and the feedback that names the worst element (index, expected, got), the fraction
outside tolerance and whether NaN/Inf appeared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Mismatch:
    reason: str  # short machine-friendly reason: shape, dtype, count, nonfinite, tolerance, constant
    message: str  # the feedback an engine or a user can act on
    details: dict[str, Any] = field(default_factory=dict)


def compare_outputs(outs: list, refs: list, expected_dtypes: list, rtol: float, atol: float) -> Mismatch | None:
    """None when every output matches; otherwise the first mismatch, described."""
    import torch  # lazy: torch (seconds to import) runs in the workers; only they compare outputs

    if len(outs) != len(refs):
        return Mismatch("count", f"returned {len(outs)} output(s); the reference returns {len(refs)}")
    for i, (o, r, dt) in enumerate(zip(outs, refs, expected_dtypes)):
        tag = f"output {i}" if len(refs) > 1 else "output"
        if not isinstance(o, torch.Tensor):
            return Mismatch("type", f"{tag} is {type(o).__name__}, not a tensor")
        if tuple(o.shape) != tuple(r.shape):
            return Mismatch("shape", f"{tag} has shape {tuple(o.shape)}; expected {tuple(r.shape)}")
        if dt is not None and o.dtype != dt:
            return Mismatch("dtype", f"{tag} has dtype {o.dtype}; expected {dt}")
        got = o.detach().to(torch.float64) if o.dtype.is_floating_point else o.detach().to(torch.int64)
        ref = r.detach().to(torch.float64) if r.dtype.is_floating_point else r.detach().to(torch.int64)
        if not got.dtype.is_floating_point:
            bad = got != ref
            if bad.any():
                idx = int(bad.reshape(-1).nonzero()[0])
                return Mismatch("tolerance", f"{tag}: {int(bad.sum())} of {bad.numel()} integer elements differ; first at "
                                f"{_unravel(idx, ref.shape)}: expected {int(ref.reshape(-1)[idx])}, got {int(got.reshape(-1)[idx])}")
            continue
        ref_finite = torch.isfinite(ref)
        got_finite = torch.isfinite(got)
        nonfinite = ref_finite & ~got_finite
        has_nan, has_inf = bool(torch.isnan(got).any()), bool(torch.isinf(got).any())
        if nonfinite.any():
            idx = int(nonfinite.reshape(-1).nonzero()[0])
            n = int(nonfinite.sum())
            return Mismatch("nonfinite", f"{tag}: {n} of {ref.numel()} elements are NaN/Inf where the oracle is finite; "
                            f"first at {_unravel(idx, ref.shape)}: expected {ref.reshape(-1)[idx].item():.6g}, got "
                            f"{got.reshape(-1)[idx].item()}", {"nan": has_nan, "inf": has_inf, "count": n})
        both = ref_finite & got_finite
        err = (got - ref).abs()
        allowed = atol + rtol * ref.abs()
        bad = both & (err > allowed)
        if bad.any():
            excess = torch.where(both, err / allowed.clamp_min(1e-300), torch.zeros_like(err))
            idx = int(excess.reshape(-1).argmax())
            frac = float(bad.sum()) / bad.numel()
            e, g = ref.reshape(-1)[idx].item(), got.reshape(-1)[idx].item()
            return Mismatch("tolerance", f"{tag}: {frac:.2%} of elements outside tolerance (rtol={rtol:g}, atol={atol:g}); "
                            f"worst at index {_unravel(idx, ref.shape)}: expected {e:.6g}, got {g:.6g} "
                            f"(|diff| {abs(g - e):.3g}); NaN: {'yes' if has_nan else 'no'}, Inf: {'yes' if has_inf else 'no'}",
                            {"index": _unravel(idx, ref.shape), "expected": e, "got": g, "fraction": frac,
                             "nan": has_nan, "inf": has_inf})
        # compare with the oracle as the output dtype can hold it: a bf16 logsumexp near 9 is legitimately constant
        ref_held = r.detach().to(o.dtype) if dt is not None and o.dtype.is_floating_point else ref
        if got.numel() > 1 and _constant(got) and not _constant(ref_held):
            return Mismatch("constant", f"{tag} is constant ({got.reshape(-1)[0].item():.6g} everywhere) but the oracle "
                            "is not: the kernel does not compute the function")
    return None


def _constant(t) -> bool:
    flat = t.reshape(-1)
    return bool((flat == flat[0]).all())


def _unravel(idx: int, shape) -> tuple[int, ...]:
    out = []
    for s in reversed(tuple(shape)):
        out.append(idx % s if s else 0)
        idx //= s if s else 1
    return tuple(reversed(out))
