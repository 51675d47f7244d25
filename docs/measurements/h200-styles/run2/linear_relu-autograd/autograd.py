import torch
import triton
import triton.language as tl

@triton.jit
def fc_relu(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swn, swk, sym, syn,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(x_ptr + rm[:, None] * sxm + (k + rk)[None, :] * sxk,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        w = tl.load(w_ptr + (k + rk)[:, None] * swk + rn[None, :] * swn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, w)
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    acc = tl.maximum(acc, 0.0)
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def relu_grad(g_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    tl.store(out_ptr + offs, tl.where(y > 0, g, 0.0), mask=m)


class LinearReLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        M, K = x.shape
        N = weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        block_m, block_n, block_k = 16, 16, 32
        fc_relu[(triton.cdiv(M, 256), triton.cdiv(N, 128))](
            x, weight, bias, y, M, N, K, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            y.stride(0), y.stride(1), BM=256, BN=128, BK=64, num_warps=8, num_stages=3)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        out = torch.empty_like(grad)
        relu_grad[(triton.cdiv(grad.numel(), 256),)](grad, y, out, grad.numel(), BLOCK=256)
        return None, None, None


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features))
        self.bias = torch.nn.Parameter(torch.empty(out_features))
        ref = torch.nn.Linear(in_features, out_features)
        with torch.no_grad():
            self.weight.copy_(ref.weight)
            self.bias.copy_(ref.bias)

    def forward(self, x):
        return LinearReLUFunction.apply(x, self.weight.to(x.dtype), self.bias.to(x.dtype))
