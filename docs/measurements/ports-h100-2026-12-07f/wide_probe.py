"""Probe (issue 34's odd class, wave quantisation): tiles whose side is not a power of two (192 = 128 + 64), written
as two or four power-of-two dots sharing an operand tile, against the port's 128 x 256 tile. gemm_square's GEMM at
3000 x 4096 x 3000 (B as given, rows 6000 B apart), 3072 x 4096 x 3072 and 4096^3, bf16, descriptors; grouped
order, one program a tile. do_bench medians, two repeats; cuBLAS in the same run. Tiles a round: 132 cores."""
import json, os, sys
import torch, triton, triton.language as tl


@triton.jit
def _order(M, N, TM: tl.constexpr, TN: tl.constexpr, G: tl.constexpr):
    pid = tl.program_id(0)
    npm = tl.cdiv(M, TM)
    npn = tl.cdiv(N, TN)
    per = G * npn
    first = (pid // per) * G
    gs = min(npm - first, G)
    return first + ((pid % per) % gs), (pid % per) // gs


@triton.jit
def mm(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
       G: tl.constexpr):
    pm, pn = _order(M, N, BM, BN, G)
    ad = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN])
    cd = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM, BN // 2])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(ad.load([pm * BM, k * BK]), bd.load([k * BK, pn * BN]), acc)
    lo, hi = tl.split(tl.permute(tl.reshape(acc.to(c_ptr.dtype.element_ty), (BM, 2, BN // 2)), (0, 2, 1)))
    cd.store([pm * BM, pn * BN], lo)
    cd.store([pm * BM, pn * BN + BN // 2], hi)


@triton.jit
def mm_n2(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm, BM: tl.constexpr, BN0: tl.constexpr, BN1: tl.constexpr,
          BK: tl.constexpr, G: tl.constexpr):
    """A BM x (BN0 + BN1) tile: two dots share A's tile."""
    pm, pn = _order(M, N, BM, BN0 + BN1, G)
    n0 = pn * (BN0 + BN1)
    ad = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM, BK])
    bd0 = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN0])
    bd1 = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN1])
    cd0 = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM, BN0])
    cd1 = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM, BN1])
    acc0 = tl.zeros((BM, BN0), dtype=tl.float32)
    acc1 = tl.zeros((BM, BN1), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = ad.load([pm * BM, k * BK])
        acc0 = tl.dot(a, bd0.load([k * BK, n0]), acc0)
        acc1 = tl.dot(a, bd1.load([k * BK, n0 + BN0]), acc1)
    cd0.store([pm * BM, n0], acc0.to(c_ptr.dtype.element_ty))
    cd1.store([pm * BM, n0 + BN0], acc1.to(c_ptr.dtype.element_ty))


@triton.jit
def mm_m2(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm, BM0: tl.constexpr, BM1: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, G: tl.constexpr):
    """A (BM0 + BM1) x BN tile: two dots share B's tile."""
    pm, pn = _order(M, N, BM0 + BM1, BN, G)
    m0 = pm * (BM0 + BM1)
    ad0 = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM0, BK])
    ad1 = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM1, BK])
    bd = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN])
    cd0 = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM0, BN])
    cd1 = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM1, BN])
    acc0 = tl.zeros((BM0, BN), dtype=tl.float32)
    acc1 = tl.zeros((BM1, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        b = bd.load([k * BK, pn * BN])
        acc0 = tl.dot(ad0.load([m0, k * BK]), b, acc0)
        acc1 = tl.dot(ad1.load([m0 + BM0, k * BK]), b, acc1)
    cd0.store([m0, pn * BN], acc0.to(c_ptr.dtype.element_ty))
    cd1.store([m0 + BM0, pn * BN], acc1.to(c_ptr.dtype.element_ty))


@triton.jit
def mm_22(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm, BM0: tl.constexpr, BM1: tl.constexpr, BN0: tl.constexpr,
          BN1: tl.constexpr, BK: tl.constexpr, G: tl.constexpr):
    """A (BM0 + BM1) x (BN0 + BN1) tile: four dots."""
    pm, pn = _order(M, N, BM0 + BM1, BN0 + BN1, G)
    m0 = pm * (BM0 + BM1)
    n0 = pn * (BN0 + BN1)
    ad0 = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM0, BK])
    ad1 = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM1, BK])
    bd0 = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN0])
    bd1 = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN1])
    acc00 = tl.zeros((BM0, BN0), dtype=tl.float32)
    acc01 = tl.zeros((BM0, BN1), dtype=tl.float32)
    acc10 = tl.zeros((BM1, BN0), dtype=tl.float32)
    acc11 = tl.zeros((BM1, BN1), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a0 = ad0.load([m0, k * BK])
        a1 = ad1.load([m0 + BM0, k * BK])
        b0 = bd0.load([k * BK, n0])
        b1 = bd1.load([k * BK, n0 + BN0])
        acc00 = tl.dot(a0, b0, acc00)
        acc01 = tl.dot(a0, b1, acc01)
        acc10 = tl.dot(a1, b0, acc10)
        acc11 = tl.dot(a1, b1, acc11)
    ty = c_ptr.dtype.element_ty
    tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM0, BN0]).store([m0, n0], acc00.to(ty))
    tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM0, BN1]).store([m0, n0 + BN0], acc01.to(ty))
    tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM1, BN0]).store([m0 + BM0, n0], acc10.to(ty))
    tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM1, BN1]).store([m0 + BM0, n0 + BN0], acc11.to(ty))


def run(a, b, c, cfg):
    """cfg: (kind, tile dims..., BK, warps, stages)."""
    kind, dims, BK, w, s = cfg
    M, K = a.shape
    N = b.shape[1]
    args = (a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    if kind == "mm":
        BM, BN = dims
        mm[(triton.cdiv(M, BM) * triton.cdiv(N, BN),)](*args, BM=BM, BN=BN, BK=BK, G=8, num_warps=w, num_stages=s)
    elif kind == "n2":
        BM, BN0, BN1 = dims
        mm_n2[(triton.cdiv(M, BM) * triton.cdiv(N, BN0 + BN1),)](*args, BM=BM, BN0=BN0, BN1=BN1, BK=BK, G=8,
                                                                 num_warps=w, num_stages=s)
    elif kind == "m2":
        BM0, BM1, BN = dims
        mm_m2[(triton.cdiv(M, BM0 + BM1) * triton.cdiv(N, BN),)](*args, BM0=BM0, BM1=BM1, BN=BN, BK=BK, G=8,
                                                                 num_warps=w, num_stages=s)
    else:
        BM0, BM1, BN0, BN1 = dims
        mm_22[(triton.cdiv(M, BM0 + BM1) * triton.cdiv(N, BN0 + BN1),)](*args, BM0=BM0, BM1=BM1, BN0=BN0, BN1=BN1,
                                                                        BK=BK, G=8, num_warps=w, num_stages=s)


CFGS = [("mm", (128, 256), 64, 8, 4), ("n2", (128, 128, 64), 64, 8, 4), ("n2", (128, 128, 64), 64, 8, 3),
        ("m2", (128, 64, 128), 64, 8, 4), ("m2", (128, 64, 256), 64, 8, 3), ("22", (128, 64, 128, 64), 64, 8, 3),
        ("22", (128, 64, 128, 64), 64, 12, 3), ("mm", (128, 128), 64, 8, 4)]

if __name__ == "__main__":
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    if dev == "cpu":  # the interpreter: every kernel's values at a small odd shape (TRITON_INTERPRET=1), fp32
        a = torch.randn(100, 128); b = torch.randn(128, 104)[:, :100]
        for kind, dims in [("mm", (32, 64)), ("n2", (32, 32, 16)), ("m2", (32, 16, 32)), ("22", (32, 16, 32, 16))]:
            c = torch.zeros(100, 100)
            run(a, b, c, (kind, dims, 32, 4, 2))
            print(kind, "max err", float((c - a @ b).abs().max()))
        sys.exit(0)
    from triton.testing import do_bench
    out = []
    for (M, K, N) in [(3000, 4096, 3000), (3072, 4096, 3072), (4096, 4096, 4096)]:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        row = {"shape": [M, K, N], "cublas": do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")}
        for cfg in CFGS:
            key = "{}:{}:k{}w{}s{}".format(cfg[0], "x".join(map(str, cfg[1])), *cfg[2:])
            try:
                c.zero_(); run(a, b, c, cfg); torch.cuda.synchronize()
                err = float((c.float() - ref).abs().max() / ref.abs().max())
                row[key] = {"ms": sorted(do_bench(lambda: run(a, b, c, cfg), warmup=25, rep=100, return_mode="median")
                                         for _ in range(2)), "err": round(err, 5)}
            except Exception as exc:
                row[key] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        print(json.dumps(row), flush=True)
        out.append(row)
    json.dump(out, open(os.environ.get("OUT", ".") + "/wide_probe.json", "w"), indent=1)
