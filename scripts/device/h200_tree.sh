#!/usr/bin/env bash
# grad_reduction=tree on one H200 (chapter 13, issue 26): 1 process on CUDA against 2 and 4 ranks sharing the GPU
# (backend auto picks gloo: the ranks do not each have a GPU), GPT (4 x 256, keyed dropout 0.1) and bn_net, 20
# steps, C = 32 / 4 = 8 chunks; plus a 4-rank checkpoint at step 10 resumed at 2 ranks, 4 ranks with
# tree_comm=halving (its point-to-point rounds go through host memory under gloo), and the plain single run
# (one micro-batch of 32, no chunks) that is another float order. Writes $OUT/tree_h200.txt (every run's device
# and backend, then each `ddp-lab compare`). About 2.5 minutes: 10 launches in two parallel streams, ~12 s start-up
# each on this box. Run from the repository root (no venv there: python3 with PYTHONPATH=.).
set -uo pipefail
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 LAB_RUNS_DIR=/tmp/tree_runs
L="python3 -m lab_utils"
T="grad_reduction=tree sampler=global global_batch_size=32 micro_batch_size=4 dropout=0.1 steps=20"
G="$T n_layer=4 n_embd=256 n_head=4"
B="$T model=bn_net"
log="$OUT/tree_h200.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))" | tee "$log"
(
  $L run --name gpt_tree1 --nproc 1 $G
  $L run --name gpt_tree2 --nproc 2 $G
  $L run --name gpt_tree4 --nproc 4 $G checkpoint_every=10
  $L run --name gpt_4to2 --nproc 2 $G resume=$LAB_RUNS_DIR/gpt_tree4/checkpoints/step_000010.pt
  $L run --name gpt_halv4 --nproc 4 $G tree_comm=halving
) > "$OUT/launch_gpt.log" 2>&1 &
(
  $L run --name bn_tree1 --nproc 1 $B
  $L run --name bn_tree2 --nproc 2 $B
  $L run --name bn_tree4 --nproc 4 $B
  $L run --name gpt_plain --nproc 1 sampler=global global_batch_size=32 dropout=0.1 steps=20 n_layer=4 n_embd=256 n_head=4
  $L run --name gpt_stock4 --nproc 4 sampler=global global_batch_size=32 micro_batch_size=4 dropout=0.1 steps=20 n_layer=4 n_embd=256 n_head=4
) > "$OUT/launch_bn.log" 2>&1 &
wait
python3 - "$LAB_RUNS_DIR" >> "$log" <<'PY'
import json, pathlib, sys
for run in sorted(pathlib.Path(sys.argv[1]).iterdir()):
    cfg = run / "config.json"
    if cfg.exists():
        c = json.loads(cfg.read_text())
        print(f"{run.name:12} world_size={c['world_size']} backend={c['backend']} device={c['device']}")
    else:
        print(f"{run.name:12} NO config.json (failed: see launch_*.log)")
PY
rc=0
for pair in "gpt_tree1 gpt_tree2" "gpt_tree1 gpt_tree4" "gpt_tree2 gpt_tree4" "gpt_tree1 gpt_4to2" "gpt_tree1 gpt_halv4" \
            "bn_tree1 bn_tree2" "bn_tree1 bn_tree4" "gpt_tree1 gpt_plain" "gpt_tree1 gpt_stock4"; do
  set -- $pair
  echo "=== $1 vs $2" >> "$log"
  $L compare "$LAB_RUNS_DIR/$1" "$LAB_RUNS_DIR/$2" 2>&1 | head -12 >> "$log" || rc=1
done
cat "$log"
exit $rc
