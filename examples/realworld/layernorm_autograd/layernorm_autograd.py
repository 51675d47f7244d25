"""LayerNorm forward wrapped in a torch.autograd.Function, the form training libraries use: the
forward launches a one-row-per-program Triton kernel that also saves mean and rstd for backward;
the backward here is plain PyTorch math on the saved statistics."""
import torch
import triton
import triton.language as tl

MAX_FUSED_SIZE = 65536


@triton.jit
def _layer_norm_fwd_kernel(
    X, Y, W, B, Mean, Rstd,
    stride_x, stride_y,
    N, eps,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask, other=1.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


def _layer_norm_fwd(x, weight, bias, eps):
    M, N = x.shape
    y = torch.empty_like(x)
    mean = torch.empty((M,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    max_block = MAX_FUSED_SIZE // x.element_size()
    BLOCK_N = min(max_block, triton.next_power_of_2(N))
    if N > BLOCK_N:
        raise RuntimeError(f"layer norm: feature dim {N} exceeds the fused limit {max_block}")
    num_warps = min(max(BLOCK_N // 256, 1), 8)
    _layer_norm_fwd_kernel[(M,)](
        x, y, weight, bias, mean, rstd,
        x.stride(0), y.stride(0),
        N, eps,
        BLOCK_N=BLOCK_N, num_warps=num_warps,
    )
    return y, mean, rstd


class LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        x_shape = x.shape
        assert weight.shape == (x_shape[-1],) and bias.shape == (x_shape[-1],)
        x2d = x.reshape(-1, x_shape[-1])
        if x2d.stride(-1) != 1:
            x2d = x2d.contiguous()
        weight = weight.contiguous()
        bias = bias.contiguous()
        y, mean, rstd = _layer_norm_fwd(x2d, weight, bias, eps)
        ctx.save_for_backward(x2d, weight, mean, rstd)
        ctx.x_shape = x_shape
        return y.reshape(x_shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, weight, mean, rstd = ctx.saved_tensors
        dy2d = dy.reshape(x2d.shape).float()
        xhat = (x2d.float() - mean[:, None]) * rstd[:, None]
        wdy = dy2d * weight.float()
        n = x2d.shape[-1]
        c1 = (xhat * wdy).sum(-1, keepdim=True) / n
        c2 = wdy.sum(-1, keepdim=True) / n
        dx = (wdy - (xhat * c1 + c2)) * rstd[:, None]
        dw = (dy2d * xhat).sum(0)
        db = dy2d.sum(0)
        return (dx.to(x2d.dtype).reshape(ctx.x_shape), dw.to(weight.dtype),
                db.to(weight.dtype), None)


def layer_norm_fn(x, weight, bias, eps=1e-5):
    return LayerNormFn.apply(x, weight, bias, eps)


def layer_norm_ref(x, weight, bias, eps=1e-5):
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(cdt)
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps) * weight.to(cdt) + bias.to(cdt)
    return y.to(x.dtype)
