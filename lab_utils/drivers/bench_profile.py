"""Where a training step's time goes: host (Python + launch) vs device, kernel launches per step, top ops.

    ddp-lab bench profile                          # workshop preset on the GPU, every variant below
    ddp-lab bench profile --preset cpu --steps 10  # anywhere (CPU: host time is all there is)
    ddp-lab bench profile --json out.json

Each variant builds the lab's own model (`workloads.build` with the preset's keys) and runs forward + backward +
optimizer step outside the launcher, one process, so the numbers are the step itself, not torchrun. Per
variant it prints: wall ms/step (synchronised), tokens/s, the profiler's self CPU time and self device time per
step, device-busy fraction (device time / wall), kernel launches per step, and for the first variant the top ops
by host time. A `launch floor` row times an empty-ish op loop: the host cost of one tiny kernel launch on this
machine, the floor under any per-op cost. Variants: the lab's defaults (deterministic, foreach AdamW, 1 thread),
then one change each: deterministic off, fused AdamW, more intra-op threads, larger micro-batch, bf16 autocast,
and torch.compile (opt-in with --compile: its first steps compile).
Targets live here, not in tests (issue: GPU busy most of the step on the workshop preset).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from lab_utils.core import config, distenv, workloads


def _step_fn(wl, model, opt, batch, amp: bool):
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(batch["x"].device.type, dtype=torch.bfloat16, enabled=amp):
            loss = wl.loss_fn(model, batch, reduction="mean", seed=0)
        loss.backward()
        opt.step()
    return step


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def launch_floor_us(device: torch.device, n: int = 2000) -> float:
    """Host microseconds per tiny op (x.add_(1)) issued back to back: the machine's per-launch floor."""
    x = torch.zeros(16, device=device)
    for _ in range(50):
        x.add_(1)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    t1 = time.perf_counter()  # host time to issue, before waiting for the device
    _sync(device)
    return (t1 - t0) / n * 1e6


def run_variant(name: str, keys: list[str], device: torch.device, steps: int, warmup: int, deterministic: bool,
                fused: bool, threads: int, amp: bool, compile_: bool, top: int) -> dict:
    cfg = config.resolve(keys + [f"threads={threads}", f"deterministic={str(deterministic).lower()}"], 1)
    distenv.configure_determinism(cfg, device)
    if not deterministic:
        torch.use_deterministic_algorithms(False)
    torch.manual_seed(cfg["seed"])
    wl = workloads.build(cfg)
    model = wl.model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=cfg["weight_decay"],
                            **({"fused": True} if fused else {}))
    mb = cfg["micro_batch_size"]
    batch = torch.utils.data.default_collate([wl.dataset[i] for i in range(mb)])
    batch = {k: v.to(device) for k, v in batch.items()}
    if compile_:
        model = torch.compile(model)
    step = _step_fn(wl, model, opt, batch, amp)
    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    wall_ms = (time.perf_counter() - t0) / steps * 1e3

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof_steps = min(steps, 5)
    with profile(activities=activities) as prof:
        for _ in range(prof_steps):
            step()
        _sync(device)
    events = prof.key_averages()
    self_cpu = sum(e.self_cpu_time_total for e in events) / prof_steps / 1e3
    # Device time = the kernels' own time only: a CPU-side op (aten::addmm) also reports the device time of
    # the kernels it launched, and summing both would count every kernel twice.
    from torch.autograd import DeviceType

    self_dev = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / prof_steps / 1e3
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                       "cudaLaunchKernelExC", "cuLaunchKernelEx")) / prof_steps
    row = {"variant": name, "micro_batch": mb, "wall_ms": round(wall_ms, 2),
           "tokens_per_s": round(mb * cfg["block_size"] / wall_ms * 1e3),
           "self_cpu_ms": round(self_cpu, 2), "self_device_ms": round(self_dev, 2),
           "device_busy": round(self_dev / wall_ms, 3) if device.type == "cuda" else None,
           "launches_per_step": launches}
    if top:
        ranked = sorted((e for e in events if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
        row["top_host_ops"] = [{"op": e.key, "calls_per_step": e.count / prof_steps,
                                "host_us_per_call": round(e.self_cpu_time_total / e.count, 1)}
                               for e in ranked[:top]]
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None, choices=("workshop", "cpu"),
                    help="default: workshop on a GPU, cpu otherwise")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--micro-batch", type=int, default=16, help="samples per step for the base variants")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model)")
    ap.add_argument("--json", type=Path, help="write every row as JSON here")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    preset = args.preset or ("workshop" if device.type == "cuda" else "cpu")
    base = [f"preset={preset}", f"global_batch_size={args.micro_batch}"]
    big = [f"preset={preset}", f"global_batch_size={args.micro_batch * 8}"]
    lab = dict(deterministic=True, fused=False, threads=1, amp=False, compile_=False)
    variants = [
        ("lab defaults", base, lab),
        ("deterministic off", base, {**lab, "deterministic": False}),
        ("fused AdamW", base, {**lab, "fused": device.type == "cuda"}),
        ("threads=8", base, {**lab, "threads": 8}),
        (f"micro-batch x8 ({args.micro_batch * 8})", big, lab),
        ("bf16 autocast", base, {**lab, "amp": True}),
        ("all host fixes, micro-batch x8", big, {**lab, "deterministic": False, "fused": device.type == "cuda"}),
    ]
    if args.compile:
        variants.append(("torch.compile + fused, micro-batch x8", big,
                         {**lab, "deterministic": False, "fused": device.type == "cuda", "compile_": True}))
    floor = launch_floor_us(device)
    rows = []
    for i, (name, keys, opts) in enumerate(variants):
        try:
            rows.append(run_variant(name, keys, device, args.steps, args.warmup, top=12 if i == 0 else 0, **opts))
        except Exception as e:  # one variant failing (e.g. compile) must not hide the others
            rows.append({"variant": name, "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"  measured: {name}", file=sys.stderr, flush=True)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"\nbench profile: preset={preset}, device {name}, torch {torch.__version__}, "
          f"{args.steps} timed steps ({args.warmup} warm-up)")
    print(f"launch floor: {floor:.1f} us of host time per tiny op (x.add_(1) in a loop)")
    head = f"{'variant':<40} {'mb':>4} {'ms/step':>8} {'tokens/s':>10} {'host ms':>8} {'dev ms':>7} " \
           f"{'busy':>5} {'launches':>8}"
    print(head)
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<40} FAILED: {r['error']}")
            continue
        busy = f"{r['device_busy']:.0%}" if r["device_busy"] is not None else "-"
        print(f"{r['variant']:<40} {r['micro_batch']:>4} {r['wall_ms']:>8.2f} {r['tokens_per_s']:>10,} "
              f"{r['self_cpu_ms']:>8.2f} {r['self_device_ms']:>7.2f} {busy:>5} {r['launches_per_step']:>8.0f}")
    if rows and "top_host_ops" in rows[0]:
        print("\ntop host ops, lab defaults (self host time per call):")
        for op in rows[0]["top_host_ops"]:
            print(f"  {op['op'][:60]:<60} {op['calls_per_step']:>6.1f}/step {op['host_us_per_call']:>9.1f} us")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "torch": torch.__version__, "preset": preset,
                                         "launch_floor_us": floor, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
