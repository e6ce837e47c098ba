"""Issue 35: classes of round 626-631's first look (docs/measured/cpu2/audit_heldout_round626.txt), fixed after
it, quiet and loud; each test fails at the first look's code (d6c9d24). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

VAL = ("import torch, torch.distributed as dist\nfrom contextlib import contextmanager\n"
       "@contextmanager\ndef zero_first(rank):\n    if rank not in [-1, 0]:\n        dist.barrier()\n    yield\n"
       "    if rank == 0:\n        dist.barrier()\ndef create_dataloader(path, rank=0):\n"
       "    with zero_first(rank):\n        data = [torch.ones(2)] * 4\n    return data\n"
       "def run(data, model=None, dataloader=None):\n    training = model is not None\n    if not training:\n"
       "        model = torch.nn.Linear(2, 2)\n        dataloader = create_dataloader(data)\n"
       "    return [model(x).sum() for x in dataloader]\n")
TRAIN = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
         "import val\nif __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
         "    model = DDP(torch.nn.Linear(2, 2))\n    ema = torch.nn.Linear(2, 2)\n"
         "    for epoch in range(2):\n        model(torch.ones(2)).sum().backward()\n"
         "        if dist.get_rank() == 0:\n            results = val.run('data.yaml', MODEL)\n")


def test_an_arm_a_local_test_of_a_handed_parameter_switches_off(tmp_path):
    """YOLOv5 (yolov5_obb): rank 0 alone runs `val.run(data, model=ema.ema, dataloader=val_loader)`, whose
    `training = model is not None; if not training: ... create_dataloader(...)` (a barrier inside) never runs
    for that call: no collective-under-rank0. Called without a model, it reaches the barrier."""
    given = _project(tmp_path / "given", {"val.py": VAL, "train.py": TRAIN.replace(
        "MODEL", "model=ema.ema, dataloader=[torch.ones(2)]")})
    assert not _rules(given, "collective-under-rank0")
    bare = _project(tmp_path / "bare", {"val.py": VAL, "train.py": TRAIN.replace("MODEL", "dataloader=None")})
    assert _rules(bare, "collective-under-rank0")


FID = ("import torch, torch.distributed as dist\n"
       "def calculate_fid(netG, loader):\n    n_gpu = dist.get_world_size()\n    preds = []\n"
       "    for x in loader:\n        pred = netG(x)\n        output = [torch.empty_like(pred) for _ in range(n_gpu)]\n"
       "        dist.all_gather(output, pred)\n        preds.append(torch.cat(output))\n    return preds\n"
       "def test(netG, loader):\n    return calculate_fid(netG, loader)\n"
       "def eval(netG, loader):\n    netG.eval()\n    out = [torch.empty(2)]\n"
       "    dist.all_gather(out, netG(loader[0]))\n"
       "    return out\n")
MAIN = ("import argparse\nimport torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom modules import test\n"
        "def main(args):\n    netG = torch.nn.Linear(2, 2)\n    if args.multi_gpus:\n        netG = DDP(netG)\n"
        "    netG.eval()\n    for epoch in range(2):\n        netG(torch.ones(2)).sum().backward()\n"
        "        fid = test(netG, [torch.ones(2)])\nif __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--multi_gpus', action='store_true')\n    args = p.parse_args()\n    torch.manual_seed(0)\n"
        "    if args.multi_gpus:\n        dist.init_process_group('nccl')\n    main(args)\n")


def test_a_main_block_that_holds_the_switch_is_no_switch_and_a_method_call_names_no_module_function(tmp_path):
    """DF-GAN: `if __name__ == '__main__':` holds `if args.multi_gpus: init_process_group(...)` and then
    `main(args)`, whose test() -> calculate_fid() all-gathers with no switch: collective-outside-switch there (the
    __main__ block is not the arm that sets up the group). And modules.py's own `def eval(...)`, named only by
    `netG.eval()` attributes, never runs: its all_gather is no finding."""
    found = _rules(_project(tmp_path, {"modules.py": FID, "train.py": MAIN}), "collective-outside-switch")
    assert [f.line for f in found] == [8]


ACC = ("import torch, torch.distributed as dist, yaml\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
       "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
       "    config = yaml.safe_load(open('configs/train.yaml'))\n    op_sc = {'optimizer': config['optimizer']}\n"
       "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
       "    op_sc['optimizer']['module'] = opt\n    for last_iter in range(8):\n"
       "        loss = model(torch.ones(2)).sum() / op_sc['optimizer']['step_iteration']\n        loss.backward()\n"
       "        if (last_iter + 1) % op_sc['optimizer']['step_iteration'] == 0:\n"
       "            op_sc['optimizer']['module'].step()\n            op_sc['optimizer']['module'].zero_grad()\n")


def test_an_accumulation_count_read_by_key_that_every_yaml_sets_to_one(tmp_path):
    """GETMusic's solver: `if (self.last_iter + 1) % op_sc['optimizer']['step_iteration'] == 0: step()`, the key
    `step_iteration: 1` in the project's YAML: every micro-batch steps, nothing accumulates (no
    accumulation-without-no-sync). At 4 it accumulates."""
    one = _project(tmp_path / "one", {"train.py": ACC, "configs/train.yaml": "optimizer:\n  step_iteration: 1\n"})
    assert not _rules(one, "accumulation-without-no-sync")
    four = _project(tmp_path / "four", {"train.py": ACC, "configs/train.yaml": "optimizer:\n  step_iteration: 4\n"})
    assert _rules(four, "accumulation-without-no-sync")


LAUNCH = ("import torch.multiprocessing as mp\nimport torch.distributed as dist\n"
          "def launch(fn, n_gpu, dist_url=None, args=()):\n    if n_gpu > 1:\n"
          "        mp.spawn(distributed_worker, nprocs=n_gpu, args=(fn, n_gpu, dist_url, args))\n    else:\n"
          "        fn(0, *args)\ndef distributed_worker(local_rank, fn, world_size, dist_url, args):\n"
          "    dist.init_process_group('nccl', init_method=dist_url, world_size=world_size, rank=local_rank)\n"
          "    fn(local_rank, *args)\n")
SPAWNER = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nfrom launch import launch\n"
           "def main_worker(local_rank, seed):\n    WORKER_SEED\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    model(torch.ones(2)).sum().backward()\ndef main():\n    torch.manual_seed(42)\n"
           "    launch(main_worker, torch.cuda.device_count(), 'env://', args=(42,))\n"
           "if __name__ == '__main__':\n    main()\n")


def test_a_seed_before_a_launch_helper_that_hands_the_worker_in_spawn_args(tmp_path):
    """GETMusic: `seed_everything(42)` in main(), then `launch(main_worker, ...)`, whose `mp.spawn(
    distributed_worker, args=(fn, ...))` ends in `fn(local_rank, *args)`: main_worker runs in fresh processes that
    never seed (seed-before-spawn). A seed inside main_worker is quiet."""
    loud = _project(tmp_path / "parent", {"launch.py": LAUNCH, "train.py": SPAWNER.replace("WORKER_SEED", "pass")})
    assert [f.line for f in _rules(loud, "seed-before-spawn")] == [10]
    quiet = _project(tmp_path / "worker", {"launch.py": LAUNCH, "train.py": SPAWNER.replace(
        "WORKER_SEED", "torch.manual_seed(seed)")})
    assert not _rules(quiet, "seed-before-spawn")
