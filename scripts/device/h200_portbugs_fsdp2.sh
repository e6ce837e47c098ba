#!/usr/bin/env bash
# FSDP2's port-bug suite (lab_utils/analysis/portbugs.FSDP2_SUITE) at GPT 4x256 x 150 steps, judged against float
# twins, on the device machine's 16-core CPU (FSDP2 ranks cannot share its one GPU over gloo): does each verdict
# hold where the noise has grown? Four launches at a time. Writes $OUT/portbugs_fsdp2_4x256/.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LAB_RUNS_DIR=/tmp/pb_runs
dir=$OUT/portbugs_fsdp2_4x256; mkdir -p "$dir"
{ echo "commit: $(cat .whl/COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; nproc
  python3 -c "import torch; print('torch', torch.__version__)"; } > "$dir/portbugs_fsdp2_4x256.txt"
timeout ${LIMIT:-560} python3 -m lab_utils bench portbugs --suite fsdp2 --size 4x256 --parallel ${PARALLEL:-4} \
  --json "$dir/portbugs_fsdp2_4x256.json" >> "$dir/portbugs_fsdp2_4x256.txt" 2>&1
echo "rc $?" >> "$dir/portbugs_fsdp2_4x256.txt"
tail -25 "$dir/portbugs_fsdp2_4x256.txt"
