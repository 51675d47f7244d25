"""Probe (issue 34's odd class): gemm_square's descriptor GEMM at 3000 x 4096 x 3000 with B's rows 6000 bytes apart
(and padded to 3072 as control), tile shapes 128x256 vs 256x128 (B's share of each tile's loads 2/3 vs 1/3),
num_ctas 1 vs 2 (Hopper clusters), grouped order; do_bench medians, two repeats. Also 4096^3 as a reference."""
import json, os, sys
import torch, triton, triton.language as tl


@triton.jit
def mm(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
       G: tl.constexpr):
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    per = G * npn
    first = (pid // per) * G
    gs = min(npm - first, G)
    pm = first + ((pid % per) % gs)
    pn = (pid % per) // gs
    ad = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN])
    cd = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM, BN // 2])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(ad.load([pm * BM, k * BK]), bd.load([k * BK, pn * BN]), acc)
    lo, hi = tl.split(tl.permute(tl.reshape(acc.to(tl.bfloat16), (BM, 2, BN // 2)), (0, 2, 1)))
    cd.store([pm * BM, pn * BN], lo)
    cd.store([pm * BM, pn * BN + BN // 2], hi)


def run(a, b, c, cfg):
    BM, BN, BK, w, s, ctas = cfg
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    mm[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), BM=BM, BN=BN, BK=BK, G=8,
             num_warps=w, num_stages=s, num_ctas=ctas)


CFGS = [(128, 256, 64, 8, 4, 1), (256, 128, 64, 8, 4, 1), (128, 256, 64, 8, 4, 2), (256, 128, 64, 8, 4, 2),
        (128, 128, 64, 4, 4, 2)]

if __name__ == "__main__":
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    if dev == "cpu":  # the interpreter: the kernel's values at a small odd shape (TRITON_INTERPRET=1)
        # fp32 operands: the interpreter's bf16 dot reads garbage (its numpy has no bf16); the GPU runs bf16
        a = torch.randn(100, 128); b = torch.randn(128, 104)[:, :96]
        c = torch.empty(100, 96, dtype=torch.bfloat16)
        run(a, b, c, (32, 64, 32, 4, 2, 1))
        print("max err", float((c.float() - a.float() @ b.float()).abs().max())); sys.exit(0)
    from triton.testing import do_bench
    out = []
    for (M, K, N, pitch) in [(3000, 4096, 3000, 3000), (3000, 4096, 3000, 3072), (4096, 4096, 4096, 4096)]:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(K, pitch, device=dev, dtype=torch.bfloat16)[:, :N]
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        row = {"shape": [M, K, N], "b_pitch": pitch,
               "cublas": do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")}
        for cfg in CFGS:
            key = "{}x{}x{}w{}s{}c{}".format(*cfg)
            try:
                run(a, b, c, cfg); torch.cuda.synchronize()
                err = float((c.float() - ref).abs().max() / ref.abs().max())
                row[key] = {"ms": sorted(do_bench(lambda: run(a, b, c, cfg), warmup=25, rep=100, return_mode="median")
                                         for _ in range(2)), "err": round(err, 5)}
            except Exception as exc:
                row[key] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        print(json.dumps(row), flush=True)
        out.append(row)
    json.dump(out, open(os.environ.get("OUT", ".") + "/square_probe.json", "w"), indent=1)
