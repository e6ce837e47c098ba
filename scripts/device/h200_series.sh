#!/usr/bin/env bash
# `make nbval` (every chapter under nbval, the committed verdict outputs) on a one-GPU box: the device machine, one
# H200, torch 2.11+cu130, no Jupyter and no network. Jupyter/nbval and setproctitle travel as wheels in .whl/
# (git-ignored), fetched here with `pip download -d .whl --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_28_x86_64 ... nbval ipykernel nbformat ipywidgets setproctitle` and their dependencies, less those
# the device has (pytest, pluggy, packaging, attrs, psutil, pygments, ...: KINDS.md's list).
# The box's python3 already has torch, so no venv is made: `-o .venv/.lab-installed` skips `make setup` and PY
# names that python3. Four notebooks at a time (NBVAL_WORKERS=4); every multi-rank run shares the one GPU, so
# backend auto picks gloo. Writes $OUT/nbval_1gpu.txt (the log) and $OUT/chapter_times.txt (each chapter's summed
# cell time, from pytest's junit XML).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
{ echo "commit: $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0))"
  nproc; python3 -m pytest --version; } 2>&1 | tee "$OUT/nbval_1gpu.txt"
if command -v make >/dev/null; then
  echo "+ make -o .venv/.lab-installed nbval PY=python3 NBVAL_WORKERS=4" | tee -a "$OUT/nbval_1gpu.txt"
  make -o .venv/.lab-installed nbval PY=python3 NBVAL_WORKERS=4 NBVAL_ARGS="--junitxml=$OUT/junit.xml" 2>&1 \
    | tee -a "$OUT/nbval_1gpu.txt"
  rc=${PIPESTATUS[0]}
else  # no make on the box: the command `make nbval` runs (Makefile, NBVAL and the nbval target)
  echo "+ (no make) the nbval target's command" | tee -a "$OUT/nbval_1gpu.txt"
  rm -rf build/executed
  LAB_NBVAL_SAVE=$PWD/build/executed python3 -m pytest --nbval-lax --nbval-current-env \
    --nbval-sanitize-with notebooks/nbval_sanitize.cfg --nbval-cell-timeout 900 notebooks -q -n 4 --dist loadfile \
    --durations=15 --junitxml="$OUT/junit.xml" 2>&1 | tee -a "$OUT/nbval_1gpu.txt"
  rc=${PIPESTATUS[0]}
fi
python3 - "$OUT/junit.xml" > "$OUT/chapter_times.txt" <<'PY'
import collections, sys, xml.etree.ElementTree as ET
t, n, bad = collections.Counter(), collections.Counter(), collections.Counter()
for case in ET.parse(sys.argv[1]).iter("testcase"):
    nb = case.get("classname", "").split("::")[0] or case.get("file", "?")
    nb = nb.rsplit("/", 1)[-1].replace("notebooks.", "")
    t[nb] += float(case.get("time", 0)); n[nb] += 1
    bad[nb] += any(c.tag in ("failure", "error") for c in case)
print(f"{'notebook':30} {'cells':>5} {'failed':>6} {'seconds':>8}")
for nb in sorted(t):
    print(f"{nb:30} {n[nb]:5d} {bad[nb]:6d} {t[nb]:8.1f}")
print(f"{'total':30} {sum(n.values()):5d} {sum(bad.values()):6d} {sum(t.values()):8.1f}")
PY
cat "$OUT/chapter_times.txt"
# two executed chapters come back, to show what nbval kept (outputs and widget state)
mkdir -p "$OUT/executed" && cp build/executed/00_preflight.ipynb build/executed/11_mixed_precision.ipynb "$OUT/executed/" 2>/dev/null
rm -f "$OUT/junit.xml"
exit $rc
