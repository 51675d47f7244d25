"""GeGLU with the tanh-approximate GELU on two separate [tokens, hidden] tensors, written like a
fine-tuning library's elementwise activation op: flat 1D grid over numel, a jitted tanh helper,
an optional `out=` destination and a torch fallback for devices Triton cannot run on."""
import os
from typing import Optional

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_SQRT_2_OVER_PI = 0.7978845608028654
BLOCK_SIZE = 1024


@triton.jit
def _tanh(x):
    # tanh(x) = 2*sigmoid(2x) - 1, stable for large |x|
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _geglu_tanh_kernel(A, B, Out, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (a + 0.044715 * a * a * a)
    g = 0.5 * a * (1.0 + _tanh(inner))
    tl.store(Out + offs, (g * b).to(Out.dtype.element_ty), mask=mask)


def geglu_tanh(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    assert a.shape == b.shape, f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}"
    assert a.dtype == b.dtype
    if out is None:
        out = torch.empty_like(a, memory_format=torch.contiguous_format)
    else:
        assert out.shape == a.shape and out.is_contiguous(), "out must be contiguous and match a"
    if not (a.is_cuda or a.device.type == "xpu" or _INTERPRET):
        out.copy_(geglu_tanh_ref(a, b))
        return out
    n = a.numel()
    if n == 0:
        return out
    a = a.contiguous()
    b = b.contiguous()
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    _geglu_tanh_kernel[grid](a, b, out, n, BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
    return out


def geglu_tanh_ref(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    cdt = torch.float64 if a.dtype == torch.float64 else torch.float32
    af = a.to(cdt)
    g = 0.5 * af * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (af + 0.044715 * af.pow(3))))
    res = (g * b.to(cdt)).to(a.dtype)
    if out is not None:
        out.copy_(res)
        return out
    return res
