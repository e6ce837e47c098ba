#!/usr/bin/env bash
# Chapter 09's 2-node runs on the GPU box (issues 23 and 24, point 3). On one GPU the chapter used to ask
# backend=auto for its two simulated nodes, which the launcher refuses (NCCL needs a GPU per rank); it now takes
# ch09_launching.backend_here, gloo where the ranks would share a GPU. This runs, with device=auto (CUDA):
#   1. the old request (backend=auto, nnodes=2): expected "refused" on one GPU, "ok" with two;
#   2. the standalone 2-rank run with the chosen backend;
#   3. ch09_launching.two_hosts: the 2-node run (on two network namespaces if this box makes them, else
#      simulated), GLOO_SOCKET_IFNAME=mgmt (namespaces only) and a wrong rendezvous address, with their
#      status, seconds, named rank/node and messages, the tier of the 2-node run against the standalone one
#      (or the gloo reference where the box's backend is NCCL), and the processes left per namespace.
# Writes $OUT/ch09_nodes.json and $OUT/ch09_nodes.txt. About 1-2 minutes (5-6 launches, ~12 s start-up each,
# a dry run on 2 loaded CPU cores took ~150 s: all as expected, tier 3, 0 processes left;
# the wrong runs wait 10-20 s for their timeouts).   OUT=/tmp/out bash scripts/device/h200_ch09_nodes.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
OUT=${OUT:-/tmp/h200_ch09_out}
mkdir -p "$OUT"
export LAB_RUNS_DIR
LAB_RUNS_DIR=$(mktemp -d)
python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/ch09_nodes.txt"
import json, sys, time
from pathlib import Path

import torch

from lab_utils.analysis import parity
from lab_utils.core.config import ConfigError
from lab_utils.launch import launcher, netns
from lab_utils.lessons import ch09_launching as c

out = Path(sys.argv[1])
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
doc = {"torch": torch.__version__, "gpus": gpus, "netns": netns.unavailable_reason() or "available"}
keys = dict(steps=12, n_samples=256)
try:  # 1. the old request
    old = launcher.launch(launcher.request("old_auto_two_node", 1, dict(keys, backend="auto"), timeout=200,
                                           progress=False, nnodes=2))
    doc["old_auto_two_node"] = old.status
except ConfigError as e:
    doc["old_auto_two_node"] = f"refused: {e}"
backend = c.backend_here("auto", ranks=2)
doc["backend_here"] = backend
keys["backend"] = backend
t = time.time()
one = launcher.launch(launcher.request("standalone", 2, keys, timeout=200, progress=False))
doc["standalone"] = {"status": one.status, "seconds": round(one.seconds, 1)}
nodes = c.two_hosts("gpu", keys, timeout=200)
ref = nodes["reference"] or one
doc["real_hosts"], doc["reason"] = nodes["real"], nodes["reason"]
for k in ("two_node", "wrong_if", "wrong_addr"):
    r = nodes.get(k)
    if r is not None:
        doc[k] = {"status": r.status, "seconds": round(r.seconds, 1), "failing_rank": r.failing_rank,
                  "failing_node": r.failing_node, "message": r.message[:800], "command_lines": r.command_lines}
if nodes["two_node"].ok and ref.ok:
    doc["two_node_vs_standalone_tier"] = parity.compare(ref.run_dir, nodes["two_node"].run_dir).tier
doc["left_per_namespace"] = {k: len(v) for k, v in nodes.get("left", {}).items()}
doc["namespaces_gone"] = nodes.get("gone")
doc["wrong_addr_errors"] = c.rendezvous_errors(nodes["wrong_addr"])
doc["total_seconds"] = round(time.time() - t, 1)
(out / "ch09_nodes.json").write_text(json.dumps(doc, indent=1))
print(json.dumps(doc, indent=1))
PY
