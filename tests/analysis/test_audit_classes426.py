"""Issue 35: classes of round 426-431's first look (docs/measured/cpu2/audit_heldout_round426.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (6ef527d)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_rank_guard_against_a_module_constant(tmp_path):
    """LMP: `HOST_RANK: Final[int] = 0`, then `if args.rank == HOST_RANK: writer.add_scalar('train-loss', ...)`:
    rank 0 alone logs its own loss (rank0-local-loss), not every rank. A constant of 1 is no rank-0 guard."""
    train = (DDP + "import argparse\nfrom typing import Final\nHOST_RANK: Final[int] = VALUE\n"
             "parser = argparse.ArgumentParser()\nparser.add_argument('--rank', type=int, required=True)\n"
             "args = parser.parse_args()\ntorch.manual_seed(0)\ndist.init_process_group('gloo', rank=args.rank)\n"
             "model = DDP(torch.nn.Linear(2, 2))\nfor step in range(4):\n    loss = model(torch.ones(2)).sum()\n"
             "    loss.backward()\n    if args.rank == HOST_RANK:\n        print('train-loss', loss.item())\n")
    assert _rules(_project(tmp_path / "zero", {"train.py": train.replace("VALUE", "0")}), "rank0-local-loss")
    assert not _rules(_project(tmp_path / "one", {"train.py": train.replace("VALUE", "1")}), "rank0-local-loss")


def test_a_rank_stored_on_the_options_in_another_module(tmp_path):
    """PersFormer: ddp.py's `args.proc_id = args.local_rank`, then runner.py's `if args.proc_id == 0:
    self.save_checkpoint(...)`: rank 0 alone saves (no save-on-every-rank). With proc_id set from something that
    is no rank, every rank saves."""
    ddp = "def setup(args):\n    args.proc_id = VALUE\n"
    runner = (DDP + "from ddp import setup\ndef train(args):\n    setup(args)\n    torch.manual_seed(0)\n"
              "    dist.init_process_group('gloo')\n    model = DDP(torch.nn.Linear(2, 2))\n"
              "    for epoch in range(2):\n"
              "        model(torch.ones(2)).sum().backward()\n        if args.proc_id == 0:\n"
              "            torch.save(model.module.state_dict(), 'ckpt.pth')\n"
              "if __name__ == '__main__':\n    import argparse\n    parser = argparse.ArgumentParser()\n"
              "    parser.add_argument('--local_rank', type=int, default=0)\n    train(parser.parse_args())\n")
    ranked = {"runner.py": runner, "ddp.py": ddp.replace("VALUE", "args.local_rank")}
    assert not _rules(_project(tmp_path / "ranked", ranked), "save-on-every-rank")
    other = {"runner.py": runner, "ddp.py": ddp.replace("VALUE", "len(args.__dict__)")}
    assert _rules(_project(tmp_path / "other", other), "save-on-every-rank")


def test_an_option_a_config_function_turns_off(tmp_path):
    """PersFormer: --pretrained defaults to True, but config/persformer_openlane.py's `def config(args): ...
    args.pretrained = False` is the run's value: the `elif args.pretrained:` torch.load never runs (quiet). A
    config that sets it True leaves the load without map_location on every rank (load-without-map-location)."""
    config = "def config(args):\n    args.batch_size = 8\n    args.pretrained = VALUE\n"
    train = (DDP + "import argparse\nfrom configs.persformer import config\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--pretrained', type=bool, default=True)\nargs = parser.parse_args()\nconfig(args)\n"
             "torch.manual_seed(0)\ndist.init_process_group('gloo')\nmodel = torch.nn.Linear(2, 2)\n"
             "if args.pretrained:\n    checkpoint = torch.load('feat_model.pth')\n"
             "    model.load_state_dict(checkpoint['state_dict'])\nmodel = DDP(model)\n")
    off = {"train.py": train, "configs/persformer.py": config.replace("VALUE", "False")}
    assert not _rules(_project(tmp_path / "off", off), "load-without-map-location")
    on = {"train.py": train, "configs/persformer.py": config.replace("VALUE", "True")}
    assert _rules(_project(tmp_path / "on", on), "load-without-map-location")


def test_a_gather_of_features_made_under_no_grad(tmp_path):
    """MERL's val(): the model runs in `with torch.no_grad():`, then `all_gather(agg, proj[0])` and
    `agg[rank] = proj[0]`: nothing carries a gradient (no gather-without-grad). The same in training, where the
    features carry one, is the finding."""
    trainer = (DDP + "class Trainer:\n    def __init__(self, model):\n        self.model = model\n"
               "    def step(self, x):\n        OUTER\n            proj = self.model(x)\n"
               "            world_size = dist.get_world_size()\n            with torch.no_grad():\n"
               "                agg = [torch.zeros_like(proj[0]) for _ in range(world_size)]\n"
               "                dist.all_gather(agg, proj[0])\n            agg[dist.get_rank()] = proj[0]\n"
               "            allp = torch.cat(agg)\n            loss = (allp @ allp.T).logsumexp(1).mean()\n"
               "        return loss\n")
    main = (DDP + "from trainer import Trainer\ntorch.manual_seed(0)\ndist.init_process_group('gloo')\n"
            "t = Trainer(DDP(torch.nn.Linear(2, 2)))\nfor data in [torch.ones(4, 2)] * 3:\n"
            "    LOSS\n")
    evaluate = {"trainer.py": trainer.replace("OUTER", "with torch.no_grad():"),
                "main.py": main.replace("LOSS", "print(t.step(data).item())")}
    assert not _rules(_project(tmp_path / "eval", evaluate), "gather-without-grad")
    training = {"trainer.py": trainer.replace("OUTER", "if True:"),
                "main.py": main.replace("LOSS", "loss = t.step(data)\n    loss.backward()")}
    assert _rules(_project(tmp_path / "train", training), "gather-without-grad")


def test_a_script_that_ends_in_a_bare_call_of_its_ddp_main(tmp_path):
    """MERL's pretrain/main.py: no `__main__` block, the module ends in `ddp_main()`, whose body sets up the group
    and wraps: a script, so its trainer's shuffling sampler without set_epoch is found (set-epoch-missing). With
    set_epoch in the epoch loop it is quiet."""
    trainer = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\nclass Trainer:\n"
               "    def __init__(self, model):\n        self.model = model\n    def train(self, dataset):\n"
               "        sampler = DistributedSampler(dataset)\n"
               "        loader = DataLoader(dataset, batch_size=2, sampler=sampler)\n        for epoch in range(3):\n"
               "SET            for x in loader:\n                self.model(x).sum().backward()\n")
    main = (DDP + "import sys\nsys.path.append('../utils')\nfrom trainer import Trainer\ndef ddp_main():\n"
            "    torch.manual_seed(0)\n    dist.init_process_group('gloo')\n"
            "    Trainer(DDP(torch.nn.Linear(2, 2))).train([torch.ones(2)] * 8)\n\n\nddp_main()\n")
    loud = {"pretrain/main.py": main, "utils/trainer.py": trainer.replace("SET", "")}
    assert _rules(_project(tmp_path / "loud", loud), "set-epoch-missing")
    quiet = {"pretrain/main.py": main, "utils/trainer.py": trainer.replace(
        "SET", "            sampler.set_epoch(epoch)\n")}
    assert not _rules(_project(tmp_path / "quiet", quiet), "set-epoch-missing")


def test_a_worker_taken_by_name_with_getattr(tmp_path):
    """DeepAVFusion: the launcher runs `getattr(importlib.import_module(args.worker), 'main_worker')`; train.py's
    main_worker, named nowhere else, scales the lr by the world size (lr-grows-with-world-size). Taken under
    another name than the function's, nothing runs it here (quiet)."""
    launcher = ("import importlib, torch.multiprocessing as mp\nclass Args:\n    worker = 'train'\n"
                "def main():\n    args = Args()\n    fn = getattr(importlib.import_module(args.worker), NAME)\n"
                "    mp.spawn(fn, nprocs=2, args=(args,))\nif __name__ == '__main__':\n    main()\n")
    train = (DDP + "def main_worker(local_rank, args):\n    torch.manual_seed(0)\n"
             "    dist.init_process_group('gloo', rank=local_rank, world_size=2)\n"
             "    eff_batch_size = 64 * dist.get_world_size()\n    lr = 1.5e-4 * eff_batch_size / 256\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=lr)\n")
    named = {"launcher.py": launcher.replace("NAME", "'main_worker'"), "train.py": train}
    assert _rules(_project(tmp_path / "named", named), "lr-grows-with-world-size")
    other = {"launcher.py": launcher.replace("NAME", "'other_worker'"), "train.py": train}
    assert not _rules(_project(tmp_path / "other", other), "lr-grows-with-world-size")
