#!/usr/bin/env bash
# call W: the second row-sync probe (used slots only, plain-load spin, not flattened; with and without the
# cooperative launch), then three more of the suite's GEMM + epilogue problems ported (3 lanes) and benched at their three shapes
S=$(date +%s); END=${END:-560}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; git log --oneline -1; } > $OUT/gpu.txt 2>&1
timeout 120 python3 .gpucall/rowsync_probe2.py > $OUT/probe.txt 2>&1; echo "rowsync probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/probe.txt
LEFT=$(( END - 20 - ($(date +%s) - S) ))
LANES=3 BUDGET=3 TIME_BUDGET=${TB:-4} STOP_AFTER=1 RUNS_DIR=/tmp/xr timeout -s INT $LEFT bash scripts/h200-suite.sh /tmp/bo \
  kernels/kb94_gemm_biasadd_hardtanh_mish_groupnorm kernels/kb64_gemm_logsumexp_leakyrelu_leakyrelu_gelu_gelu \
  kernels/kb30_gemm_groupnorm_hardtanh > $OUT/log.txt 2>&1
echo "ports rc=$? limit $LEFT s, after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bo/bench.json /tmp/bo/bench.md $OUT/ 2>/dev/null
(cd /tmp/xr && tar czf $OUT/ports.tgz $(find . -name 'report.md' -o -name 'report.json' -o -path '*/final/kernel.py' | head -200)) 2>/dev/null
ls -la $OUT
