#!/usr/bin/env bash
# Bugs that start late, on one H200 (the device machine: torch 2.11+cu130): `ddp-lab bench late --size workshop`
# in fp32 and bf16 at once (2 gloo ranks share the GPU; backend auto picks gloo). Writes $OUT/late_none.txt,
# $OUT/late_bf16.txt (the tables) and their --json rows. docs/measured/h200/late_windows/ keeps what came back.
set -uo pipefail
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/late_none.txt" "$OUT/late_bf16.txt"
for amp in none bf16; do
  LAB_RUNS_DIR=/tmp/late_$amp python3 -m lab_utils bench late --size workshop --amp $amp \
    --json "$OUT/late_$amp.json" >> "$OUT/late_$amp.txt" 2>&1 &
done
wait
tail -n 8 "$OUT"/late_*.txt
