"""What three DDP flags do, measured on every rank (chapter 05, article §3.1). Launched by torchrun.

LAB_FLAGS_PROBE picks the question (each writes runs/NAME/probe/rank{r}.json, read by lab_utils.lessons.ch05_ddp_flags):

- `unused`: a model with a branch (`aux`) that only odd steps use. With find_unused_parameters=false it is
  trained as is: DDP waits in step 0 for a gradient `aux` never produces, and step 1's forward raises —
  the launcher shows that rank's traceback. With find_unused_parameters=true it trains; so does
  static_graph=True when the unused set is the same every step (aux never used). Then the cost: three copies
  of a model whose every parameter is used (plain, find_unused_parameters, static_graph), trained side by
  side, alternating step by step so they share the machine's load; each step's wall time is recorded (40
  timed steps per copy, so flags_lessons.unused_cost can say whether the difference exceeds the spread).
- `buffers`: a BatchNorm net on each rank's own batches, with each buffer argument true and false (the
  deprecated `broadcast_buffers` and, where torch has it, `forward_sync_buffers`); the buffer fingerprint right
  before every forward (a pre-hook on the inner module, so after DDP's broadcast) and after every step. Then
  the schedule: a fixed sequence of forwards (two no_sync accumulation windows, a no_grad forward, two training
  forwards) with the lab's argument on, fingerprinted before each forward: which forwards DDP broadcasts before.
- `bucket_view`: gradient_as_bucket_view true/false. Memory: an MLP of ~2 M parameters, RSS (and CUDA
  allocated bytes on a GPU) after backward, and how many distinct storages the gradients live in. Semantics:
  the same tiny run with each of in-place scaling, clip_grad_norm_, rebinding `p.grad`, `p.grad.detach_()`,
  and keeping a reference to last step's gradient — final parameters compared with the flag on and off. Then
  the flag x zero_grad(set_to_none=True/False) grid: where autograd accumulated each gradient (a
  post-accumulate-grad hook reads its storage) and whether a kept reference changes at the next backward.
"""

import copy
import gc
import os
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import psutil
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import config, ddp, distenv, runfiles  # noqa: E402
from lab_utils.core.workloads.bn_net import IMAGE_SIZE, BNNet  # noqa: E402

WIDTH = 32
TIMED_STEPS = 42  # per copy, interleaved step by step; the first 2 are warm-up


class Branchy(nn.Module):
    """A trunk, a head, and an auxiliary head used only when asked (as a model with an optional branch)."""

    def __init__(self, depth: int = 1, width: int = WIDTH):
        super().__init__()
        self.trunk = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)])
        self.head = nn.Linear(width, 1)
        self.aux = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        h = self.trunk(x)
        return self.head(h) + (self.aux(h) if use_aux else 0)


def batch(seed: int, rank: int, step: int, shape: tuple, device) -> torch.Tensor:
    """This rank's own data for `step` (a fresh generator: the same draw whatever else the probe did)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 1009 + step)
    return torch.randn(shape, generator=g).to(device)


def wrap(model, env, **flags) -> DDP:
    return DDP(model.to(env.device), device_ids=[env.device.index] if env.device.type == "cuda" else None, **flags)


def train(model, env, cfg, steps: int, use_aux, width: int = WIDTH, times: list | None = None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        t0 = time.perf_counter()
        x = batch(cfg["seed"], env.rank, step, (8, width), env.device)
        model(x, use_aux(step)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if times is not None:
            if env.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)


def probe_unused(cfg: dict, env) -> dict:
    torch.manual_seed(cfg["seed"])
    base = Branchy()
    if not cfg["find_unused_parameters"]:
        # The bug, for real: aux is unused in step 0, so DDP's reducer never finishes that step's reduction
        # and the next forward raises. The traceback is this rank's; the launcher reports it.
        train(wrap(copy.deepcopy(base), env), env, cfg, cfg["steps"], use_aux=lambda s: s % 2 == 1)
        return {}
    out = {}
    alternating = wrap(copy.deepcopy(base), env, find_unused_parameters=True)
    train(alternating, env, cfg, cfg["steps"], use_aux=lambda s: s % 2 == 1)
    out["find_unused_alternating"] = runfiles.fingerprint(alternating)
    static = wrap(copy.deepcopy(base), env, static_graph=True)
    train(static, env, cfg, cfg["steps"], use_aux=lambda s: False)
    out["static_graph_never_used"] = runfiles.fingerprint(static)
    # The cost, on a deeper model whose every parameter is used: the flag still walks the autograd graph.
    torch.manual_seed(cfg["seed"])
    deep = Branchy(depth=16)
    copies = {"plain": wrap(copy.deepcopy(deep), env),
              "find_unused_parameters": wrap(copy.deepcopy(deep), env, find_unused_parameters=True),
              "static_graph": wrap(copy.deepcopy(deep), env, static_graph=True)}
    times = {k: [] for k in copies}
    for step in range(TIMED_STEPS):
        for k, m in copies.items():
            one = []
            train(m, env, {**cfg, "seed": cfg["seed"] + step}, 1, use_aux=lambda s: True, times=one)
            times[k] += one
    warm = 2  # the first steps build buckets (and, for static_graph, record the graph)
    out["step_seconds_median"] = {k: statistics.median(v[warm:]) for k, v in times.items()}
    out["step_seconds"] = {k: v[warm:] for k, v in times.items()}  # per step, paired: flags_lessons.unused_cost
    out["fingerprints_equal_across_copies"] = len({runfiles.fingerprint(m) for m in copies.values()}) == 1
    return out


def buffer_arguments() -> list[tuple[str, bool]]:
    names = ("broadcast_buffers", "forward_sync_buffers") if ddp.has_forward_sync_buffers() else ("broadcast_buffers",)
    return [(name, flag) for name in names for flag in (True, False)]


# (kind, what it is): no_sync = a training micro-batch inside model.no_sync(); sync = a synchronising training
# forward (an optimizer step follows); no_grad = a forward under torch.no_grad() in train mode (BN still updates).
SCHEDULE = (("no_sync", "step 0, micro-batch 0 (inside no_sync)"), ("sync", "step 0, micro-batch 1 (synchronising)"),
            ("no_sync", "step 1, micro-batch 0 (inside no_sync)"), ("sync", "step 1, micro-batch 1 (synchronising)"),
            ("no_grad", "a no_grad forward (train mode)"), ("sync", "the training forward after it"),
            ("sync", "the next training forward"))


def buffer_schedule(cfg: dict, env, base) -> dict:
    """Buffer fingerprints before each forward of SCHEDULE, each rank on its own batches."""
    model = wrap(copy.deepcopy(base), env, **ddp.buffer_sync_kwargs(True))
    seen = []
    model.module.register_forward_pre_hook(lambda mod, args: seen.append(runfiles.buffer_fingerprint(mod)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    for i, (kind, _) in enumerate(SCHEDULE):
        x = batch(cfg["seed"], env.rank, 100 + i, (8, 1, IMAGE_SIZE, IMAGE_SIZE), env.device)
        if kind == "no_grad":
            with torch.no_grad():
                model(x)
            continue
        with model.no_sync() if kind == "no_sync" else nullcontext():
            model(x).square().mean().backward()
        if kind == "sync":
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {"forwards": [label for _, label in SCHEDULE], "kinds": [k for k, _ in SCHEDULE], "before_forward": seen,
            "argument": next(iter(ddp.buffer_sync_kwargs(True)))}


def probe_buffers(cfg: dict, env) -> dict:
    out = {}
    torch.manual_seed(cfg["seed"])  # one init on every rank: the buffers start equal
    base = BNNet()
    for name, flag in buffer_arguments():
        with warnings.catch_warnings():  # the deprecated name's FutureWarning: chapter 02's wrap probe records it
            warnings.simplefilter("ignore", FutureWarning)
            model = wrap(copy.deepcopy(base), env, **{name: flag})
        inner, pre, after = model.module, [], []
        inner.register_forward_pre_hook(lambda mod, args, pre=pre: pre.append(runfiles.buffer_fingerprint(mod)))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        model.train()
        for step in range(cfg["steps"]):
            x = batch(cfg["seed"], env.rank, step, (8, 1, IMAGE_SIZE, IMAGE_SIZE), env.device)
            model(x).square().mean().backward()  # each rank's own batch: its BN statistics are its own
            opt.step()
            opt.zero_grad(set_to_none=True)
            after.append(runfiles.buffer_fingerprint(inner))
        out[f"{name}={flag}"] = {"before_forward": pre, "after_step": after}
    out["schedule"] = buffer_schedule(cfg, env, base)
    return out


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def kept_reference(cfg: dict, env, flag: bool, set_to_none: bool) -> dict:
    """3 SGD steps with gradient_as_bucket_view=flag and zero_grad(set_to_none=...): does a reference kept from
    the last step change at the next backward, and where did autograd accumulate this step's gradients?"""
    torch.manual_seed(cfg["seed"])
    model = wrap(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)), env, gradient_as_bucket_view=flag)
    params = list(model.parameters())
    seen = []  # the storage each gradient was accumulated into, read right after autograd wrote it
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.untyped_storage().data_ptr()))
    opt = torch.optim.SGD(params, lr=0.1)
    kept, changed = None, []
    for step in range(3):
        opt.zero_grad(set_to_none=set_to_none)
        seen.clear()
        x = batch(cfg["seed"], env.rank, step, (8, 16), env.device)
        F.mse_loss(model(x), x[:, :4]).backward()
        if kept is not None:
            changed.append(any(not torch.equal(g, c) for g, c in kept))
        kept = [(p.grad, p.grad.clone()) for p in params]
        opt.step()
    after = {p.grad.untyped_storage().data_ptr() for p in params}
    return {"kept_reference_changed": any(changed), "accumulated_into_storages": len(set(seen)),
            "grad_storages_after_backward": len(after), "accumulated_into_final_grads": set(seen) <= after,
            "n_params": len(params)}


def memory(cfg: dict, env, flag: bool) -> dict:
    """Bytes held after backward by a ~2 M-parameter MLP wrapped with gradient_as_bucket_view=flag."""
    dims = (512, 1024, 1024, 512)
    cuda = env.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        cuda0 = torch.cuda.memory_allocated()
    rss0 = rss()
    torch.manual_seed(cfg["seed"])
    mlp = nn.Sequential(*[nn.Linear(a, b) for a, b in zip(dims, dims[1:], strict=False)])
    model = wrap(mlp, env, gradient_as_bucket_view=flag)
    for step in range(2):  # DDP's docstring: measure after the first iteration
        model.zero_grad(set_to_none=True)
        model(batch(cfg["seed"], env.rank, step, (4, dims[0]), env.device)).square().mean().backward()
    params = list(model.parameters())
    res = {"param_bytes": sum(p.numel() * p.element_size() for p in params),
           "grad_storages": len({p.grad.untyped_storage().data_ptr() for p in params}),
           "n_params": len(params), "rss_bytes": rss() - rss0}
    if cuda:
        torch.cuda.synchronize()
        res["cuda_allocated_bytes"] = torch.cuda.memory_allocated() - cuda0
    del model, mlp, params
    return res


def semantics(cfg: dict, env, flag: bool, action: str) -> dict:
    """3 SGD steps of a tiny model; between backward and step, `action` touches the gradients."""
    torch.manual_seed(cfg["seed"])
    model = wrap(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)), env, gradient_as_bucket_view=flag)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    res = {"error": None, "kept_reference_changed": None, "grad_storages_last_step": None}
    kept = None
    try:
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            x = batch(cfg["seed"], env.rank, step, (8, 16), env.device)
            F.mse_loss(model(x), x[:, :4]).backward()
            if action == "mul_":
                for p in params:
                    p.grad.mul_(0.5)
            elif action == "clip_grad_norm_":
                torch.nn.utils.clip_grad_norm_(params, 0.05)
            elif action == "rebind":
                for p in params:
                    p.grad = p.grad * 0.5
            elif action == "detach_":
                for p in params:
                    p.grad.detach_()
            elif action == "keep_reference":  # e.g. to compare this step's gradient with the last one
                if kept is not None:
                    res["kept_reference_changed"] = any(not torch.equal(g, c) for g, c in kept)
                kept = [(p.grad, p.grad.clone()) for p in params]
            res["grad_storages_last_step"] = len({p.grad.untyped_storage().data_ptr() for p in params})
            opt.step()
    except RuntimeError as e:
        res["error"] = str(e).splitlines()[0]
    res["fingerprint"] = runfiles.fingerprint(model)
    return res


ACTIONS = ("none", "mul_", "clip_grad_norm_", "rebind", "detach_", "keep_reference")


def probe_bucket_view(cfg: dict, env) -> dict:
    memory(cfg, env, False)  # warm-up, discarded: one-time allocations (gloo buffers, kernels) land here
    return {"memory": {str(flag): memory(cfg, env, flag) for flag in (False, True)},
            "semantics": {a: {str(flag): semantics(cfg, env, flag, a) for flag in (False, True)} for a in ACTIONS},
            "set_to_none_grid": {f"{flag}/{stn}": kept_reference(cfg, env, flag, stn)
                                 for flag in (False, True) for stn in (True, False)}}


PROBES = {"unused": probe_unused, "buffers": probe_buffers, "bucket_view": probe_bucket_view}


@record
def main(argv: list[str]) -> None:
    cfg = config.resolve(argv, int(os.environ.get("WORLD_SIZE", "1")))
    mode = os.environ.get("LAB_FLAGS_PROBE", "")
    if mode not in PROBES:
        raise SystemExit(f"LAB_FLAGS_PROBE={mode!r} is not one of {', '.join(PROBES)}")
    env = distenv.setup(cfg)
    heart = runfiles.Heartbeat(Path(cfg["out_dir"]), env.rank)  # pid and phase for a hang's report
    heart.beat(step=-1, phase="setup")
    if not env.distributed:
        raise SystemExit("the flags probe needs torchrun with nproc >= 2")
    result = {"rank": env.rank, "mode": mode, "device": str(env.device), **PROBES[mode](cfg, env)}
    out = Path(cfg["out_dir"]) / "probe"
    out.mkdir(parents=True, exist_ok=True)
    runfiles.write_json(result, out / f"rank{env.rank}.json")
    heart.beat(phase="finished")
    distenv.finish(env)  # on success only, as train.py; ends the process here (see distenv.finish)


if __name__ == "__main__":
    main(sys.argv[1:])
    distenv.exit_process(0)  # skip interpreter finalization (the gloo exit race; see distenv.exit_process)
