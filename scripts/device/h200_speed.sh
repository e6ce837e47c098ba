#!/usr/bin/env bash
# After parity on one H200 (chapter 15, issue 36): `ddp-lab bench speed --preset workshop` (GPT 6 x 512, global
# batch 256, 25 steps, 5 warm-up, a synced record every 5 steps): one process on the GPU, then 2 ranks sharing it
# (backend auto picks gloo: the ranks do not each have a GPU). At each world size the eager fp32 run and its float
# twin, then tf32, fused AdamW (and at 2 ranks bucket_cap_mb=1, bucket_cap_mb=1024, overlap=none), the eager run
# again (its "speed-up" is the timing noise), compile, and at 1 process tf32+compile+fused (VARIANTS_2 overrides
# the 2-rank list): each one's ms/step, speed-up and tier against eager fp32. One world size at a time (timing
# needs the GPU to itself), each under its own time limit, each writing its JSON after every row, so a slow
# compile costs the rows after it, not the file. Writes $OUT/speed.txt (device, commit, tables, per-row progress),
# speed_1.json, speed_2.json, speed.json (both merged: what chapter 15 reads from docs/measured/h200/speed.json)
# and speed_runs.tgz (every run's metrics.jsonl, config.json, result.json: no weights). At most 170 + 230 s of
# benches (LIMIT_1, LIMIT_2), about 6.5 minutes in all.
# Run from the repository root (no venv there: python3 with PYTHONPATH=.).
set -uo pipefail
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 LAB_RUNS_DIR=/tmp/speed_runs
log="$OUT/speed.txt"
{ python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')"
  echo "commit $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"; } > "$log"
# A CPU dry run of this very script: PRESET=cpu STEPS=6 WARMUP=2 OUT=/tmp/x bash scripts/device/h200_speed.sh
B="python3 -m lab_utils bench speed --preset ${PRESET:-workshop} --steps ${STEPS:-25} --warmup ${WARMUP:-5}"
timeout ${LIMIT_1:-170} $B --ranks 1 --json "$OUT/speed_1.json" >> "$log" 2>&1; echo "rc ranks=1: $?" >> "$log"
timeout ${LIMIT_2:-230} $B --ranks 2 --variants ${VARIANTS_2:-tf32,fused,small_buckets,one_bucket,no_overlap,eager_again,compile} --json "$OUT/speed_2.json" >> "$log" 2>&1; echo "rc ranks=2: $?" >> "$log"
python3 - "$OUT" "$(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
parts = [json.loads(p.read_text()) for p in (out / "speed_1.json", out / "speed_2.json") if p.exists()]
if parts:
    meta = {**parts[0]["meta"], "commit": sys.argv[2], "machine": "one NVIDIA H200 (device machine), 2 ranks share it over gloo"}
    (out / "speed.json").write_text(json.dumps({"meta": meta, "rows": [r for p in parts for r in p["rows"]]}, indent=1))
PY
(cd "$LAB_RUNS_DIR" && find . \( -name metrics.jsonl -o -name config.json -o -name result.json \) -print0 \
   | tar czf "$OUT/speed_runs.tgz" --null -T -)
cat "$log"
