"""Gate 2's integrity checks that the parent decides from data the worker returned (never from its say-so).

Owns: the canary padding placed around every input (its width and fill value, shared with the worker that
builds the padded buffers), and the checks made on the tensors a worker wrote: an input changed by the call, a
write outside an input's bounds (the padding no longer NaN / the sentinel), two runs on the same inputs with
different bits. The worker only returns the buffers; patching torch inside it changes none of these verdicts.
"""

from __future__ import annotations

from typing import Any

CANARY = 64  # elements of NaN (or a sentinel) on each side of every input


def canary_value(torch: Any, dtype: Any) -> Any:
    """What the padding holds: NaN for floats, True for bools, a large sentinel for integers."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max if dtype != torch.int64 else 2**62


def same_bits(a: Any, b: Any) -> bool:
    """Bit-identical: same shape, dtype and bytes (NaN payloads included, -0.0 distinct from 0.0)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool(torch.equal(a.contiguous().view(-1).view(ints), b.contiguous().view(-1).view(ints)))
    return bool(torch.equal(a, b))


def input_problems(names: list[str], originals: list[Any], buffers: list[Any]) -> tuple[list[str], list[str]]:
    """(inputs changed by the call, inputs written outside their bounds), from each padded buffer after the call."""
    import torch

    mutated, overwritten = [], []
    for name, orig, buf in zip(names, originals, buffers):
        n = orig.numel()
        if buf.dtype != orig.dtype or buf.dim() != 1 or buf.numel() != n + 2 * CANARY:
            overwritten.append(name)  # the worker returned something else than the buffer it was given
            continue
        if not same_bits(buf[CANARY:CANARY + n].view(orig.shape), orig.to(buf.device)):
            mutated.append(name)
        pads = torch.cat([buf[:CANARY], buf[CANARY + n:]])
        fill = canary_value(torch, buf.dtype)
        intact = bool(torch.isnan(pads).all()) if buf.dtype.is_floating_point else bool((pads == fill).all())
        if not intact:
            overwritten.append(name)
    return mutated, overwritten
