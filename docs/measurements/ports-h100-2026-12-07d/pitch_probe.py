"""Probe: at a row pitch off a 128-byte line (B and C rows 6000 B apart), do TMA descriptor loads of B cost more than
pointer loads (cp.async, 16-byte vectors)? One GEMM, A / B each through a descriptor or pointers, C through pointers,
at 3000 x 4096 x 3000 with B as given (pitch 3000) and padded (3072), and 3072^2 x 4096; do_bench medians, 3 repeats."""
import json, os
import torch, triton, triton.language as tl
from triton.testing import do_bench


@triton.jit
def mm(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
       G: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, PB: tl.constexpr):
    sbk = tl.multiple_of(sbk, PB)
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    per = G * npn
    first = (pid // per) * G
    gs = min(npm - first, G)
    pm = first + ((pid % per) % gs)
    pn = (pid % per) // gs
    om = pm * BM + tl.arange(0, BM)
    on = pn * BN + tl.arange(0, BN)
    ok = tl.arange(0, BK)
    if DA:
        ad = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM, BK])
    if DB:
        bd = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN])
    ap = a_ptr + om[:, None] * sam + ok[None, :]
    bp = b_ptr + ok[:, None] * sbk + on[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        if DA:
            a = ad.load([pm * BM, k * BK])
        else:
            a = tl.load(ap, mask=om[:, None] < M, other=0.0)
        if DB:
            b = bd.load([k * BK, pn * BN])
        else:
            b = tl.load(bp, mask=on[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
        ap += BK
        bp += BK * sbk
    tl.store(c_ptr + om[:, None] * scm + on[None, :], acc.to(tl.bfloat16), mask=(om[:, None] < M) & (on[None, :] < N))


triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
out = []
for (M, K, N, pitch) in [(3000, 4096, 3000, 3000), (3000, 4096, 3000, 3072), (3072, 4096, 3072, 3072)]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, pitch, device="cuda", dtype=torch.bfloat16)[:, :N]
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    row = {"shape": [M, K, N], "b_pitch": pitch, "cublas": do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")}
    pb = min(16, pitch & -pitch)
    for cfg in [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 4, 4)]:
        BM, BN, BK, w, s = cfg
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        for da, db in [(1, 1), (1, 0), (0, 0)]:
            key = f"{BM}x{BN}x{BK}w{w}s{s}_da{da}db{db}"
            try:
                f = lambda: mm[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), BM=BM, BN=BN, BK=BK, G=8,
                                     DA=da, DB=db, PB=pb, num_warps=w, num_stages=s)
                f(); torch.cuda.synchronize()
                err = float((c.float() - ref).abs().max() / ref.abs().max())
                row[key] = {"ms": sorted(do_bench(f, warmup=25, rep=100, return_mode="median") for _ in range(2)), "err": round(err, 5)}
            except Exception as exc:
                row[key] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(os.environ.get("OUT", ".") + "/pitch_probe.json", "w"), indent=1)
