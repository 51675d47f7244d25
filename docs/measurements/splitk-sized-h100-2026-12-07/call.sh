#!/usr/bin/env bash
# One device call (repo root): bench one problem's sized split kernel at every timed shape.
# usage: P=kernels/gemm_tall_k LIMIT=150 bash docs/measurements/splitk-sized-h100-2026-12-07/call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; } > $OUT/gpu.txt 2>&1
rm -rf /tmp/bs; S=$(date +%s)
timeout -s INT ${LIMIT:-200} python3 -m xeforge bench ${P:-kernels/gemm_tall_k} --device cuda \
  --final "$PWD/docs/measurements/splitk-sized-h100-2026-12-07/kernels/{problem}-sized.py" --out /tmp/bs > $OUT/log-sized.txt 2>&1
echo "sized rc=$? after $(( $(date +%s) - S )) s" >> $OUT/log-sized.txt
cp /tmp/bs/bench.json $OUT/sized-bench.json; cp /tmp/bs/bench.md $OUT/sized-bench.md
