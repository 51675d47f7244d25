"""Naive port of KernelBench L2 #97: Linear -> BatchNorm1d (inference form) -> + bias (scalar)
-> / divide_value -> Swish. Triton GEMM writes fp32 y, BatchNorm runs as a torch op, then a
separate Triton elementwise kernel does bias, divide, swish."""
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
                       bn_eps, bn_running_var_ptr, bn_weight_ptr, bn_running_mean_ptr, bn_bias_ptr,
                       bias_ptr_1, divide_value,
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
        # fused from Model.forward: batch_norm
        bn_running_var = tl.load(bn_running_var_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        bn_weight = tl.load(bn_weight_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        bn_scale = bn_weight / tl.sqrt(bn_running_var + bn_eps)
        bn_running_mean = tl.load(bn_running_mean_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        bn_bias = tl.load(bn_bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        bn_shift = bn_bias - bn_running_mean * bn_scale
        acc = acc * bn_scale + bn_shift
        # fused from bias_div_swish_kernel: its elementwise body runs on this tile before the one store
        b_1 = tl.load(bias_ptr_1).to(tl.float32)
        y = acc.to(tl.float32)
        y = (y + b_1) / divide_value
        y = y * tl.sigmoid(y)
        if USE_BLOCK_IO:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], y.to(c_ptr.dtype.element_ty))
        else:
            tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                     y.to(c_ptr.dtype.element_ty),
                     mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features, bn_eps=1e-5, bn_momentum=0.1, divide_value=1.0):
        super().__init__()
        self.matmul = torch.nn.Linear(in_features, out_features)
        self.bn = torch.nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum)
        self.bias = torch.nn.Parameter(torch.randn(1))
        self.divide_value = divide_value
        with torch.no_grad():  # inference-form BatchNorm with non-trivial running stats
            self.bn.running_mean.copy_(torch.linspace(-0.5, 0.5, out_features))
            self.bn.running_var.copy_(torch.linspace(0.5, 2.0, out_features))
            self.bn.weight.copy_(torch.linspace(0.75, 1.25, out_features))
            self.bn.bias.copy_(torch.linspace(-0.1, 0.1, out_features))

    def forward(self, x):
        M, K = x.shape
        N = self.matmul.weight.shape[0]
        grid = lambda META: (min(num_programs, triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N'])),)
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.matmul.weight.data_ptr() % 16 == 0,
            self.matmul.weight.stride(1) == 1,
            (self.matmul.weight.stride(0) * self.matmul.weight.element_size()) % 16 == 0,
            out.data_ptr() % 16 == 0,
            out.stride(1) == 1,
            (out.stride(0) * out.element_size()) % 16 == 0,
        ))
        if use_block_io and x.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=x.device: torch.empty(size, dtype=torch.int8, device=dev))
        num_programs = _device_core_count(self.matmul.bias.device)
        if M <= 64:
            matmul_bias_kernel[grid](
                x, self.matmul.weight, self.matmul.bias, out, M, N, K,
                x.stride(0), x.stride(1), self.matmul.weight.stride(0), self.matmul.weight.stride(1),
                out.stride(0), out.stride(1),
                bias_ptr_1=self.bias, divide_value=self.divide_value,
                bn_eps=self.bn.eps, bn_running_var_ptr=self.bn.running_var,
                bn_weight_ptr=self.bn.weight, bn_running_mean_ptr=self.bn.running_mean,
                bn_bias_ptr=self.bn.bias,
                BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4, USE_BLOCK_IO=use_block_io)
        else:
            matmul_bias_kernel[grid](
                x, self.matmul.weight, self.matmul.bias, out, M, N, K,
                x.stride(0), x.stride(1), self.matmul.weight.stride(0), self.matmul.weight.stride(1),
                out.stride(0), out.stride(1),
                bias_ptr_1=self.bias, divide_value=self.divide_value,
                bn_eps=self.bn.eps, bn_running_var_ptr=self.bn.running_var,
                bn_weight_ptr=self.bn.weight, bn_running_mean_ptr=self.bn.running_mean,
                bn_bias_ptr=self.bn.bias,
                BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, USE_BLOCK_IO=use_block_io)
        return out
