#!/usr/bin/env bash
# Chapter 09, section 4 (the hardware behind NCCL's `via P2P` / `via SHM`): what the committed H200 NCCL logs
# came without. Captures `nvidia-smi topo -m` (how each GPU pair is linked) and `nvidia-smi -L` (index -> name,
# UUID), then, on a box with >= 2 GPUs, one 2-rank NCCL run with CUDA_VISIBLE_DEVICES listing the GPUs in
# reverse, so that LOCAL_RANK 0 drives the last physical GPU: its NCCL_DEBUG=INFO Init lines (rank, cudaDev,
# busId) show that mapping. Writes $OUT/ch09_topo.txt and $OUT/ch09_cvd_nccl.log. Under 1 minute (one 4-step run).
#   OUT=/tmp/out bash scripts/device/h200_ch09_topo.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
OUT=${OUT:-/tmp/h200_ch09_topo_out}
mkdir -p "$OUT"
{
  echo "\$ nvidia-smi topo -m"; nvidia-smi topo -m
  echo; echo "\$ nvidia-smi -L"; nvidia-smi -L
  echo; echo "\$ nvidia-smi --query-gpu=index,pci.bus_id --format=csv"; nvidia-smi --query-gpu=index,pci.bus_id --format=csv
} > "$OUT/ch09_topo.txt" 2>&1
n=$(nvidia-smi -L | wc -l)
if [ "$n" -ge 2 ]; then
  reversed=$(seq $((n - 1)) -1 $((n - 2)) | paste -sd, -)
  echo "CUDA_VISIBLE_DEVICES=$reversed" >> "$OUT/ch09_topo.txt"
  runs=$(mktemp -d)
  CUDA_VISIBLE_DEVICES=$reversed NCCL_DEBUG=INFO LAB_RUNS_DIR=$runs python3 -m lab_utils run \
    --name ch09_cvd --nproc 2 --timeout 200 steps=4 backend=nccl >> "$OUT/ch09_topo.txt" 2>&1
  echo "run exit code $?" >> "$OUT/ch09_topo.txt"
  cp "$runs/ch09_cvd/output.log" "$OUT/ch09_cvd_nccl.log"
  grep -E "Init COMPLETE" "$OUT/ch09_cvd_nccl.log" >> "$OUT/ch09_topo.txt"
fi
cat "$OUT/ch09_topo.txt"
