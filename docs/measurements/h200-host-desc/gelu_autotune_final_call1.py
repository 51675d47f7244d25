import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


def _device_core_count(device):
    """Programs for a persistent launch: one per SM (NVIDIA) or Xe-core (Intel); a few on the CPU interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "xpu":
        index = device.index if device.index is not None else torch.xpu.current_device()
        return triton.runtime.driver.active.utils.get_device_properties(index)["multiprocessor_count"]
    return 2


@triton.jit
def linear_bias_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                       residual_ptr, stride_residual_m, stride_residual_n,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_BLOCK_IO: tl.constexpr, x_desc, w_desc, residual_desc, out_desc):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    offs_k = tl.arange(0, BLOCK_K)
    # persistent: program p handles tiles p, p + num_programs, p + 2 * num_programs, ...
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m = tile_id % num_pid_m
        pid_n = tile_id // num_pid_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if USE_BLOCK_IO:
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + offs_k
                x = x_desc.load([pid_m * BLOCK_M, k0])
                w = w_desc.load([pid_n * BLOCK_N, k0]).T
                acc += tl.dot(x, w)
        else:
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + offs_k
                x = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk,
                            mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
                w = tl.load(w_ptr + kk[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                            mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)
                acc += tl.dot(x, w)
        # the epilogue on two [BLOCK_M, BLOCK_N // 2] column halves of acc: half the live registers after the K loop
        acc_halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc_lo, acc_hi = tl.split(acc_halves)
        offs_n_lo = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
        offs_n_hi = pid_n * BLOCK_N + (BLOCK_N // 2 + tl.arange(0, BLOCK_N // 2))
        bias = tl.load(b_ptr + offs_n_lo, mask=offs_n_lo < N, other=0.0).to(tl.float32)
        acc_lo = acc_lo + bias[None, :]
        # fused from Model.forward: gelu, add
        acc_lo = 0.5 * acc_lo * (1.0 + tl.erf(acc_lo * 0.7071067811865476))
        if USE_BLOCK_IO:
            residual = residual_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N]).to(tl.float32)
        else:
            residual = tl.load(residual_ptr + offs_m[:, None] * stride_residual_m + offs_n_lo[None, :] * stride_residual_n, mask=(offs_m[:, None] < M) & (offs_n_lo[None, :] < N), other=0.0).to(tl.float32)
        acc_lo = acc_lo + residual
        if USE_BLOCK_IO:
            out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc_lo.to(out_ptr.dtype.element_ty))
        else:
            tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n_lo[None, :] * stride_on, acc_lo.to(out_ptr.dtype.element_ty),
                     mask=(offs_m[:, None] < M) & (offs_n_lo[None, :] < N))
        bias = tl.load(b_ptr + offs_n_hi, mask=offs_n_hi < N, other=0.0).to(tl.float32)
        acc_hi = acc_hi + bias[None, :]
        # fused from Model.forward: gelu, add
        acc_hi = 0.5 * acc_hi * (1.0 + tl.erf(acc_hi * 0.7071067811865476))
        if USE_BLOCK_IO:
            residual = residual_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2]).to(tl.float32)
        else:
            residual = tl.load(residual_ptr + offs_m[:, None] * stride_residual_m + offs_n_hi[None, :] * stride_residual_n, mask=(offs_m[:, None] < M) & (offs_n_hi[None, :] < N), other=0.0).to(tl.float32)
        acc_hi = acc_hi + residual
        if USE_BLOCK_IO:
            out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], acc_hi.to(out_ptr.dtype.element_ty))
        else:
            tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n_hi[None, :] * stride_on, acc_hi.to(out_ptr.dtype.element_ty),
                     mask=(offs_m[:, None] < M) & (offs_n_hi[None, :] < N))


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features)

    def forward(self, x, residual):
        M, K = x.shape
        N = self.proj.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        num_programs = _device_core_count(residual.device)
        grid = lambda META: (min(num_programs, triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N'])),)
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.proj.weight.data_ptr() % 16 == 0,
            self.proj.weight.stride(1) == 1,
            (self.proj.weight.stride(0) * self.proj.weight.element_size()) % 16 == 0,
            residual.data_ptr() % 16 == 0,
            residual.stride(1) == 1,
            (residual.stride(0) * residual.element_size()) % 16 == 0,
            y.data_ptr() % 16 == 0,
            y.stride(1) == 1,
            (y.stride(0) * y.element_size()) % 16 == 0,
        ))
        # tensor descriptors built on the host and passed in (no device-side descriptor creation)
        host_descriptors = bool(use_block_io) and min(M, K, N) > 0
        x_desc = TensorDescriptor(x, [M, K], [x.stride(0), 1], [128, 64]) if host_descriptors else None
        w_desc = TensorDescriptor(self.proj.weight, [N, K], [self.proj.weight.stride(0), 1], [256, 64]) if host_descriptors else None
        residual_desc = TensorDescriptor(residual, [M, N], [residual.stride(0), 1], [128, 256 // 2]) if host_descriptors else None
        out_desc = TensorDescriptor(y, [M, N], [y.stride(0), 1], [128, 256 // 2]) if host_descriptors else None
        linear_bias_kernel[grid](
            x, self.proj.weight, self.proj.bias, y, M, N, K,
            x.stride(0), x.stride(1), self.proj.weight.stride(0), self.proj.weight.stride(1),
            y.stride(0), y.stride(1), residual_ptr=residual, stride_residual_m=residual.stride(0), stride_residual_n=residual.stride(1), BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, USE_BLOCK_IO=host_descriptors, x_desc=x_desc, w_desc=w_desc, residual_desc=residual_desc, out_desc=out_desc)
        return y
