"""Chapter 08's lesson logic: logging, checkpoints, exact resume and metric aggregation (article §5), from real
launches and the files they leave. notebooks/08_checkpoints.ipynb calls these; no logic lives in its cells.

Launch side (it starts runs through the launcher): never imported by the rank side.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab_utils import chapter
from lab_utils.core import checkpoint, resume, runfiles
from lab_utils.core.runfiles import REPO
from lab_utils.launch import forked_ranks, launcher

PROBES = REPO / "scripts" / "probes"


def _request(p, name: str, nproc: int, keys: dict, kw: dict | None = None) -> launcher.LaunchRequest:
    """A spec (run name, nproc, keys[, launch options]) as a request: the chapter's backend, steps and timeout
    unless the spec says otherwise, no progress bar."""
    kw = dict(kw or {})
    keys = {"backend": p.backend, "steps": p.steps, **keys}
    return launcher.request(name, nproc, keys, timeout=kw.pop("timeout", p.timeout), progress=False, **kw)


def _launch(p, name: str, nproc: int, keys: dict, kw: dict | None = None) -> launcher.RunResult:
    return launcher.launch(_request(p, name, nproc, keys, kw))


def launch_many(specs: dict[str, tuple], p, max_workers: int = 3) -> dict[str, launcher.RunResult]:
    """{key: (run name, nproc, keys[, launch options])} launched at once through launcher.launch_many (each
    process one thread, so overlap changes wall time, not numbers), with the chapter's backend, steps and timeout
    unless a spec says otherwise. Failures are returned, not raised: some runs here are meant to fail. Prints
    each command and its status."""
    requests = {k: _request(p, *spec) for k, spec in specs.items()}
    return launcher.launch_many(requests, max_workers=chapter.workers(max_workers, len(specs)), print_commands=True)


def launch_in_background(spec: tuple, p):
    """Start one launch on a thread of its own and return its Future (`.result()` is the RunResult): a run that
    is meant to hang until its timeout waits while the others work. Not launch_many, which returns only once its
    runs have ended: the caller needs this one running while it launches the others."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(_launch, p, *spec)
    pool.shutdown(wait=False)
    return future


def require_ok(results: dict[str, launcher.RunResult], *keys: str) -> None:
    for k in keys:
        results[k].raise_for_status()


# ---------------------------------------------------------------- 5.1 logging
def loss_fields(run_dir: Path) -> dict[str, list]:
    """steps, the logged loss (all ranks' mean) and rank 0's own loss, from metrics.jsonl."""
    rows = runfiles.read_metrics(run_dir)
    return {"step": [r["step"] for r in rows], "loss": [r["loss"] for r in rows],
            "local_loss": [r.get("local_loss") for r in rows]}


def plot_rank0_vs_all(run_dir: Path, title: str = ""):
    import matplotlib.pyplot as plt

    f = loss_fields(run_dir)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    a1.plot(f["step"], f["loss"], lw=2.2, color="black", label="all-reduced (what the lab logs)")
    a1.plot(f["step"], f["local_loss"], lw=1.2, marker=".", label="rank 0's own micro-batch")
    a1.set(xlabel="step", ylabel="loss", title=title or "what rank 0 prints")
    a1.legend(fontsize=8)
    a2.bar(f["step"], [lc - lo for lc, lo in zip(f["local_loss"], f["loss"], strict=True)], color="C1")
    a2.axhline(0, color="black", lw=0.8)
    a2.set(xlabel="step", ylabel="rank 0's loss - logged loss", title="the half batch rank 0 sees")
    fig.tight_layout()
    return fig


def item_cost_cpu(steps: int = 2000, values_per_step: int = 3) -> tuple[float, float]:
    """Microseconds per step, on this CPU, of `.item()` on each logged number vs one stacked copy per step
    (what StepLog does every log_sync_every steps). On CPU both are host-memory reads: there is no device to
    wait for, so this measures only Python overhead — the GPU cost (a sync) cannot be measured here."""
    import time

    import torch

    xs = [torch.randn(()) for _ in range(values_per_step)]
    t = time.perf_counter()
    for _ in range(steps):
        [x.item() for x in xs]
    item = (time.perf_counter() - t) / steps
    t = time.perf_counter()
    for _ in range(steps):
        torch.stack(xs).tolist()
    stacked = (time.perf_counter() - t) / steps
    return item * 1e6, stacked * 1e6


def same_records(a: Path, b: Path, fields=("step", "loss", "grad_norm", "param_hash")) -> bool:
    """Whether two runs logged the same per-step records (the fields that do not depend on timing)."""
    ra, rb = runfiles.read_metrics(a), runfiles.read_metrics(b)
    return [[r[k] for k in fields] for r in ra] == [[r[k] for k in fields] for r in rb]


# ---------------------------------------------------------------- 5.2 checkpoints
def hang_spec(name: str, where: str = "inside", timeout: float = 20) -> tuple:
    """A launch_many spec: scripts/probes/rank0_collective.py with the barrier `inside` or `outside` the
    `if rank == 0`. pg_timeout is longer than the launcher's timeout, so the launcher stops it and reports.
    Always gloo on CPU: NCCL's barrier is itself a one-element all-reduce, which can pair with the other rank's
    one-element loss all-reduce and move the hang elsewhere; the lesson (who waits where) is the program's."""
    return (name, 2, {"steps": 5, "pg_timeout": 120, "backend": "gloo", "device": "cpu"},
            {"timeout": timeout, "script": PROBES / "rank0_collective.py", "extra_env": {"LAB_RANK0_BARRIER": where}})


def wait_until_stuck(run_dir: Path, since: float, limit: float = 300, stuck_step: int = 2) -> bool:
    """Poll the hang probe's heartbeats until rank 0 sits after step `stuck_step` (in the barrier only it
    called) and rank 1 in the next step's all-reduce; False after `limit` seconds. The notebook starts its other
    runs only then, so on a busy machine the probe's start-up is not what its timeout measures. Heartbeats older
    than `since` (a previous run's, before the launcher cleared the folder) do not count."""
    import time

    end = time.time() + limit
    while time.time() < end:
        beats = {r: b for r, b in runfiles.read_heartbeats(run_dir).items() if b.get("time", 0) >= since}
        if beats.get(0, {}).get("step") == stuck_step and beats.get(1, {}).get("step") == stuck_step + 1:
            return True
        time.sleep(0.2)
    return False


def checkpoint_listing(run_dir: Path) -> list[tuple[str, str]]:
    """(file name, what torch.load(weights_only=True) makes of it) for everything in RUN/checkpoints."""
    rows = []
    for path in sorted((Path(run_dir) / checkpoint.CHECKPOINTS).iterdir()):
        try:
            state = checkpoint.load_checkpoint(path)
            rows.append((path.name, f"loads: step {state.get('step', '?')}, {len(state['model'])} tensors"))
        except RuntimeError as e:
            rows.append((path.name, "load fails: " + str(e.__cause__ or e).splitlines()[0][:90]))
    return rows


def newest_checkpoint(run_dir: Path) -> Path | None:
    """What resume=auto would pick in this run's folder."""
    return resume.newest(run_dir)


def train_lines(start: str, count: int) -> str:
    """`count` lines of scripts/train.py from the first line containing `start` (the code is the lesson)."""
    lines = (REPO / "scripts" / "train.py").read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if start in line)
    return "\n".join(lines[first:first + count])


def attempts(run_dir: Path) -> list[int]:
    """Which start of the run wrote each step's record (TORCHELASTIC_RESTART_COUNT)."""
    return [r["attempt"] for r in runfiles.read_metrics(run_dir)]


def result_json(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / runfiles.RESULT).read_text())


def checkpoint_summary(path: Path) -> dict[str, str]:
    """Each top-level entry of a training checkpoint and what it holds (loaded with weights_only=True)."""
    state = checkpoint.load_checkpoint(path)
    out = {}
    for k, v in state.items():
        if isinstance(v, dict) and k == "model":
            out[k] = f"{len(v)} tensors (.module state dict: parameters and buffers), CPU"
        elif isinstance(v, dict) and k == "optimizer":
            out[k] = f"state for {len(v['state'])} parameters ({', '.join(sorted(next(iter(v['state'].values()))))})"
        else:
            out[k] = repr(v)
    return out


# ---------------------------------------------------------------- 5.3 metrics
def eval_spec(name: str, nproc: int, model_pt: Path, keys: dict, n: int = 101) -> tuple:
    """A launch_many spec: scripts/probes/eval_probe.py, every rank loads `model_pt` and evaluates its shard
    of the first n samples. On CPU with gloo everywhere: the lesson is counting, and on a GPU the kernels
    picked per batch shape could flip a near-tie prediction between the 1- and 2-rank evaluations."""
    keys = dict(keys, device="cpu", backend="gloo")
    return (name, nproc, keys, {"script": PROBES / "eval_probe.py",
                                "extra_env": {"LAB_EVAL_MODEL": str(model_pt), "LAB_EVAL_N": str(n)}})


def read_eval(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "eval.json").read_text())


def eval_table(two: dict, one: dict) -> str:
    """The aggregations side by side with the single-process accuracy."""
    exact = one["distributed"]["deduplicated"]
    lines = [f"eval set: {two['n']} samples, {two['world_size']} ranks; single process: {exact:.6f} "
             f"({one['distributed']['correct']}/{one['n']})",
             f"{'sharding':<22} {'per-rank (correct, total)':<28} {'simple mean':>12} {'all_reduce':>11} "
             f"{'dedup by id':>12}"]
    for how in ("distributed", "distributed_drop_last", "strided"):
        r = two[how]
        dedup = r["deduplicated"]
        dd = f"{dedup:.6f}" if isinstance(dedup, float) else "missing ids"
        lines.append(f"{how:<22} {str(r['per_rank']):<28} {r['simple_mean']:>12.6f} "
                     f"{r['article_all_reduce']:>11.6f} {dd:>12}")
    return "\n".join(lines)


# ---- evaluation on rank 0 only: through the DDP wrapper or through .module (2 real gloo ranks, forked)

def _eval_trap_rank(rank: int, world_size: int, init: str, out: str, through: str, timeout_s: float,
                    late_s: float) -> None:
    """One rank of `rank0_eval_trap`: a BatchNorm net trains one DDP step; then rank 0 alone evaluates
    (eval mode, no_grad) through `through` ("wrapper" or "module"), and every rank enters the next step's
    all-reduce. Writes what each rank reached and how long its all-reduce took."""
    import datetime
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    # Only the trap may time out. The default group waits long (the ranks reach DDP's construction seconds apart
    # on a loaded box: CI once saw its broadcast time out at 3 s); the DDP group has the short timeout, and each
    # of its phases starts right after a barrier of the default group, so the ranks enter it together.
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=max(120.0, timeout_s)))
    if rank == 0:
        time.sleep(late_s)  # a rank slowed by a loaded box (the test's)
    dist.barrier()
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)),
                process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(rank))
    model(x).sum().backward()
    opt.step()
    dist.barrier()
    rec = {"rank": rank, "evaluated": rank == 0}
    start = time.monotonic()
    try:
        if rank == 0:
            model.eval()
            with torch.no_grad():
                (model if through == "wrapper" else model.module)(x)
            model.train()
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total, group=group)  # the next training step's first collective
        rec.update(status="ok", all_reduce=total.item())
    except RuntimeError as e:  # gloo's timeout: the ranks waited in collectives that never matched
        rec.update(status="timed out", error=str(e).splitlines()[0][:160])
    rec["seconds"] = round(time.monotonic() - start, 1)
    forked_ranks.finish(out, rank, rec)  # ends the process: a returning rank can hang in gloo's teardown


TRAP_GRACE_S = 120.0  # what a loaded 2-core box may add to the trap's own timeout before its ranks count as stuck


def rank0_eval_trap(timeout_s: float = 3.0, world_size: int = 2, late_s: float = 0.0) -> dict[str, list[dict]]:
    """Rank-0-only evaluation right after a training step, through the DDP wrapper and through `.module`:
    {"wrapper" | "module": [each rank's record]}. The wrapper's forward starts DDP's buffer broadcast (the net
    has BatchNorm buffers and the previous forward was a synchronising one), a collective only rank 0 joins,
    so both ranks wait until the process group's `timeout_s`. Forked gloo ranks, a file rendezvous; rank 0 starts
    `late_s` after the others."""
    # A stuck rank must not hold the kernel: the trap takes timeout_s + late_s; give it TRAP_GRACE_S more.
    return {through: forked_ranks.run(_eval_trap_rank, world_size, (through, timeout_s, late_s),
                                      deadline_s=timeout_s + late_s + TRAP_GRACE_S,
                                      what=f"rank0_eval_trap ({through})")
            for through in ("module", "wrapper")}
