"""NVIDIA-tuned port: C = A @ B with a long reduction dim (M=N=1024, K=65536). Block pointers
(tl.make_block_ptr / tl.advance with boundary_check), 128x128x32 tiles on a 2D grid, num_warps=8,
num_stages=3. Only (M/128)*(N/128)=64 programs, each walking all of K: no split-K."""
import torch
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
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    # persistent: program p handles tiles p, p + num_programs, p + 2 * num_programs, ...
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m = tile_id % num_pid_m
        pid_n = tile_id // num_pid_m
        a_block = tl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                    offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
        b_block = tl.make_block_ptr(base=b_ptr, shape=(K, N), strides=(stride_bk, stride_bn),
                                    offsets=(0, pid_n * BLOCK_N), block_shape=(BLOCK_K, BLOCK_N), order=(1, 0))
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if USE_BLOCK_IO:
            for _ in range(0, tl.cdiv(K, BLOCK_K)):
                a = a_desc.load([pid_m * BLOCK_M, _ * BLOCK_K])
                b = b_desc.load([_ * BLOCK_K, pid_n * BLOCK_N])
                acc = tl.dot(a, b, acc)
        else:
            for _ in range(0, tl.cdiv(K, BLOCK_K)):
                a = tl.load(a_block, boundary_check=(0, 1), padding_option="zero")
                b = tl.load(b_block, boundary_check=(0, 1), padding_option="zero")
                acc = tl.dot(a, b, acc)
                a_block = tl.advance(a_block, (0, BLOCK_K))
                b_block = tl.advance(b_block, (BLOCK_K, 0))
        c_block = tl.make_block_ptr(base=c_ptr, shape=(M, N), strides=(stride_cm, stride_cn),
                                    offsets=(pid_m * BLOCK_M, pid_n * BLOCK_N), block_shape=(BLOCK_M, BLOCK_N),
                                    order=(1, 0))
        if USE_BLOCK_IO:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
        else:
            tl.store(c_block, acc.to(c_ptr.dtype.element_ty), boundary_check=(0, 1))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        num_programs = _device_core_count(a.device)
        grid = lambda META: (min(num_programs, triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N'])),)
        use_block_io = all((
            a.data_ptr() % 16 == 0,
            a.stride(1) == 1,
            (a.stride(0) * a.element_size()) % 16 == 0,
            b.data_ptr() % 16 == 0,
            b.stride(1) == 1,
            (b.stride(0) * b.element_size()) % 16 == 0,
            c.data_ptr() % 16 == 0,
            c.stride(1) == 1,
            (c.stride(0) * c.element_size()) % 16 == 0,
        ))
        if use_block_io and a.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=a.device: torch.empty(size, dtype=torch.int8, device=dev))
        matmul_kernel[grid](a, b, c, M, N, K,
                            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                            BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4, USE_BLOCK_IO=use_block_io)
        return c
