#!/usr/bin/env bash
# FSDP2 with grad_reduction=tree on the device machine (one H200, 16 CPU cores, torch 2.11+cu130, no network):
# `ddp-lab bench fsdp2` at 2, 4 and 8 ranks on its CPU (FSDP2 ranks cannot share the one GPU over gloo), tree rows
# included, then chapter 14 under nbval with its committed verdicts. Wheels for nbval/Jupyter in .whl/ as
# h200_series.sh says. Writes $OUT/fsdp2_cpu16_tree/ and $OUT/nbval14/.
set -uo pipefail
cp .whl/COMMIT COMMIT 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/fsdp2_cpu16_tree
{ echo "commit: $(cat COMMIT)"; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/fsdp2_cpu16_tree/fsdp2_cpu16_tree.txt
timeout 420 python3 -m lab_utils bench fsdp2 --ranks 2,4,8 --steps 12 --json $OUT/fsdp2_cpu16_tree/fsdp2_cpu16_tree.json >> $OUT/fsdp2_cpu16_tree/fsdp2_cpu16_tree.txt 2>&1
echo "bench rc $?" >> $OUT/fsdp2_cpu16_tree/fsdp2_cpu16_tree.txt
mkdir -p $OUT/nbval14
LAB_RUNS_DIR=/tmp/nb14 timeout 150 python3 -m pytest --nbval-lax --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg notebooks/14_fsdp2.ipynb -q -p no:xdist > $OUT/nbval14/nbval_14_1gpu.txt 2>&1
echo "nbval rc $?" >> $OUT/nbval14/nbval_14_1gpu.txt
tail -30 $OUT/fsdp2_cpu16_tree/fsdp2_cpu16_tree.txt; tail -3 $OUT/nbval14/nbval_14_1gpu.txt
