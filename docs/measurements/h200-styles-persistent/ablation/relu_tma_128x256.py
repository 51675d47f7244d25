import torch
import triton
import triton.language as tl


@triton.jit
def fc_relu(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swn, swk, sym, syn,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[sxm, 1], block_shape=[BM, BK])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[swn, 1], block_shape=[BN, BK])
        y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[sym, 1], block_shape=[BM, BN])
    if USE_BLOCK_IO:
        for k in range(0, K, BK):
            a = x_desc.load([pm * BM, k])
            w = w_desc.load([pn * BN, k]).T
            acc += tl.dot(a, w)
    else:
        for k in range(0, K, BK):
            a = tl.load(x_ptr + rm[:, None] * sxm + (k + rk)[None, :] * sxk,
                        mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
            w = tl.load(w_ptr + (k + rk)[:, None] * swk + rn[None, :] * swn,
                        mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, w)
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    acc = tl.maximum(acc, 0.0)
    if USE_BLOCK_IO:
        y_desc.store([pm * BM, pn * BN], acc.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        M, K = x.shape
        N = self.fc.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.fc.weight.data_ptr() % 16 == 0,
            self.fc.weight.stride(1) == 1,
            (self.fc.weight.stride(0) * self.fc.weight.element_size()) % 16 == 0,
            y.data_ptr() % 16 == 0,
            y.stride(1) == 1,
            (y.stride(0) * y.element_size()) % 16 == 0,
        ))
        if use_block_io and x.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=x.device: torch.empty(size, dtype=torch.int8, device=dev))
        fc_relu[(triton.cdiv(M, 128), triton.cdiv(N, 256))](
            x, self.fc.weight, self.fc.bias, y, M, N, K, x.stride(0), x.stride(1),
            self.fc.weight.stride(0), self.fc.weight.stride(1), y.stride(0), y.stride(1),
            BM=128, BN=256, BK=64, num_warps=8, num_stages=3, USE_BLOCK_IO=use_block_io)
        return y
