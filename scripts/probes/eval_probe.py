"""Evaluate a run's model.pt on every rank and aggregate the accuracy four ways (chapter 08, article §5.3).

    LAB_EVAL_MODEL=runs/A/model.pt LAB_EVAL_N=101 torchrun --nproc-per-node 2 scripts/probes/eval_probe.py \
        model=bn_net ...

Every rank loads the weights onto its own device (map_location), evaluates its shard of the eval set (the
first LAB_EVAL_N digits) for each sharding of lab_utils.core.eval_metrics.SHARDINGS, one sample per forward (so a
sample's prediction is the same bits whichever rank or shard evaluates it), then:
- all_reduce(correct) and all_reduce(total): the article's code;
- all_gather of each rank's (correct, total): the simple mean of per-rank accuracies;
- all_gather_object of (sample id, correct): the de-duplicated count (accelerate's gather_for_metrics idea).
Rank 0 writes OUT/eval.json. With one process it is the exact, single-GPU number.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import checkpoint, config, distenv, eval_metrics, runfiles, workloads  # noqa: E402


def correct_flags(model, dataset, indices: list[int], device) -> list[int]:
    flags = []
    with torch.no_grad():
        for i in indices:
            s = dataset[i]
            pred = model(s["x"].unsqueeze(0).to(device)).argmax(-1).item()
            flags.append(int(pred == int(s["y"])))
    return flags


@record
def main() -> None:
    cfg = config.resolve(sys.argv[1:], int(os.environ.get("WORLD_SIZE", "1")))
    n = int(os.environ.get("LAB_EVAL_N", "101"))
    env = distenv.setup(cfg)
    out = Path(cfg["out_dir"])
    heart = runfiles.Heartbeat(out, env.rank)
    heart.beat(step=0, phase="setup")
    torch.manual_seed(cfg["seed"])
    wl = workloads.build(cfg)
    model = wl.model.to(env.device)
    model.load_state_dict(checkpoint.load_weights(os.environ["LAB_EVAL_MODEL"], env.device))  # map_location
    model.eval()
    report = {"n": n, "world_size": env.world_size, "padding": eval_metrics.padding(n, env.world_size)}
    for how in eval_metrics.SHARDINGS:
        ids = eval_metrics.shard(n, env.rank, env.world_size, how)
        flags = correct_flags(model, wl.dataset, ids, env.device)
        heart.beat(phase="all-reduce loss")
        counts = torch.tensor([sum(flags), len(flags)], dtype=torch.int64, device=env.device)
        per_rank = [counts.clone() for _ in range(env.world_size)]
        pairs = [list(zip(ids, flags, strict=True))]
        if env.distributed:
            dist.all_gather(per_rank, counts)
            dist.all_reduce(counts)  # the article's §5.3: numerator and denominator summed over ranks
            gathered = [None] * env.world_size
            dist.all_gather_object(gathered, pairs[0])
            pairs = gathered
        per_rank = [tuple(int(v) for v in c.tolist()) for c in per_rank]
        try:
            dedup = eval_metrics.deduplicated([p for rank_pairs in pairs for p in rank_pairs], n)
        except ValueError as e:
            dedup = str(e)
        report[how] = {"per_rank": per_rank, "evaluated": int(counts[1]), "correct": int(counts[0]),
                       "article_all_reduce": int(counts[0]) / int(counts[1]),
                       "simple_mean": eval_metrics.simple_mean(per_rank), "deduplicated": dedup}
    heart.beat(phase="finished")
    if env.is_main:
        runfiles.write_json(report, out / "eval.json")
    distenv.finish(env)  # teardown, then the process ends here (see distenv.finish)


if __name__ == "__main__":
    main()
    distenv.exit_process(0)
