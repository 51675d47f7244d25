import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _mm_bias(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swk, swn, sym, syn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(x_ptr + rm[:, None] * sxm + (k + rk)[None, :] * sxk,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(w_ptr + (k + rk)[:, None] * swk + rn[None, :] * swn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    acc = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear(x, weight, bias):
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
    _mm_bias[grid](x, weight, bias, y, M, N, K, x.stride(0), x.stride(1), weight.stride(1), weight.stride(0),
                   y.stride(0), y.stride(1), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
    return y



class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features) * 0.05)
        self.bias = torch.nn.Parameter(torch.randn(out_features) * 0.05)
        self.bias2 = torch.nn.Parameter(torch.randn(out_features) * 0.1)  # its shape is the trace's to tell
        self.slope = 0.2  # a Python scalar: the kernel receives it at run time

    def forward(self, x):
        y = linear(x, self.weight, self.bias)
        y = F.hardswish(y)
        y = F.elu(y, 0.5) + F.softsign(y)
        return torch.lerp(y, x, 0.25)
