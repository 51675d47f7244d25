"""Naive port: LayerNorm over the last dim, one program per row, fixed BLOCK_SIZE=256 chunks and
three passes over the row (mean, variance, normalise): the row is read from memory three times."""
import torch
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, stride_xm, stride_ym, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    # pass 1: mean
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    # pass 2: variance
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
        d = tl.where(cols < N, x - mean, 0.0)
        acc += d * d
    var = tl.sum(acc, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    # pass 3: normalise and apply the affine
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


class Model(torch.nn.Module):
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        with torch.no_grad():  # non-trivial, deterministic affine
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, hidden_size))
            self.norm.bias.copy_(torch.linspace(-0.25, 0.25, hidden_size))

    def forward(self, x):
        x = x.contiguous()
        M, N = x.shape
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        layernorm_kernel[(M,)](x, self.norm.weight, self.norm.bias, y, N, x.stride(0), y.stride(0),
                               self.norm.eps, BLOCK_SIZE=4096, num_warps=4, num_stages=1)
        return y
