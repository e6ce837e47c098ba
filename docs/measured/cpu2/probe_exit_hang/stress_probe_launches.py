"""Launch chapter 06's 4-rank accumulation probe over and over, 3 launches at a time, and take a py-spy dump of
every process of a launch still running after WATCH seconds (a normal one takes 15-30 s on the 2-core box).

    python docs/measured/cpu2/probe_exit_hang/stress_probe_launches.py [launches per thread]

Produced measured.txt (the CPU box, torch 2.13.0+cpu, gloo); needs py-spy on PATH.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
os.environ.setdefault("LAB_RUNS_DIR", "/tmp/stress/runs")
from lab_utils.launch import launcher  # noqa: E402
from lab_utils.lessons import ch06_accumulation  # noqa: E402

N_EACH = int(sys.argv[1]) if len(sys.argv) > 1 else 20
WATCH = 75  # seconds
OUT = Path(os.environ["LAB_RUNS_DIR"]).parent
results: list[tuple[str, str, float]] = []
active: dict[str, float] = {}  # launch name -> start time


def worker(thread: int) -> None:
    for i in range(N_EACH):
        name = f"s{thread}_{i}"
        active[name] = t0 = time.time()
        keys = dict(global_batch_size=16, grad_accum_steps=4, n_samples=40, steps=12, backend="auto")
        r = launcher.launch(launcher.request(name, 4, keys, timeout=150, progress=False,
                                             script=ch06_accumulation.PROBE))
        active.pop(name, None)
        results.append((name, r.status, round(time.time() - t0, 1)))
        print(name, r.status, round(time.time() - t0, 1), flush=True)
        if r.status != "ok":
            print(str(r), flush=True)


def watchdog() -> None:
    dumped = set()
    while True:
        time.sleep(5)
        for name, start in list(active.items()):
            if time.time() - start <= WATCH or name in dumped:
                continue
            dumped.add(name)
            out = OUT / f"dump_{name}.txt"
            with open(out, "w") as f:
                for p in psutil.Process().children(recursive=True):
                    try:
                        cmd = " ".join(p.cmdline())[:200]
                    except psutil.Error:
                        continue
                    f.write(f"==== pid {p.pid} ppid {p.ppid()} {cmd}\n")
                    f.flush()
                    subprocess.run(["py-spy", "dump", "--native", "--pid", str(p.pid)], stdout=f,
                                   stderr=subprocess.STDOUT, timeout=60)
            print("DUMPED", name, out, flush=True)


if __name__ == "__main__":
    threading.Thread(target=watchdog, daemon=True).start()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("DONE", len(results), "bad", [r for r in results if r[1] != "ok"])
