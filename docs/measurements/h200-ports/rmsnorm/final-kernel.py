"""NVIDIA-tuned port: RMSNorm over the last dim, one program per row holding the whole row in
registers (BLOCK = next_power_of_2(N)), num_warps=8, a single read of the row."""
import torch
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, stride_xm, stride_ym, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / N
    rstd = tl.rsqrt(ms + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    tl.store(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


class Model(torch.nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, hidden_size))
        self.eps = eps

    def forward(self, x):
        x = x.contiguous()
        M, N = x.shape
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        BLOCK = triton.next_power_of_2(N)
        rmsnorm_kernel[(M,)](x, self.weight, y, N, x.stride(0), y.stride(0), self.eps,
                             BLOCK=BLOCK, num_warps=8)
        return y
