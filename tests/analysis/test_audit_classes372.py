"""Issue 35: classes of round 372-377's first look (docs/measured/cpu2/audit_heldout_round372.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (5e13adf, the audit of beb8fce)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, _rules

SETUP = ("dist.init_process_group('gloo')\nrank = dist.get_rank()\nworld_size = dist.get_world_size()\n"
         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n")


def test_a_running_sum_of_reduced_batch_losses(tmp_path):
    """LatentNeuralOperator: `train_batch_loss = torch.tensor(loss.item()); dist.all_reduce(train_batch_loss);
    train_loss = train_loss + train_batch_loss / world_size`, then rank 0 logs train_loss: the running sum's own
    old value does not make it this rank's, so the logged loss is the global one (quiet, as `+=` is). Summing the
    unreduced loss instead is found."""
    train = SEED_ONLY + SETUP + (
        "for epoch in range(2):\n    train_loss = 0\n    for step in range(3):\n"
        "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
        "        opt.step()\n        train_batch_loss = torch.tensor(loss.item())\n"
        "        REDUCE\n        train_loss = train_loss + train_batch_loss / world_size\n"
        "    train_loss = train_loss / 3\n    if rank == 0:\n        print('train loss', train_loss)\n")
    reduced = train.replace("REDUCE", "dist.all_reduce(train_batch_loss)")
    assert not _rules(_project(tmp_path / "reduced", {"train.py": reduced}), "rank0-local-loss")
    local = train.replace("REDUCE", "pass")
    assert _rules(_project(tmp_path / "local", {"train.py": local}), "rank0-local-loss")


def test_a_value_read_off_the_meters_names_where_it_is_read(tmp_path):
    """MonoFlex: `depth_errors = {k: meters.meters[k].value for k in meters.meters}` under `if rank == 0:`, then
    `writer.add_scalars('train_metric/depth_errors', depth_errors, it)`: the finding names the line that reads the
    meters (where the labeller put it), not only the writer call."""
    train = SEED_ONLY + SETUP + (
        "from torch.utils.tensorboard import SummaryWriter\nclass Meters:\n    def __init__(self):\n"
        "        self.meters = {}\n    def update(self, **kw):\n        self.meters.update(kw)\n"
        "meters = Meters()\nwriter = SummaryWriter('runs')\nfor it in range(3):\n"
        "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        "    meters.update(loss=loss)\n    if rank == 0:\n"
        "        depth_errors = {k: meters.meters[k].value for k in meters.meters}\n"
        "        writer.add_scalars('train_metric/depth_errors', depth_errors, it)\n")
    root = _project(tmp_path / "p", {"train.py": train})
    found = _rules(root, "rank0-local-loss")
    assert found and any(line == _line(train, "depth_errors = {") for f in found
                         for _, line in ((f.path, f.line), *f.related))


def test_a_progress_bar_told_it_is_rank_0s(tmp_path):
    """ZITS: `progbar = Progbar(total, verbose=1 if self.global_rank == 0 else 0)`, whose update writes to stdout
    only `if self.verbose == 1:`; `progbar.add(n, values=logs)` with the step's losses: rank 0's console alone
    shows rank 0's own loss (rank0-local-loss), not every rank's (no every-rank-prints-loss). A bar verbose on
    every rank is every rank printing."""
    bar = ("import sys\nclass Progbar:\n    def __init__(self, target, verbose=1):\n        self.target = target\n"
           "        self.verbose = verbose\n    def add(self, n, values=None):\n        self.update(n, values)\n"
           "    def update(self, n, values=None):\n        if self.verbose == 1:\n"
           "            sys.stdout.write(' - '.join('%s: %.4f' % (k, v) for k, v in values))\n")
    train = SEED_ONLY + SETUP + (
        "from utils import Progbar\nprogbar = Progbar(3, verbose=VERBOSE)\nfor it in range(3):\n"
        "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        "    logs = [('loss', loss.item())]\n    progbar.add(2, values=logs)\n")
    rank0 = _project(tmp_path / "rank0", {"train.py": train.replace("VERBOSE", "1 if rank == 0 else 0"),
                                          "utils.py": bar})
    assert _rules(rank0, "rank0-local-loss") and not _rules(rank0, "every-rank-prints-loss")
    every = _project(tmp_path / "every", {"train.py": train.replace("VERBOSE", "1"), "utils.py": bar})
    assert _rules(every, "every-rank-prints-loss")


def test_a_torch_load_of_a_data_file_named_beside_a_model_name(tmp_path):
    """Diffusion-BERT: `word_freq = torch.load(f'./word_freq/{args.model_name_or_path}_{args.task_name}.pt')`:
    counts a preprocessing step saved, no checkpoint (`model` in the tokenizer's option name beside it does not make
    it one): no load-without-map-location. A checkpoint path with the same option is found."""
    train = SEED_ONLY + SETUP + (
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--model_name_or_path')\n"
        "args = parser.parse_args()\nwf = torch.load(f'./PATH/{args.model_name_or_path}.pt')\n")
    data = _project(tmp_path / "data", {"train.py": train.replace("PATH", "word_freq")})
    assert not _rules(data, "load-without-map-location")
    ckpt = _project(tmp_path / "ckpt", {"train.py": train.replace("PATH", "checkpoints")})
    assert _rules(ckpt, "load-without-map-location")


def test_a_dev_split_gathered_on_rank_0(tmp_path):
    """Diffusion-BERT: `dev_sampler = DistributedSampler(dev_data)` (padding), a `for dev_batch in dev_loader:`
    loop whose metrics rank 0 collects with `dist.gather` (the others call it with no list) and divides by
    len(dev_data): the padded duplicates are counted (eval-padding-duplicates). Without the gather each rank keeps
    its own sums: quiet."""
    train = SEED_ONLY + SETUP + (
        "from torch.utils.data import DataLoader, DistributedSampler\ndev_data = torch.ones(9, 2)\n"
        "dev_sampler = DistributedSampler(dev_data)\ndev_loader = DataLoader(dev_data, batch_size=2, "
        "sampler=dev_sampler)\ntotal = 0.0\nwith torch.no_grad():\n    for dev_batch in dev_loader:\n"
        "        elbo = model(dev_batch).sum()\nGATHER"
        "print(total / len(dev_data))\n")
    gather = ("        if rank == 0:\n            got = [torch.tensor(0.) for _ in range(world_size)]\n"
              "            dist.gather(elbo, got)\n            total += sum(got)\n"
              "        else:\n            dist.gather(elbo)\n")
    gathered = _project(tmp_path / "gathered", {"train.py": train.replace("GATHER", gather)})
    assert _rules(gathered, "eval-padding-duplicates")
    own = _project(tmp_path / "own", {"train.py": train.replace("GATHER", "        total += elbo\n")})
    assert not _rules(own, "eval-padding-duplicates")


def test_a_seed_that_is_none_unless_a_setting_nobody_sets(tmp_path):
    """MonoFlex and X-modaler (detectron2's default_setup): `seed_all_rng(None if cfg.SEED < 0 else cfg.SEED +
    rank)` with SEED set by no file here (detectron2's config defaults it to -1): the default run seeds from the
    clock and urandom (no-seed). A YAML config that sets `SEED: 7` makes it seeded: quiet."""
    train = HEAD + ("from utils import seed_all_rng\nfrom config import cfg\ncfg.merge_from_file('run.yaml')\n"
                    "dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                    "seed_all_rng(None if cfg.SEED < 0 else cfg.SEED + rank)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n"
                    "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")
    unset = _project(tmp_path / "unset", {"train.py": train, "run.yaml": "MODEL:\n  NAME: x\n"})
    found = _rules(unset, "no-seed")
    assert found and "cfg.SEED >= 0" in found[0].message
    set_ = _project(tmp_path / "set", {"train.py": train, "run.yaml": "MODEL:\n  NAME: x\nSEED: 7\n"})
    assert not _rules(set_, "no-seed")

