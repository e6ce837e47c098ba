"""What DDP copies at wrap time (chapters 02 and 05), measured on every rank. Launched by torchrun.

Rank r seeds `seed + r` as the article's §2.2 does, builds a BNNet, runs one train-mode forward on its own
batch (so its BatchNorm running statistics are its own), then wraps one copy in DDP per buffer argument:
the deprecated `broadcast_buffers=True/False` (the article's name) and, where this torch has it,
`forward_sync_buffers=True/False` (its replacement since torch 2.13; feature-detected). Each rank writes the
parameter and buffer fingerprints before and after each wrap, and the warnings each wrap raised, to
runs/NAME/probe/rank{r}.json (read by lab_utils.launch.probes.read_probe).
"""

import copy
import os
import sys
import warnings
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import config, ddp, distenv, runfiles  # noqa: E402
from lab_utils.core.workloads.bn_net import IMAGE_SIZE, BNNet  # noqa: E402


def probe(cfg: dict, env) -> dict:
    torch.manual_seed(cfg["seed"] + env.rank)  # the article's set_seed(42 + rank), §2.2
    model = BNNet().to(env.device)
    model.train()
    with torch.no_grad():  # one forward on this rank's own batch: its BN running stats become its own
        model(torch.randn(8, 1, IMAGE_SIZE, IMAGE_SIZE).to(env.device))
    record_ = {"rank": env.rank, "seed": cfg["seed"] + env.rank,
               "before": {"params": runfiles.fingerprint(model), "buffers": runfiles.buffer_fingerprint(model)}}
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    names = ("broadcast_buffers", "forward_sync_buffers") if ddp.has_forward_sync_buffers() else ("broadcast_buffers",)
    for name in names:
        for flag in (True, False):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")  # every wrap's own warnings, not only the first one's
                wrapped = DDP(copy.deepcopy(model), device_ids=device_ids, **{name: flag})
            record_[f"{name}={flag}"] = {"params": runfiles.fingerprint(wrapped),
                                         "buffers": runfiles.buffer_fingerprint(wrapped),
                                         "warnings": [f"{w.category.__name__}: {str(w.message)[:160]}"
                                                      for w in caught]}
    return record_


@record
def main(argv: list[str]) -> None:
    cfg = config.resolve(argv, int(os.environ.get("WORLD_SIZE", "1")))
    env = distenv.setup(cfg)
    heart = runfiles.Heartbeat(Path(cfg["out_dir"]), env.rank)  # pid and phase for a hang's report
    heart.beat(step=-1, phase="setup")
    if not env.distributed:
        raise SystemExit("the wrap probe needs torchrun with nproc >= 2")
    out = Path(cfg["out_dir"]) / "probe"
    out.mkdir(parents=True, exist_ok=True)
    runfiles.write_json(probe(cfg, env), out / f"rank{env.rank}.json")
    heart.beat(phase="finished")
    distenv.finish(env)  # on success only, as train.py; ends the process here (see distenv.finish)


if __name__ == "__main__":
    main(sys.argv[1:])
    distenv.exit_process(0)  # skip interpreter finalization (the gloo exit race; see distenv.exit_process)
