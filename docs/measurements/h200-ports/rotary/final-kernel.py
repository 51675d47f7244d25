"""Naive port: rotary position embedding (rotate-half / NeoX form) on x [B, S, H, D] with
cos, sin [S, D]: out = x * cos + rotate_half(x) * sin. One program per (b, s, h) vector of D
elements (tiny programs, cos/sin re-read for every head)."""
import torch
import triton
import triton.language as tl


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, S, H, HALF,
                  stride_xb, stride_xs, stride_xh, stride_ob, stride_os, stride_oh,
                  stride_cs, stride_ss, N_ROWS, BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    row_ok = pid < N_ROWS
    h = pid % H
    s = (pid // H) % S
    b = pid // (H * S)
    j = tl.arange(0, BLOCK_HALF)[None, :]
    mask = j < HALF
    x_base = x_ptr + b * stride_xb + s * stride_xs + h * stride_xh
    o_base = out_ptr + b * stride_ob + s * stride_os + h * stride_oh
    x1 = tl.load(x_base + j, mask=mask & row_ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_base + HALF + j, mask=mask & row_ok, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + s * stride_cs + j, mask=mask & row_ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + s * stride_cs + HALF + j, mask=mask & row_ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + s * stride_ss + j, mask=mask & row_ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + s * stride_ss + HALF + j, mask=mask & row_ok, other=0.0).to(tl.float32)
    y1 = x1 * c1 - x2 * s1
    y2 = x2 * c2 + x1 * s2
    tl.store(o_base + j, y1.to(out_ptr.dtype.element_ty), mask=mask & row_ok)
    tl.store(o_base + HALF + j, y2.to(out_ptr.dtype.element_ty), mask=mask & row_ok)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        x = x.contiguous()
        cos = cos.contiguous()
        sin = sin.contiguous()
        B, S, H, D = x.shape
        half = D // 2
        out = torch.empty((B, S, H, D), device=x.device, dtype=x.dtype)
        rotary_kernel[(triton.cdiv(B * S * H, 32),)](x, cos, sin, out, S, H, half,
                                    x.stride(0), x.stride(1), x.stride(2),
                                    out.stride(0), out.stride(1), out.stride(2),
                                    cos.stride(0), sin.stride(0),
                                    N_ROWS=B * S * H, ROWS=32,
                                    BLOCK_HALF=triton.next_power_of_2(half), num_warps=4)
        return out
