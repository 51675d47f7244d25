#!/usr/bin/env bash
# call P: the pitch/tail probe alone
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; } > $OUT/gpu.txt 2>&1
S=$(date +%s)
timeout ${LIMIT:-150} python3 .gpucall/tail_probe2.py > $OUT/probe.txt 2>&1; echo "probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/probe.txt
