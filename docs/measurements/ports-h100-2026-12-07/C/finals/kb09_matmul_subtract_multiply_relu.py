"""Naive port of KernelBench L2 #9: Linear -> (x - subtract_value) * multiply_value -> ReLU.
Triton GEMM (32x32x32 tiles, fp32 up-cast operands) writes y, then a separate Triton
elementwise kernel applies the tail (two launches, y round-trips through memory)."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def _device_core_count(device):
    """Programs for a persistent launch: one per SM (NVIDIA) or Xe-core (Intel); a few on the CPU interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "xpu":
        index = device.index if device.index is not None else torch.xpu.current_device()
        return triton.runtime.driver.active.utils.get_device_properties(index)["multiprocessor_count"]
    return 2


@triton.jit
def matmul_bias_kernel(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_wn, stride_wk, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    """C = A @ W^T + bias, W in nn.Linear layout [N, K]. Straight CUDA-style port: one C tile per
    program on a 2D grid, both operands up-cast to fp32 before the dot."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    offs_k = tl.arange(0, BLOCK_K)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    # persistent: program p handles tiles p, p + num_programs, p + 2 * num_programs, ...
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m = tile_id % num_pid_m
        pid_n = tile_id // num_pid_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if USE_BLOCK_IO:
            for k0 in range(0, K, BLOCK_K):
                k = k0 + offs_k
                a = a_desc.load([pid_m * BLOCK_M, k0])
                b = w_desc.load([pid_n * BLOCK_N, k0]).T
                acc += tl.dot(a, b)
        else:
            for k0 in range(0, K, BLOCK_K):
                k = k0 + offs_k
                a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                            mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)
                b = tl.load(w_ptr + k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                            mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
                acc += tl.dot(a, b)
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
        if USE_BLOCK_IO:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
        else:
            tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                     acc.to(c_ptr.dtype.element_ty),
                     mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def sub_mul_relu_kernel(y_ptr, out_ptr, n_elements, subtract_value, multiply_value,
                        BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (y - subtract_value) * multiply_value
    y = tl.maximum(y, 0.0)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features, subtract_value, multiply_value):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.subtract_value = subtract_value
        self.multiply_value = multiply_value

    def forward(self, x):
        M, K = x.shape
        N = self.linear.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = lambda META: (min(num_programs, triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N'])),)
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.linear.weight.data_ptr() % 16 == 0,
            self.linear.weight.stride(1) == 1,
            (self.linear.weight.stride(0) * self.linear.weight.element_size()) % 16 == 0,
            y.data_ptr() % 16 == 0,
            y.stride(1) == 1,
            (y.stride(0) * y.element_size()) % 16 == 0,
        ))
        if use_block_io and x.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=x.device: torch.empty(size, dtype=torch.int8, device=dev))
        num_programs = _device_core_count(self.linear.bias.device)
        if M <= 64:
            matmul_bias_kernel[grid](
                x, self.linear.weight, self.linear.bias, y, M, N, K,
                x.stride(0), x.stride(1), self.linear.weight.stride(0), self.linear.weight.stride(1),
                y.stride(0), y.stride(1),
                BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, num_warps=4, USE_BLOCK_IO=use_block_io, num_stages=5)
        else:
            matmul_bias_kernel[grid](
                x, self.linear.weight, self.linear.bias, y, M, N, K,
                x.stride(0), x.stride(1), self.linear.weight.stride(0), self.linear.weight.stride(1),
                y.stride(0), y.stride(1),
                BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, USE_BLOCK_IO=use_block_io, num_stages=3)
        out = torch.empty_like(y)
        n = y.numel()
        sub_mul_relu_kernel[(triton.cdiv(n, 1024),)](y, out, n, self.subtract_value, self.multiply_value,
                                                     BLOCK_SIZE=1024, num_warps=4)
        return out
