#!/usr/bin/env bash
# Chapter 11 on the H200 box (issue 24): `ddp-lab preflight` (capability, native bf16, GPU link, P2P probe),
# fp16 and bf16 tiers against the emulated reference and against the single run + its float twin, GradScaler's
# skipped steps per rank under a forced overflow on rank 1, and the clipping bugs' tiers (the ch11 port-bug
# entries). Toy GPT (preset cpu), 8 steps, device=cuda. One GPU: 2 ranks share it over gloo; two: NCCL.
# Writes $OUT/preflight.txt, $OUT/amp_tiers.txt, $OUT/amp_tiers.json. About 2-3 minutes (~20 launches,
# 4 at a time, ~12 s of start-up each; a dry run on 2 loaded CPU cores with AMP_DEVICE=cpu took 535 s).
#   OUT=/tmp/out bash scripts/device/h200_amp.sh
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
OUT=${OUT:-/tmp/h200_amp_out}
mkdir -p "$OUT"
export LAB_RUNS_DIR
LAB_RUNS_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,compute_cap --format=csv > "$OUT/preflight.txt" 2>&1
python3 -m lab_utils preflight >> "$OUT/preflight.txt" 2>&1
echo "preflight exit $?" >> "$OUT/preflight.txt"
python3 - "$OUT" <<'PY'
import json, os, sys, time
from pathlib import Path

import torch

from lab_utils.analysis import doctor, parity, portbugs
from lab_utils.core import runfiles
from lab_utils.launch import launcher, twins
from lab_utils.core import float_twin

out = Path(sys.argv[1])
t0 = time.time()
gpus = torch.cuda.device_count()
common = [f"device={os.environ.get('AMP_DEVICE', 'cuda')}", "steps=8"]  # AMP_DEVICE=cpu: a dry run here
suite = [b for b in portbugs.SUITE if b.article.startswith("ch11")]
specs = {}
for name, (nproc, keys) in portbugs.runs_needed(suite).items():
    specs[name] = (name, nproc, list(keys) + common)
tiers = {  # label: (reference keys, nproc of the reference, port keys)
    "fp16 2 ranks vs emulate_ranks=2": ("emul", ["amp=fp16", "emulate_ranks=2"], ["amp=fp16"]),
    "bf16 2 ranks vs emulate_ranks=2": ("emul", ["amp=bf16", "emulate_ranks=2"], ["amp=bf16"]),
    "fp16 2 ranks vs single + twin": ("single", ["amp=fp16"], ["amp=fp16"]),
    "bf16 2 ranks vs single + twin": ("single", ["amp=bf16"], ["amp=bf16"]),
    "fp16 overflow rank 1 step 3: 2 ranks vs emulate_ranks=2": (
        "emul", ["amp=fp16", "overflow_step=3", "overflow_rank=1", "emulate_ranks=2"],
        ["amp=fp16", "overflow_step=3", "overflow_rank=1"]),
}
pairs = {}
for label, (kind, ref, port) in tiers.items():
    rname, pname = portbugs.run_name(1, tuple(ref)), portbugs.run_name(2, tuple(port))
    specs[rname] = (rname, 1, ref + common)
    specs[pname] = (pname, 2, port + common)
    twin = None
    if kind == "single":
        suffix, tkeys = twins.twin_keys(ref + common, 1)
        twin = f"{rname}{float_twin.SEPARATOR}{suffix}"
        specs[twin] = (twin, 1, [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in tkeys.items()])
    pairs[label] = (rname, pname, twin)
results = launcher.launch_many(launcher.requests_from_specs(specs, timeout=300), max_workers=4)
failed = {k: str(r) for k, r in results.items() if not r.ok}
root = runfiles.runs_dir()
lines, rows = [f"torch {torch.__version__}, {gpus} GPU(s): {torch.cuda.get_device_name(0) if gpus else '-'}", ""], []
for label, (a, b, twin) in pairs.items():
    if a in failed or b in failed or (twin and twin in failed):
        lines.append(f"{label}: a run failed"); continue
    r = parity.compare(root / a, root / b, noise_runs=[root / twin] if twin else None)
    skipped = {rk: hb.get("skipped_steps") for rk, hb in runfiles.read_heartbeats(root / b).items()}
    rows.append({"label": label, "tier": r.tier, "bitwise": r.bitwise, "max_dloss": r.max_abs_loss_diff,
                 "skipped_by_rank": skipped, "backend": json.loads((root / b / "config.json").read_text())["backend"]})
    lines.append(f"{label}: tier {r.tier} ({r.tier_name}), max |dloss| {r.max_abs_loss_diff:.2e}, "
                 f"skipped steps by rank {skipped}, backend {rows[-1]['backend']}")
lines.append("")
for bug in suite:
    a, b = portbugs.run_name(1, bug.single), portbugs.run_name(bug.nproc, bug.ddp)
    twin = portbugs.twin(bug.single)[0]
    if {a, b, twin} & set(failed):
        lines.append(f"{bug.name}: a run failed"); continue
    r = parity.compare(root / a, root / b, noise_runs=[root / twin])
    d = doctor.diagnose_runs(root / a, root / b, noise_runs=[root / twin])
    probs = portbugs.problems(bug, r) + portbugs.doctor_problems(bug, d)
    rows.append({"label": bug.name, "expected": bug.expected, "tier": r.tier,
                 "cause": r.cause.code if r.cause else None, "problems": probs})
    lines.append(f"{bug.name} (expected {bug.expected}): tier {r.tier}, cause {rows[-1]['cause']}, "
                 f"{'OK' if not probs else 'PROBLEMS: ' + '; '.join(probs)}")
lines += ["", f"failed launches: {failed or 'none'}", f"wall {time.time() - t0:.0f} s"]
(out / "amp_tiers.txt").write_text("\n".join(lines) + "\n")
(out / "amp_tiers.json").write_text(json.dumps({"rows": rows, "failed": failed}, indent=1, default=str))
print("\n".join(lines))
PY
