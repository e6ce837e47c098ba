"""Issue 35: classes of round 444-449's first look (docs/measured/cpu2/audit_heldout_round444.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (1e19e7e)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_port_from_a_yaml_config_names_the_config_line(tmp_path):
    """GPV-1: `dist.init_process_group(init_method=cfg.dist_url, ...)` with `dist_url: tcp://localhost:10001` in
    configs/exp/gpv.yaml: the hard-coded-master-port finding names the YAML line, where a labeller files it."""
    train = (DDP + "import yaml, torch.multiprocessing as mp\n"
             "def main_worker(gpu, cfg):\n"
             "    dist.init_process_group(backend='gloo', init_method=cfg.dist_url,\n"
             "                            world_size=2, rank=gpu)\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\nif __name__ == '__main__':\n"
             "    cfg = yaml.safe_load(open('configs/exp/gpv.yaml'))\n"
             "    mp.spawn(main_worker, nprocs=2, args=(cfg,))\n")
    config = "num_workers: 4\ndist_url: 'tcp://localhost:10001'\ndist_backend: nccl\n"
    hits = _rules(_project(tmp_path / "p", {"train.py": train, "configs/exp/gpv.yaml": config}),
                  "hard-coded-master-port")
    assert any(path.endswith("gpv.yaml") and line == 2 for h in hits for path, line in h.related), [
        (h.path, h.line, h.related) for h in hits]


def test_a_rank0_save_in_the_arm_without_fsdp(tmp_path):
    """STARFlow's save_model: `if not args.fsdp: if dist.local_rank == 0: torch.save(states, f)` else dcp.save on
    every rank: the torch.save never sees a sharded model (no fsdp2-rank0-saves-sharded). In the FSDP arm it is
    the finding."""
    train = ("import argparse, torch, torch.distributed as dist\nimport torch.distributed.checkpoint as dcp\n"
             "from torch.distributed.fsdp import fully_shard\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--fsdp', type=int, default=1)\nargs = parser.parse_args()\n"
             "torch.manual_seed(0)\ndist.init_process_group('gloo')\nmodel = fully_shard(torch.nn.Linear(2, 2))\n"
             "def save_model(model, f):\n    states = model.state_dict()\n    if TEST:\n"
             "        if dist.get_rank() == 0:\n            torch.save(states, f)\n    else:\n"
             "        dcp.save(states, checkpoint_id=f)\nsave_model(model, 'ckpt')\n")
    ddp_arm = train.replace("TEST", "not args.fsdp")
    assert not _rules(_project(tmp_path / "ddp", {"train.py": ddp_arm}), "fsdp2-rank0-saves-sharded")
    fsdp_arm = train.replace("TEST", "args.fsdp")
    assert _rules(_project(tmp_path / "fsdp", {"train.py": fsdp_arm}), "fsdp2-rank0-saves-sharded")


def test_an_iteration_count_modulo_a_count_of_iterations(tmp_path):
    """Daft-Exprt: `iteration` is loaded with the rank's own checkpoint (so rank-tainted), and `if iteration %
    hparams.iters_check_for_model_improvement == 0:` guards a validation and a barrier every rank reaches: a step
    count, not a rank test (no collective-under-rank0). Under `if rank == 0:` the barrier hangs."""
    train = (DDP + "class H:\n    iters_check_for_model_improvement = 100\nhparams = H()\n"
             "def load_checkpoint(path, rank):\n"
             "    return torch.load(path, map_location=f'cuda:{rank}')['iteration']\n"
             "def train(rank):\n    torch.manual_seed(0)\n"
             "    dist.init_process_group('gloo', rank=rank, world_size=2)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    iteration = load_checkpoint('c.pt', rank)\n"
             "    for step in range(1000):\n        model(torch.ones(2)).sum().backward()\n        iteration += 1\n"
             "        if TEST:\n            dist.barrier()\n"
             "if __name__ == '__main__':\n    torch.multiprocessing.spawn(train, nprocs=2)\n")
    count = train.replace("TEST", "iteration % hparams.iters_check_for_model_improvement == 0")
    assert not _rules(_project(tmp_path / "count", {"train.py": count}), "collective-under-rank0")
    rank0 = train.replace("TEST", "rank == 0")
    assert _rules(_project(tmp_path / "rank0", {"train.py": rank0}), "collective-under-rank0")
