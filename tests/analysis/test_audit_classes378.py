"""Issue 35: classes of round 378-383's first look (docs/measured/cpu2/audit_heldout_round378.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (09fae8f)."""

from test_audit import _project
from test_audit_classes246 import SEED_ONLY, _rules

SETUP = ("dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
STEP = "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"


def test_a_loss_in_a_bar_s_postfix_string(tmp_path):
    """VITS2: `loader.set_postfix_str(f"{losses_str}, {global_step}")` under `if rank == 0:`, losses_str built
    from the step's own losses: rank 0's bar shows rank 0's micro-batch loss (rank0-local-loss). A postfix of the
    step count alone is quiet."""
    train = SEED_ONLY + SETUP + ("from tqdm import tqdm\nloader = tqdm(range(3), disable=rank != 0)\n"
                                 "for step in loader:\n" + STEP + "    if rank == 0:\n"
                                 "        losses_str = ' '.join(f'{x.item():.3f}' for x in [loss])\n"
                                 "        loader.set_postfix_str(f'{SHOWN}, {step}')\n")
    assert _rules(_project(tmp_path / "loss", {"train.py": train.replace("SHOWN", "losses_str")}),
                  "rank0-local-loss")
    assert not _rules(_project(tmp_path / "step", {"train.py": train.replace("SHOWN", "step")}), "rank0-local-loss")


def test_sync_bn_under_the_switch_that_sets_up_the_process_group(tmp_path):
    """MatteFormer: `if CONFIG.dist: init_process_group(...)` in main.py and `if CONFIG.dist: self.G =
    SyncBatchNorm.convert_sync_batchnorm(self.G)` in the trainer, CONFIG.dist False in the config module (the TOML
    turns it on): the distributed switch, which every DDP run turns on, not an opt-in to SyncBatchNorm (no
    batchnorm-without-sync). An opt-in flag of its own, off by default, is found."""
    config = "class C:\n    pass\nCONFIG = C()\nCONFIG.dist = False\nCONFIG.sync = False\n"
    trainer = ("import torch\nfrom torch.nn import SyncBatchNorm\nfrom torch.nn.parallel import "
               "DistributedDataParallel as DDP\nfrom config import CONFIG\nclass Trainer:\n"
               "    def __init__(self):\n        self.G = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), "
               "torch.nn.BatchNorm2d(3))\n        if CONFIG.FLAG:\n"
               "            self.G = SyncBatchNorm.convert_sync_batchnorm(self.G)\n"
               "        if CONFIG.dist:\n            self.G = DDP(self.G)\n")
    main = ("import torch\nfrom config import CONFIG\nfrom trainer import Trainer\ntorch.manual_seed(0)\n"
            "if CONFIG.dist:\n    torch.distributed.init_process_group('nccl', init_method='env://')\n"
            "trainer = Trainer()\n")
    switch = {"config.py": config, "main.py": main, "trainer.py": trainer.replace("FLAG", "dist")}
    assert not _rules(_project(tmp_path / "switch", switch), "batchnorm-without-sync")
    opt_in = {**switch, "trainer.py": trainer.replace("FLAG", "sync")}
    assert _rules(_project(tmp_path / "opt_in", opt_in), "batchnorm-without-sync")


def test_a_seeding_trainer_handed_to_the_launcher_by_reference(tmp_path):
    """TAdaConv: run.py `from train import train`, `train_func = train`, `run_list.append([cfg, train_func])`,
    `launch_task(cfg, func=run[1])`, whose spawned workers call `func`: train() seeds torch and wraps in DDP, so
    the run is seeded (no no-seed). A train() that never seeds is found."""
    launcher = ("import torch\ndef run(local_rank, func, cfg):\n    torch.distributed.init_process_group('gloo', "
                "rank=local_rank, world_size=2)\n    func(cfg=cfg)\ndef launch_task(cfg, func):\n"
                "    torch.multiprocessing.spawn(run, nprocs=2, args=(func, cfg))\n")
    train = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\ndef train(cfg):\n"
             "SEED    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "    loss = model(torch.ones(2)).sum()\n    loss.backward()\n    opt.step()\n")
    run = ("from launcher import launch_task\nfrom train import train\ndef prepare(cfg):\n    train_func = train\n"
           "    return [[cfg, train_func]]\ndef main():\n    cfg = {}\n    for run in prepare(cfg):\n"
           "        launch_task(cfg=run[0], func=run[1])\nif __name__ == '__main__':\n    main()\n")
    seeded = {"launcher.py": launcher, "run.py": run, "train.py": train.replace("SEED", "    torch.manual_seed(0)\n")}
    assert not _rules(_project(tmp_path / "seeded", seeded), "no-seed")
    unseeded = {**seeded, "train.py": train.replace("SEED", "")}
    assert _rules(_project(tmp_path / "unseeded", unseeded), "no-seed")


def test_a_sync_bn_option_read_through_a_local_copy(tmp_path):
    """TAdaConv's model builder: `sync_bn = cfg.BN.SYNC`, then `if sync_bn == True and cfg.NUM_GPUS > 1:
    convert_sync_batchnorm(model)`, with BN.SYNC set by no file here: SyncBatchNorm only when an option these
    files never define is on (batchnorm-without-sync, check by hand). A config module that sets it is quiet."""
    builder = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\ndef build_model(cfg):\n"
               "    model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3))\n    try:\n"
               "        sync_bn = cfg.BN.SYNC\n        if sync_bn == True and cfg.NUM_GPUS > 1:\n"
               "            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n    except:\n"
               "        sync_bn = None\n    if cfg.NUM_GPUS > 1:\n        model = DDP(model)\n    return model\n")
    train = SEED_ONLY + ("from builder import build_model\nfrom config import cfg\n"
                         "dist.init_process_group('gloo')\nmodel = build_model(cfg)\n")
    unset = {"builder.py": builder, "train.py": train, "config.py": "cfg = None\n"}
    found = _rules(_project(tmp_path / "unset", unset), "batchnorm-without-sync")
    assert found and "cfg.BN.SYNC" in found[0].message
    set_ = {**unset, "config.py": "class N:\n    pass\ncfg = N()\ncfg.BN = N()\ncfg.BN.SYNC = True\n"}
    assert not _rules(_project(tmp_path / "set", set_), "batchnorm-without-sync")


def test_an_evaluation_reduced_through_a_project_helper_into_a_tuple(tmp_path):
    """TAdaConv: `top1_err, top5_err = du.all_reduce([top1_err, top5_err])` in eval_epoch over a padding
    DistributedSampler(shuffle=False) built by a helper for the val split, in `for i, x in enumerate(val_loader):`:
    the duplicates are counted (eval-padding-duplicates); the tuple target is no key the results are merged by (an
    inner `for k, v in parts.items(): parts[k] = ...` made it one). The same loop with no
    reduction is quiet."""
    du = ("import torch.distributed as dist\ndef all_reduce(tensors):\n    for t in tensors:\n"
          "        dist.all_reduce(t)\n    return [t / dist.get_world_size() for t in tensors]\n")
    data = ("from torch.utils.data import DataLoader, DistributedSampler\ndef build_loader(ds, split):\n"
            "    shuffle = split == 'train'\n    sampler = DistributedSampler(ds, shuffle=shuffle)\n"
            "    return DataLoader(ds, batch_size=2, sampler=sampler)\n")
    train = SEED_ONLY + ("import du\nfrom data import build_loader\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\ndef eval_epoch(val_loader, model):\n"
                         "    for i, x in enumerate(val_loader):\n        top1_err = model(x).sum()\n"
                         "        top5_err = model(x).mean()\nREDUCE        parts = {'top1': top1_err}\n"
                         "        for k, v in parts.items():\n            parts[k] = v.item()\n"
                         "        print(top1_err, top5_err, parts)\n"
                         "val_loader = build_loader(torch.ones(9, 2), 'val')\neval_epoch(val_loader, model)\n")
    reduced = train.replace("REDUCE", "        top1_err, top5_err = du.all_reduce([top1_err, top5_err])\n")
    files = {"du.py": du, "data.py": data}
    assert _rules(_project(tmp_path / "reduced", {**files, "train.py": reduced}), "eval-padding-duplicates")
    own = train.replace("REDUCE", "")
    assert not _rules(_project(tmp_path / "own", {**files, "train.py": own}), "eval-padding-duplicates")


def test_an_evaluation_reduced_through_an_absent_distributed_module(tmp_path):
    """TimeSformer: `import timesformer.utils.distributed as du` (not among the copies), then `top1_err, top5_err
    = du.all_reduce([top1_err, top5_err])` in eval_epoch: the project's own distributed helper, a reduction over
    ranks that counts the padded duplicates (eval-padding-duplicates). A module of another name (`import
    mypkg.utils.metrics as mu`, `mu.all_reduce(...)`) says nothing: quiet."""
    data = ("from torch.utils.data import DataLoader, DistributedSampler\ndef build_loader(ds, split):\n"
            "    sampler = DistributedSampler(ds, shuffle=split == 'train')\n"
            "    return DataLoader(ds, batch_size=2, sampler=sampler)\n")
    train = SEED_ONLY + ("import mypkg.utils.MOD as du\nfrom data import build_loader\n"
                         "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "def eval_epoch(val_loader, model):\n    for x in val_loader:\n"
                         "        top1_err = model(x).sum()\n        top5_err = model(x).mean()\n"
                         "        top1_err, top5_err = du.all_reduce([top1_err, top5_err])\n"
                         "        print(top1_err, top5_err)\n"
                         "val_loader = build_loader(torch.ones(9, 2), 'val')\neval_epoch(val_loader, model)\n")
    dist_ = _project(tmp_path / "dist", {"data.py": data, "train.py": train.replace("MOD", "distributed")})
    assert _rules(dist_, "eval-padding-duplicates")
    other = _project(tmp_path / "other", {"data.py": data, "train.py": train.replace("MOD", "metrics")})
    assert not _rules(other, "eval-padding-duplicates")
