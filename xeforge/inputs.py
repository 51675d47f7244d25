"""The inputs of one run: what each tensor looks like (:class:`TensorPlan`) and how it is drawn.

Owns: :class:`TensorPlan` (an input's name, shape, dtype and integer range, as plain data for a worker request),
:func:`generate_inputs` (bitwise identical tensors in every process for the same seed, distribution and device)
and the vocabularies both use. The worker imports this module, not :mod:`xeforge.problem`: a worker's start-up
(every verifier starts two) does not pay for the spec schema and the knowledge base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}
DISTRIBUTIONS = ("normal", "uniform", "outliers")


@dataclass(frozen=True)
class TensorPlan:
    """What one input tensor looks like in one variant: enough to generate it in any process."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    low: int = 0
    high: int = 1024

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def wire(self) -> dict[str, Any]:
        """Plain JSON data, for a worker request."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "low": self.low, "high": self.high}

    @classmethod
    def from_wire(cls, d: "dict[str, Any] | TensorPlan") -> "TensorPlan":
        if isinstance(d, TensorPlan):
            return d
        return cls(str(d["name"]), tuple(int(s) for s in d["shape"]), str(d["dtype"]), int(d["low"]), int(d["high"]))


def generate_inputs(plan: list[TensorPlan], seed: int, distribution: str = "normal", device: str = "cpu") -> list:
    """Inputs drawn from ``distribution`` with ``seed``; bitwise identical in every process for the same device."""
    import torch  # lazy: torch, for the tensors of a run only

    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for tp in plan:
        dtype = getattr(torch, tp.dtype)
        if tp.is_float:
            if distribution == "uniform":
                t = torch.rand(tp.shape, generator=gen, device=device, dtype=torch.float32) * 2 - 1
            else:
                t = torch.randn(tp.shape, generator=gen, device=device, dtype=torch.float32)
                if distribution == "outliers" and t.numel():
                    n = max(1, t.numel() // 997)
                    idx = torch.randint(0, t.numel(), (n,), generator=gen, device=device)
                    t.view(-1)[idx] *= 30.0
            out.append(t.to(dtype))
        elif tp.dtype == "bool":
            out.append(torch.randint(0, 2, tp.shape, generator=gen, device=device).bool())
        else:
            out.append(torch.randint(tp.low, tp.high, tp.shape, generator=gen, device=device, dtype=dtype))
    return out
