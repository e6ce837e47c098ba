"""Issue 35: classes of round 566-571's first look (docs/measured/cpu2/audit_heldout_round566.txt), fixed after
it, quiet and loud; each test fails at the first look's code (8a84374). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_no_seed_is_shown_where_the_spawned_worker_sets_up_the_group(tmp_path):
    """EdgeYOLO: `train(cfg)` in the script is the package's launch(), whose `mp.start_processes(train_single,
    ...)` starts a worker that calls init_process_group and builds the trainer: no-seed is shown at the worker's
    setup line, where the seed belongs, not at the script's call. Seeded in the worker, nothing is reported."""
    launch = (DDP + "import torch.multiprocessing as mp\ndef train_single(rank, params):\n"
              "    dist.init_process_group('gloo', rank=rank, world_size=2)\n    SEED\n"
              "    model = DDP(torch.nn.Linear(2, 2))\ndef launch(cfg):\n"
              "    mp.start_processes(train_single, nprocs=2, args=(cfg,), start_method='spawn')\n")
    script = "from launch_train import launch as train\nif __name__ == '__main__':\n    train('cfg.yaml')\n"
    unseeded = _project(tmp_path / "unseeded", {"launch_train.py": launch.replace("SEED", "pass"),
                                                "train.py": script})
    assert [(f.path.rsplit("/", 1)[-1], f.line) for f in _rules(unseeded, "no-seed")] == [("launch_train.py", 5)]
    seeded = _project(tmp_path / "seeded", {"launch_train.py": launch.replace("SEED", "torch.manual_seed(0)"),
                                            "train.py": script})
    assert not _rules(seeded, "no-seed")


def test_an_ema_pegged_to_the_model_until_a_start_iteration_is_resynced(tmp_path):
    """IC-GAN (BigGAN): `utils.seed_rng(seed + rank)`, then `ema = utils.ema(G, G_ema, decay, ema_start)` before
    the DDP wrap, whose update copies G outright while `itr < start_itr`: the per-rank init is overwritten by the
    synchronised weights (no seed-per-rank). An EMA class that always decays keeps rank 1's own init."""
    utils = ("import torch\nclass ema:\n    def __init__(self, source, target, decay=0.9999, start_itr=0):\n"
             "        self.source, self.target, self.decay, self.start_itr = source, target, decay, start_itr\n"
             "    def update(self, itr=None):\n        PEG\n        for p, q in zip(self.target.parameters(), "
             "self.source.parameters()):\n            p.data.mul_(decay).add_(q.data * (1 - decay))\n")
    trainer = (DDP + "import utils\ndef run(rank, config):\n    torch.manual_seed(config['seed'] + rank)\n"
               "    dist.init_process_group('gloo')\n    G = torch.nn.Linear(2, 2)\n    G_ema = torch.nn.Linear(2, 2)\n"
               "    ema = utils.ema(G, G_ema, config['ema_decay'], config['ema_start'])\n    G = DDP(G)\n"
               "    for itr in range(10):\n        G(torch.ones(2)).sum().backward()\n        ema.update(itr)\n"
               "if __name__ == '__main__':\n    run(dist.get_rank(), {'seed': 0, 'ema_decay': 0.999, "
               "'ema_start': 2000})\n")
    pegged = "if itr and itr < self.start_itr:\n            decay = 0.0\n        else:\n            decay = self.decay"
    assert not _rules(_project(tmp_path / "pegged", {"utils.py": utils.replace("PEG", pegged),
                                                     "trainer.py": trainer}), "seed-per-rank")
    assert _rules(_project(tmp_path / "decays", {"utils.py": utils.replace("PEG", "decay = self.decay"),
                                                 "trainer.py": trainer}), "seed-per-rank")


def test_a_step_function_a_factory_returns_is_what_the_loop_calls(tmp_path):
    """IC-GAN: `train = train_fns.GAN_training_function(G, D, ...)` inside the module's own `def train()`, then
    `metrics = train(x, y)`: the call runs the closure the factory returns, whose dict of `G_loss` is rank 0's own
    when rank 0 logs it (rank0-local-loss). A closure that returns no loss logs none."""
    fns = ("import torch\ndef GAN_training_function(G, opt):\n    def train(x):\n        G_loss = G(x).sum()\n"
           "        opt.zero_grad()\n        G_loss.backward()\n        opt.step()\n        return OUT\n"
           "    return train\n")
    trainer = (DDP + "import train_fns\ndef train(rank):\n    dist.init_process_group('gloo')\n"
               "    torch.manual_seed(0)\n"
               "    G = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(G.parameters(), lr=0.1)\n"
               "    train = train_fns.GAN_training_function(G, opt)\n    for x in [torch.ones(2)] * 4:\n"
               "        metrics = train(x)\n        if rank == 0:\n            print(metrics)\n"
               "if __name__ == '__main__':\n    train(dist.get_rank())\n")
    losses = _project(tmp_path / "losses", {"train_fns.py": fns.replace("OUT", "{'G_loss': float(G_loss.item())}"),
                                            "trainer.py": trainer})
    assert _rules(losses, "rank0-local-loss")
    sizes = _project(tmp_path / "sizes", {"train_fns.py": fns.replace("OUT", "{'batch': x.shape[0]}"),
                                          "trainer.py": trainer})
    assert not _rules(sizes, "rank0-local-loss")


def test_padding_counts_only_where_an_evaluation_that_runs_with_it_reduces(tmp_path):
    """CLaMP 3: train_cls.py pads its evaluation shards and reduces nothing; its sibling script
    train_clamp3_audio.py reduces its evaluation loss. The padding in train_cls.py counts nothing twice (no
    eval-padding-duplicates there); one in the reducing script does."""
    head = (DDP + "from torch.utils.data import DataLoader, DistributedSampler\n"
            "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
            "    model = DDP(torch.nn.Linear(2, 2))\n    eval_set = [torch.ones(2)] * 5\n"
            "    eval_sampler = DistributedSampler(eval_set)\n"
            "    eval_loader = DataLoader(eval_set, sampler=eval_sampler)\n")
    quiet = head + "    with torch.no_grad():\n        for x in eval_loader:\n            acc = model(x).sum().item()\n"
    loud = head + ("    with torch.no_grad():\n        for x in eval_loader:\n            loss = model(x).sum()\n"
                   "            dist.all_reduce(loss)\n")
    root = _project(tmp_path / "two", {"classification/train_cls.py": quiet, "code/train_audio.py": loud})
    assert [f.path.rsplit("/", 1)[-1] for f in _rules(root, "eval-padding-duplicates")] == ["train_audio.py"]


def test_set_epoch_under_the_switch_names_the_switch_and_the_sampler(tmp_path):
    """CrossViT: the sampler is built in every run, `if args.distributed: sampler.set_epoch(epoch)`: the finding
    at the set_epoch names the `if` line and the sampler as related places, where the reader looks."""
    src = (DDP + "import argparse\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
           "p = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\n"
           "args = p.parse_args()\nif args.distributed:\n    dist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
           "data = [torch.ones(2)] * 8\nsampler = DistributedSampler(data, num_replicas=1, rank=0)\n"
           "loader = DataLoader(data, sampler=sampler)\nmodel = torch.nn.Linear(2, 2)\nif args.distributed:\n"
           "    model = DDP(model)\nfor epoch in range(3):\n    if args.distributed:\n"
           "        sampler.set_epoch(epoch)\n    for x in loader:\n        model(x).sum().backward()\n")
    found = _rules(_project(tmp_path, {"main.py": src}), "set-epoch-missing")
    assert [(f.line, sorted(r[1] for r in f.related)) for f in found] == [(19, [12, 18])]


def test_a_seed_after_the_model_is_built_leaves_its_init_unseeded(tmp_path):
    """GPST: `model = create_model(...)`, then `set_seed(args.seed)` forty lines on, before the wrap: rank 0's
    init is unseeded (no-seed, at the seed, the build as related). A conditional `model.from_pretrain(...)` under
    an option the project's launch script passes to this script replaces the init: quiet."""
    src = (DDP + "import argparse\ndef set_seed(s):\n    torch.manual_seed(s)\ndef create_model():\n"
           "    return torch.nn.Linear(2, 2)\nif __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
           "    p.add_argument('--pretrain_dir', default=None)\n    p.add_argument('--seed', type=int, default=0)\n"
           "    args = p.parse_args()\n    dist.init_process_group('gloo')\n    model = create_model()\n"
           "    if args.pretrain_dir is not None:\n        model.from_pretrain(args.pretrain_dir)\n"
           "    set_seed(args.seed)\n    model = DDP(model)\n")
    late = _project(tmp_path / "late", {"trainer.py": src, "run.sh": "torchrun --nproc_per_node=2 trainer.py "
                                        "--seed 1\n"})
    assert [(f.line, [r[1] for r in f.related]) for f in _rules(late, "no-seed")] == [(17, [14])]
    loaded = _project(tmp_path / "loaded", {"trainer.py": src, "run.sh": "torchrun --nproc_per_node=2 trainer.py "
                                            "--pretrain_dir ckpt\n"})
    assert not _rules(loaded, "no-seed")
    early = _project(tmp_path / "early", {"trainer.py": src.replace("    set_seed(args.seed)\n", "").replace(
        "    model = create_model()\n", "    set_seed(args.seed)\n    model = create_model()\n")})
    assert not _rules(early, "no-seed")
