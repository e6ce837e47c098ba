#!/usr/bin/env bash
# The whole series under nbval on a one-GPU box (the device machine: one H200, torch 2.11+cu130, no Jupyter).
# Jupyter/nbval and setproctitle travel as wheels in .whl/ (git-ignored), fetched here with
# `pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 nbval ipykernel
# nbformat nbclient setproctitle` (their dependencies are on the device or in that folder).
# One notebook per pytest-xdist worker (--dist loadfile: a notebook's cells share one kernel), 4 at a time;
# every multi-rank run shares the one GPU, so backend auto must pick gloo. Writes $OUT/nbval_1gpu.txt (the log)
# and $OUT/chapter_times.txt (each chapter's summed cell time, from pytest's junit XML).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0))" | tee "$OUT/nbval_1gpu.txt"
python3 -m pytest --nbval-lax --nbval-current-env --nbval-cell-timeout 400 -n 4 --dist loadfile -p no:cacheprovider \
  --junitxml="$OUT/junit.xml" -q --durations=15 notebooks 2>&1 | tee -a "$OUT/nbval_1gpu.txt"
rc=${PIPESTATUS[0]}
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
rm -f "$OUT/junit.xml"
exit $rc
