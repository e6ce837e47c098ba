"""Synchronised BatchNorm on real ranks (chapter 07). Launched by torchrun (lab_utils.launch.launcher, script=...).

Every rank builds the same global batch (float64, seeded alike) and keeps its own slice, as DDP ranks do.
Reference: one nn.BatchNorm over the *whole* batch in this process. Measured on the rank's slice, written to
runs/NAME/probe/rank{r}.json:
- `lab`: LabSyncBatchNorm over the process group — output, input gradient, the affine gradients (summed over
  ranks, as DDP would after averaging x world_size) and the running stats against the reference;
- `no_sync`: plain BatchNorm on the slice alone (what a port without sync computes);
- `torch` (only with CUDA): nn.SyncBatchNorm on CUDA tensors against LabSyncBatchNorm.
Then, with LAB_SYNC_BN_PROBE=torch_cpu, it runs nn.SyncBatchNorm on this rank's CPU tensors and lets torch's
own error end the rank, so the launcher shows that traceback.
"""

import copy
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import config, distenv, runfiles  # noqa: E402
from lab_utils.core.sync_bn import LabSyncBatchNorm  # noqa: E402

CASES = {"BatchNorm2d": (nn.BatchNorm2d, (8, 3, 5, 5)), "BatchNorm1d": (nn.BatchNorm1d, (8, 4))}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max())


def run_bn(bn: nn.Module, x: torch.Tensor, w: torch.Tensor) -> dict:
    """Forward + backward of sum(bn(x) * w) (fixed random w, so dy is not trivial); outputs and gradients."""
    x = x.detach().clone().requires_grad_()
    y = bn(x)
    (y * w).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "dweight": bn.weight.grad, "dbias": bn.bias.grad,
            "running_mean": bn.running_mean, "running_var": bn.running_var}


def compare(got: dict, ref: dict, rows: slice, world: bool) -> dict:
    out = {k: max_diff(got[k], ref[k][rows]) for k in ("y", "dx")}
    for k in ("dweight", "dbias"):  # local sums; summed over ranks they are the full-batch gradients
        g = got[k].clone()
        if world:
            dist.all_reduce(g)
        out[k] = max_diff(g, ref[k])
    out.update({k: max_diff(got[k], ref[k]) for k in ("running_mean", "running_var")})
    return out


def probe(env) -> dict:
    r, W = env.rank, env.world_size
    result = {"rank": r, "world_size": W, "device": str(env.device), "cases": {}}
    for name, (make, shape) in CASES.items():
        g = torch.Generator().manual_seed(7)
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 5  # mean far from 0: cancellation test
        w = torch.randn(shape, generator=g, dtype=torch.float64)
        ref_bn = make(shape[1]).double()
        with torch.no_grad():
            ref_bn.weight.uniform_(0.5, 1.5, generator=g)
            ref_bn.bias.uniform_(-1, 1, generator=g)
        ref = run_bn(copy.deepcopy(ref_bn), x, w)
        n = shape[0] // W
        rows = slice(r * n, (r + 1) * n)
        xs, ws = x[rows].to(env.device), w[rows].to(env.device)
        lab = run_bn(LabSyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref_bn)).to(env.device), xs, ws)
        plain = run_bn(copy.deepcopy(ref_bn).to(env.device), xs, ws)
        case = {"lab": compare(lab, ref, rows, True), "no_sync": compare(plain, ref, rows, True)}
        if env.device.type == "cuda":
            torch_bn = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref_bn)).to(env.device)
            case["torch"] = compare(run_bn(torch_bn, xs, ws), {k: v.to(env.device) for k, v in lab.items()},
                                    slice(None), False)
        result["cases"][name] = case
    return result


@record
def main(argv: list[str]) -> None:
    cfg = config.resolve(argv, int(os.environ.get("WORLD_SIZE", "1")))
    env = distenv.setup(cfg)
    heart = runfiles.Heartbeat(Path(cfg["out_dir"]), env.rank)  # pid and phase for a hang's report
    heart.beat(step=-1, phase="setup")
    if not env.distributed:
        raise SystemExit("the sync BN probe needs torchrun with nproc >= 2")
    out = Path(cfg["out_dir"]) / "probe"
    out.mkdir(parents=True, exist_ok=True)
    runfiles.write_json(probe(env), out / f"rank{env.rank}.json")
    if os.environ.get("LAB_SYNC_BN_PROBE") == "torch_cpu":
        dist.barrier()  # both ranks have written their file before either fails
        bn = nn.SyncBatchNorm(3)  # on CPU tensors: torch refuses at the first training forward
        bn(torch.randn(4, 3, 5, 5))
    heart.beat(phase="finished")
    distenv.finish(env)  # on success only, as train.py; ends the process here (see distenv.finish)


if __name__ == "__main__":
    main(sys.argv[1:])
    distenv.exit_process(0)  # skip interpreter finalization (the gloo exit race; see distenv.exit_process)
