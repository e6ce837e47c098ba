"""Issue 35: classes of round 354-359's first look (docs/measured/cpu2/audit_heldout_round354.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (820a3e5)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, _rules


def test_a_meter_fed_in_a_helper_is_found_at_the_helper_call(tmp_path):
    """TSP: `for sample in metric_logger.log_every(loader, ...)` prints (rank 0's console alone) what
    `compute_and_log(metric_logger, loss)` feeds it, a helper whose body runs `metric_logger.update(loss=
    loss.item())`: rank0-local-loss, found at the helper's call, where the reduction goes. A helper that feeds it
    the step count alone feeds no loss: quiet."""
    utils = ("import builtins\nclass MetricLogger:\n    def __init__(self):\n        self.meters = {}\n"
             "    def update(self, **kwargs):\n        self.meters.update(kwargs)\n"
             "    def log_every(self, iterable, freq):\n        for i, obj in enumerate(iterable):\n"
             "            yield obj\n            if i % freq == 0:\n                print(self.meters)\n"
             "def setup_for_distributed(is_master):\n    builtin_print = builtins.print\n"
             "    def print(*args, **kwargs):\n        if is_master:\n            builtin_print(*args, **kwargs)\n"
             "    builtins.print = print\n")
    train = SEED_ONLY + ("import utils\ndef compute_and_log(metric_logger, loss, step):\n"
                         "    metric_logger.update(FED)\n"
                         "def train_one_epoch(model, opt):\n    metric_logger = utils.MetricLogger()\n"
                         "    for x in metric_logger.log_every([torch.ones(2)] * 4, 2):\n"
                         "        loss = model(x).sum()\n        opt.zero_grad()\n        loss.backward()\n"
                         "        opt.step()\n        compute_and_log(metric_logger, loss, 0)\n"
                         "dist.init_process_group('gloo')\nutils.setup_for_distributed(dist.get_rank() == 0)\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "train_one_epoch(model, opt)\n")
    fed = train.replace("FED", "loss=loss.item()")
    hits = _rules(_project(tmp_path / "fed", {"train.py": fed, "utils.py": utils}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(fed, "        compute_and_log(metric_logger")]
    counted = train.replace("FED", "step=step")
    assert not _rules(_project(tmp_path / "counted", {"train.py": counted, "utils.py": utils}), "rank0-local-loss")


def test_an_lr_in_a_parameter_group_dict(tmp_path):
    """TSP: `params = [{'params': ..., 'lr': args.fc_lr * args.world_size}]` handed to SGD: the group's lr grows
    with the GPU count (lr-grows-with-world-size). A group lr that does not is quiet."""
    train = SEED_ONLY + ("import argparse\nparser = argparse.ArgumentParser()\n"
                         "parser.add_argument('--fc_lr', type=float, default=0.01)\nargs = parser.parse_args()\n"
                         "dist.init_process_group('gloo')\nargs.world_size = dist.get_world_size()\n"
                         "model = DDP(torch.nn.Linear(2, 2))\n"
                         "params = [{'params': model.parameters(), 'lr': LR, 'name': 'fc'}]\n"
                         "opt = torch.optim.SGD(params, momentum=0.9)\nfor step in range(3):\n"
                         "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
                         "    opt.step()\n")
    scaled = train.replace("LR", "args.fc_lr * args.world_size")
    hits = _rules(_project(tmp_path / "scaled", {"train.py": scaled}), "lr-grows-with-world-size")
    assert [h.line for h in hits] == [_line(scaled, "params = [{")]
    kept = train.replace("LR", "args.fc_lr")
    assert not _rules(_project(tmp_path / "kept", {"train.py": kept}), "lr-grows-with-world-size")


def test_no_seed_in_a_worker_another_file_holds(tmp_path):
    """PerAct: train.py's main() runs `mp.spawn(run_seed_fn.run_seed, ...)`, and run_seed (in run_seed_fn.py) sets
    up the process group and builds the model without seeding: no-seed, found in the worker at its
    init_process_group, where the seed belongs. A worker that seeds is quiet."""
    worker = HEAD + ("def run_seed(rank, world_size):\n    dist.init_process_group('gloo', rank=rank, "
                     "world_size=world_size)\nSEED    model = DDP(torch.nn.Linear(2, 2))\n"
                     "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for step in range(3):\n"
                     "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
                     "        opt.step()\n")
    train = ("import torch.multiprocessing as mp\nimport run_seed_fn\ndef main():\n"
             "    mp.spawn(run_seed_fn.run_seed, args=(2,), nprocs=2, join=True)\n"
             "if __name__ == '__main__':\n    main()\n")
    unseeded = worker.replace("SEED", "")
    hits = _rules(_project(tmp_path / "unseeded", {"train.py": train, "run_seed_fn.py": unseeded}), "no-seed")
    assert [(h.path.rsplit("/", 1)[-1], h.line) for h in hits] == [
        ("run_seed_fn.py", _line(unseeded, "dist.init_process_group("))]
    seeded = worker.replace("SEED", "    torch.manual_seed(0)\n")
    assert not _rules(_project(tmp_path / "seeded", {"train.py": train, "run_seed_fn.py": seeded}), "no-seed")


def test_a_training_loop_left_under_rank_0s_own_test(tmp_path):
    """DUSTGaussian: `if args.local_rank == 0: ... global_step += 1; if global_step > n_iters: break` inside the
    training loop: rank 0 alone leaves, the other ranks go on into DDP all-reduces it never joins
    (collective-under-rank0, at the test). Joey NMT's `if (is_min_lr or is_max_update) and self.rank == 0: break`,
    in the batch loop and again in the epoch loop, is one finding. A break every rank takes is quiet."""
    train = SEED_ONLY + ("dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "global_step = 0\nwhile True:\n    for step in range(4):\n"
                         "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n"
                         "        loss.backward()\n        opt.step()\nEXIT")
    rank0 = train.replace("EXIT", "        if rank == 0:\n            print(loss.item())\n"
                                  "            global_step += 1\n            if global_step > 10:\n"
                                  "                break\n    if global_step > 10 and rank == 0:\n        break\n")
    hits = _rules(_project(tmp_path / "rank0", {"train.py": rank0}), "collective-under-rank0")
    assert [h.line for h in hits] == [_line(rank0, "            if global_step > 10:")]
    every = train.replace("EXIT", "        global_step += 1\n        if global_step > 10:\n            break\n"
                                  "    if global_step > 10:\n        break\n")
    assert not _rules(_project(tmp_path / "every", {"train.py": every}), "collective-under-rank0")
    # (KAPAO's `if RANK == -1 and stopper(...): break`: the stop of a run of one process; the full regression)
    single = train.replace("EXIT", "        global_step += 1\n        if rank == -1 and global_step > 10:\n"
                                   "            break\n")
    assert not _rules(_project(tmp_path / "single", {"train.py": single}), "collective-under-rank0")


def test_settings_an_unseen_parser_builds_from_the_rank_hold_no_rank(tmp_path):
    """Joey NMT: `args = parse_global_args(cfg, rank=rank, mode='train')` from a module the copies lack returns the
    settings: `self.args = args.train`, then `if (i + 1) % self.args.batch_multiplier == 0:` is no rank test, so
    the validation every rank calls under it is no collective-under-rank0. A rank-named helper's result is a
    rank: `if (i + 1) % get_rank_of(cfg, rank=rank) == 0:` gates it to some ranks."""
    train = SEED_ONLY + ("from config import parse_global_args, get_rank_of\n"
                         "def validate(model):\n    t = torch.zeros(1)\n    dist.all_reduce(t)\n    return t\n"
                         "dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                         "args = MAKER(cfg={}, rank=rank)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(4):\n"
                         "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
                         "    opt.step()\n    if (i + 1) % args.freq == 0:\n        validate(model)\n")
    parsed = train.replace("MAKER", "parse_global_args")
    assert not _rules(_project(tmp_path / "parsed", {"train.py": parsed}), "collective-under-rank0")
    ranked = train.replace("MAKER", "get_rank_of")
    assert _rules(_project(tmp_path / "ranked", {"train.py": ranked}), "collective-under-rank0")


def test_a_sampler_drawing_from_the_generator_it_keeps(tmp_path):
    """Joey NMT's DistributedSubsetSampler: `torch.randperm(n, generator=self.generator)` in __iter__, the
    generator seeded once and never again: each pass draws the next permutation, so no set_epoch is missed
    (no set-epoch-missing). One that re-seeds it in __iter__ (`self.generator.manual_seed(self.seed)`) repeats
    epoch 0's order: found."""
    sampler = ("import torch\nfrom torch.utils.data import DistributedSampler\n"
               "class SubsetSampler(DistributedSampler):\n    def __init__(self, dataset, generator):\n"
               "        self.data = dataset\n        self.generator = generator\n        self.seed = 0\n"
               "    def __iter__(self):\nRESEED"
               "        perm = torch.randperm(len(self.data), generator=self.generator).tolist()\n"
               "        return iter(perm[self.rank::self.num_replicas])\n")
    train = SEED_ONLY + ("from sampler import SubsetSampler\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "g = torch.Generator()\ng.manual_seed(0)\ndata = list(range(16))\n"
                         "loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=SubsetSampler(data, g))\n"
                         "for epoch in range(2):\n    for x in loader:\n        loss = model(x.float()[:2]).sum()\n"
                         "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n")
    kept = sampler.replace("RESEED", "")
    assert not _rules(_project(tmp_path / "kept", {"train.py": train, "sampler.py": kept}), "set-epoch-missing")
    reseeded = sampler.replace("RESEED", "        self.generator.manual_seed(self.seed)\n")
    assert _rules(_project(tmp_path / "reseeded", {"train.py": train, "sampler.py": reseeded}), "set-epoch-missing")
