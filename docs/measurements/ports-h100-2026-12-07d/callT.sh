#!/usr/bin/env bash
# call T: probes (cuBLAS kernel names; tall_k pitch; descriptor vs pointer loads at a 6000-byte pitch), then kb41 and
# centred ported (2 lanes) and benched; ends by END seconds after it starts
S=$(date +%s); END=${END:-480}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; git log --oneline -1; } > $OUT/gpu.txt 2>&1
timeout 25 python3 docs/measurements/ports-h100-2026-12-07d/names_probe.py > $OUT/probe.txt 2>&1; echo "names probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/probe.txt
timeout 50 python3 docs/measurements/ports-h100-2026-12-07d/tallk_probe.py >> $OUT/probe.txt 2>&1; echo "tallk probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/probe.txt
timeout 60 python3 docs/measurements/ports-h100-2026-12-07d/pitch_probe.py >> $OUT/probe.txt 2>&1; echo "pitch probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/probe.txt
python3 scripts/epilogue_problems.py /tmp/ep centred > /tmp/dirs.txt
LEFT=$(( END - 15 - ($(date +%s) - S) ))
LANES=2 BUDGET=3 TIME_BUDGET=${TB:-4} STOP_AFTER=1 RUNS_DIR=/tmp/xr timeout -s INT $LEFT bash scripts/h200-suite.sh /tmp/bo \
  kernels/kb41_gemm_batchnorm_gelu_relu $(grep -- -wrapper /tmp/dirs.txt) > $OUT/log.txt 2>&1
echo "ports rc=$? limit $LEFT s, after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bo/bench.json /tmp/bo/bench.md $OUT/ 2>/dev/null
(cd /tmp/xr && tar czf $OUT/ports.tgz $(find . -name 'report.md' -o -name 'report.json' -o -path '*/final/kernel.py' | head -200)) 2>/dev/null
ls -la $OUT
