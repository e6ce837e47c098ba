"""Issue 35: classes of round 282-287's first look (docs/measured/cpu2/audit_heldout_round282.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (1cc02c3)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, STEP, _rules


def test_the_line_of_a_long_log_text_that_reads_the_loss(tmp_path):
    """RangeViT: `log_str += 'LR {} Loss {:0.4f}'.format(\\n lr, loss.item(), ...)` over two lines, then
    `logger.info(log_str)` on rank 0: the finding names the line that reads the loss among its places."""
    train = SEED_ONLY + ("dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(3):\n" + STEP +
                         "    if dist.get_rank() == 0:\n        log_str = '>>> I[{:04d}] '.format(i)\n"
                         "        log_str += 'LR {} Loss {:0.4f} '.format(\n            0.1, loss.item())\n"
                         "        print(log_str)\n")
    hits = _rules(_project(tmp_path / "p", {"train.py": train}), "rank0-local-loss")
    assert len(hits) == 1 and _line(train, "0.1, loss.item()") in [line for _, line in hits[0].related]


def test_a_parent_that_seeds_then_spawns_is_one_finding(tmp_path):
    """OpenCompatible: `if args.seed is not None: set_random_seed(args.seed)` (a helper in utils) in main, then
    `torch.multiprocessing.spawn(main_worker, ...)`, and the workers seed nothing: seed-before-spawn, not also
    no-seed. Without the parent's seed it is no-seed alone."""
    utils = "import torch\ndef set_random_seed(seed):\n    torch.manual_seed(seed)\n"
    train = HEAD + ("import argparse\nimport torch.multiprocessing\nfrom utils import set_random_seed\n"
                    "def main_worker(gpu, n):\n    dist.init_process_group('gloo')\n"
                    "    model = DDP(torch.nn.Linear(2, 2))\ndef main():\n    p = argparse.ArgumentParser()\n"
                    "    p.add_argument('--seed', default=None, type=int)\n    args = p.parse_args()\nSEED"
                    "    torch.multiprocessing.spawn(main_worker, nprocs=2, args=(2,))\n"
                    "if __name__ == '__main__':\n    main()\n")
    seeded = train.replace("SEED", "    if args.seed is not None:\n        set_random_seed(args.seed)\n")
    root = _project(tmp_path / "seeded", {"train.py": seeded, "utils.py": utils})
    assert _rules(root, "seed-before-spawn") and not _rules(root, "no-seed")
    bare = _project(tmp_path / "bare", {"train.py": train.replace("SEED", ""), "utils.py": utils})
    assert _rules(bare, "no-seed") and not _rules(bare, "seed-before-spawn")


def test_a_switch_handed_to_the_sampler_builder(tmp_path):
    """FastAutoAugment: `get_dataloaders(..., multinode=(local_rank >= 0))` builds the DistributedSampler under
    `if multinode:`, and the loop calls `set_epoch` under `if local_rank >= 0:`: the same switch, so no epoch
    repeats. A builder that makes the sampler whatever it is handed leaves it repeating in the other arm."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
            "def get_dataloaders(ds, multinode=False):\n    sampler = None\nGUARD"
            "        sampler = DistributedSampler(ds)\n"
            "    return sampler, DataLoader(ds, sampler=sampler, shuffle=sampler is None)\n")
    train = SEED_ONLY + ("import os\nfrom data import get_dataloaders\n"
                         "local_rank = int(os.environ.get('LOCAL_RANK', -1))\n"
                         "if local_rank >= 0:\n    dist.init_process_group('gloo')\n"
                         "sampler, loader = get_dataloaders(list(range(8)), multinode=(local_rank >= 0))\n"
                         "model = torch.nn.Linear(2, 2)\nif local_rank >= 0:\n    model = DDP(model)\n"
                         "for epoch in range(2):\n    if local_rank >= 0:\n        sampler.set_epoch(epoch)\n"
                         "    for x in loader:\n        model(x)\n")
    quiet = data.replace("GUARD", "    if multinode:\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train, "data.py": quiet}), "set-epoch-missing")
    loud = data.replace("GUARD", "    if True:\n")
    assert _rules(_project(tmp_path / "loud", {"train.py": train, "data.py": loud}), "set-epoch-missing")


def test_rank_0_evaluates_through_a_function_every_rank_trains_with(tmp_path):
    """FastAutoAugment: run_epoch(model, trainloader, ...) on every rank for training, then `if is_master: with
    torch.no_grad(): run_epoch(model, validloader, ...)` through the DDP wrapper get_model returns (BatchNorm
    buffers): rank 0's evaluation forward runs alone. The EMA copy get_model builds with local_rank=-1 is plain."""
    nets = (HEAD + "def get_model(local_rank=-1):\n    model = torch.nn.Sequential(torch.nn.Linear(2, 2), "
            "torch.nn.BatchNorm1d(2))\n    if local_rank >= 0:\n        model = DDP(model)\n    return model\n")
    train = SEED_ONLY + ("from nets import get_model\ndef run_epoch(model, loader, opt=None):\n"
                         "    for x in loader:\n        out = model(x).sum()\n        if opt is not None:\n"
                         "            opt.zero_grad()\n            out.backward()\n            opt.step()\n"
                         "dist.init_process_group('gloo')\nlocal_rank = dist.get_rank()\n"
                         "model = get_model(local_rank=local_rank)\nmodel_ema = get_model(local_rank=-1)\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nis_master = dist.get_rank() == 0\n"
                         "for epoch in range(2):\n    run_epoch(model, [torch.ones(4, 2)], opt)\n"
                         "    if is_master:\n        with torch.no_grad():\n"
                         "            run_epoch(EVAL, [torch.ones(4, 2)])\n")
    loud = train.replace("EVAL", "model")
    hits = _rules(_project(tmp_path / "loud", {"train.py": loud, "nets.py": nets}), "ddp-forward-under-rank0")
    assert [h.line for h in hits] == [_line(loud, "run_epoch(model, [torch.ones(4, 2)])")]
    quiet = train.replace("EVAL", "model_ema")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet, "nets.py": nets}), "ddp-forward-under-rank0")


def test_a_length_is_no_rank(tmp_path):
    """HydraGNN: `if len(true_values[0]) > 0: gather_tensor_ranks(...)` after values that the rank-tainted loader
    filled: a test of a length, true on every rank with data, not `rank > 0`. `if rank > 0:` is."""
    train = SEED_ONLY + ("def gather_tensor_ranks(x):\n    out = [torch.zeros_like(x) for _ in range(2)]\n"
                         "    dist.all_gather(out, x)\n    return torch.cat(out)\n"
                         "dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "true_values = [torch.ones(2) * rank]\nif TEST:\n"
                         "    true_values[0] = gather_tensor_ranks(true_values[0])\n")
    quiet = train.replace("TEST", "len(true_values[0]) > 0")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "collective-under-rank0")
    loud = train.replace("TEST", "rank > 0")
    assert _rules(_project(tmp_path / "loud", {"train.py": loud}), "collective-under-rank0")


def test_a_gather_helper_names_its_calls_in_the_step(tmp_path):
    """HIER: utils.all_gather gathers under no_grad and puts back only the rank's own slot; the finding (in the
    helper) names the training step's calls `z = utils.all_gather(z, local_rank)` among its places, before an
    evaluation's."""
    utils = ("import torch\ndef all_gather(x, local_rank=None):\n    with torch.no_grad():\n"
             "        x_list = [torch.zeros_like(x) for _ in range(2)]\n"
             "        torch.distributed.all_gather(x_list, x.contiguous())\n    x_list[local_rank] = x\n"
             "    return torch.cat(x_list, dim=0)\n")
    train = SEED_ONLY + ("import utils\ndef evaluate(model):\n    with torch.no_grad():\n"
                         "        return utils.all_gather(model(torch.ones(2)), 0)\n"
                         "dist.init_process_group('gloo')\nlocal_rank = dist.get_rank()\n"
                         "model = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n"
                         "    z = utils.all_gather(model(torch.ones(2)), local_rank)\n    loss = (z @ z).sum()\n"
                         "    opt.zero_grad()\n    loss.backward()\n    opt.step()\nevaluate(model)\n")
    hits = _rules(_project(tmp_path / "p", {"train.py": train, "utils.py": utils}), "gather-without-grad")
    assert len(hits) == 1 and hits[0].related[0][1] == _line(train, "z = utils.all_gather")


def test_a_module_function_whose_meter_a_helper_feeds_does_not_crash(tmp_path):
    """The full held-out run at a8fff0e stopped with KeyError in _class_steps: a module-level function (no class)
    hands its meter to a helper that feeds it a loss, and logs the meter though it runs no step itself."""
    train = SEED_ONLY + ("class Meter:\n    def update(self, v):\n        self.v = v\n"
                         "def feed(model, x, losses):\n    loss = model(x).sum()\n    losses.update(loss.item())\n"
                         "def report(model, loader):\n    losses = Meter()\n    for x in loader:\n"
                         "        feed(model, x, losses)\n    print('loss', losses.v)\n"
                         "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\nreport(model, [])\n")
    assert isinstance(_rules(_project(tmp_path / "p", {"train.py": train}), "rank0-local-loss"), list)
