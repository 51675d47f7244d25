#!/usr/bin/env bash
# call X: the second row-sync probe, the probe of tiles 192 wide (two dots), then the latest port result of each of issue 34's suite GEMMs (H100 ports) and
# of issue 33's epilogue graphs benched (no port) on this card at every timed shape; ends by END s
S=$(date +%s); END=${END:-570}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; git log --oneline -1; } > $OUT/gpu.txt 2>&1
timeout 110 python3 .gpucall/rowsync_probe2.py > $OUT/probe.txt 2>&1; echo "rowsync probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/probe.txt
timeout 90 python3 .gpucall/wide_probe.py > $OUT/wide.txt 2>&1; echo "wide probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/wide.txt
python3 scripts/epilogue_problems.py /tmp/ep centred scaled-then-centred softmax-numerator several-outputs decomposed-ops the-input-as-residual > /tmp/dirs.txt
LEFT=$(( END - 15 - ($(date +%s) - S) ))
timeout -s INT $LEFT python3 -m xeforge bench kernels/gemm_square kernels/gemm_tall_k kernels/gemv_decode kernels/gemm_skinny_m \
  kernels/gemm_relu kernels/kb09_* kernels/kb22_* kernels/kb41_* $(grep -- -wrapper /tmp/dirs.txt) \
  --device cuda --final "$PWD/.gpucall/finals2/{problem}.py" --out /tmp/bx > $OUT/log.txt 2>&1
echo "bench rc=$? limit $LEFT s, after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bx/bench.json /tmp/bx/bench.md $OUT/ 2>/dev/null
ls -la $OUT
