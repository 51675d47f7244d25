"""Write the ablation's edited kernels next to this file: each is one of the port's own kernels with one change.

relu_tma_128x256.py (the port's block_io trial) gives, one change each on top of the last:
  relu_tma_128x256_inplace.py            ``acc = tl.dot(a, w, acc)`` for ``acc += tl.dot(a, w)``
  relu_tma_128x256_inplace_noepi.py      no bias add, no ReLU
  relu_tma_128x256_inplace_noepi_ns4.py  num_stages 4
and from the no-epilogue kernel: relu_abl_loop.py (``range(0, tl.cdiv(K, BK))``), relu_abl_grid1d.py (a 1D grid, the
same tile order), relu_abl_loop_grid1d.py (both). gelu_final.py gives gelu_final_inplace.py (in-place accumulate).
Usage: python3 variants.py (before time_cands.py / data_vs_host.py).
"""
from pathlib import Path

HERE = Path(__file__).resolve().parent


def edit(text: str, old: str, new: str) -> str:
    assert old in text, f"not in the kernel: {old!r}"
    return text.replace(old, new)


def grid1d(text: str) -> str:
    text = edit(text, "pm = tl.program_id(0)\n    pn = tl.program_id(1)",
                "pid = tl.program_id(0)\n    pm = pid % tl.cdiv(M, BM)\n    pn = pid // tl.cdiv(M, BM)")
    return edit(text, "fc_relu[(triton.cdiv(M, 128), triton.cdiv(N, 256))]",
                "fc_relu[(triton.cdiv(M, 128) * triton.cdiv(N, 256),)]")


def main() -> None:
    tma = (HERE / "relu_tma_128x256.py").read_text()
    inplace = edit(tma, "acc += tl.dot(a, w)", "acc = tl.dot(a, w, acc)")
    noepi = "".join(line for line in inplace.splitlines(keepends=True)
                    if "acc += tl.load(b_ptr + rn" not in line and "acc = tl.maximum(acc, 0.0)" not in line)
    loop = edit(noepi, "for k in range(0, K, BK):\n            a = x_desc.load([pm * BM, k])\n"
                       "            w = w_desc.load([pn * BN, k]).T",
                "for k in range(0, tl.cdiv(K, BK)):\n            a = x_desc.load([pm * BM, k * BK])\n"
                "            w = w_desc.load([pn * BN, k * BK]).T")
    out = {"relu_tma_128x256_inplace.py": inplace, "relu_tma_128x256_inplace_noepi.py": noepi,
           "relu_tma_128x256_inplace_noepi_ns4.py": noepi.replace("num_stages=3", "num_stages=4"),
           "relu_abl_loop.py": loop, "relu_abl_grid1d.py": grid1d(noepi), "relu_abl_loop_grid1d.py": grid1d(loop),
           "gelu_final_inplace.py": edit((HERE / "gelu_final.py").read_text(), "acc += tl.dot(x, w)",
                                         "acc = tl.dot(x, w, acc)")}
    for name, text in out.items():
        (HERE / name).write_text(text)
        print(name)


if __name__ == "__main__":
    main()
