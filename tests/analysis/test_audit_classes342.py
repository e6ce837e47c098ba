"""Issue 35: classes of round 342-347's first look (docs/measured/cpu2/audit_heldout_round342.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (8456814)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, _rules

EVAL = ("dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "def evaluate(val):\n    params = PARAMS\n"
        "    sampler = torch.utils.data.distributed.DistributedSampler(val, **params)\n"
        "    loader = torch.utils.data.DataLoader(val, batch_size=4, sampler=sampler)\n"
        "    total = torch.zeros(1)\n    for x in loader:\n        total += model(x).sum().detach()\n"
        "    dist.all_reduce(total)\n    return total\n"
        "for epoch in range(2):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
        "    opt.step()\n    evaluate(list(range(9)))\n")


def test_drop_last_handed_through_a_keyword_dict(tmp_path):
    """Openpilot-Deepdive: `dist_sampler_params = dict(..., drop_last=True)`, then `DistributedSampler(val,
    **dist_sampler_params)`: the validation sampler drops the tail instead of padding it, so no duplicates are
    counted (no eval-padding-duplicates). The same dict without drop_last pads: found."""
    dropped = SEED_ONLY + EVAL.replace("PARAMS", "dict(shuffle=False, drop_last=True)")
    assert not _rules(_project(tmp_path / "dropped", {"train.py": dropped}), "eval-padding-duplicates")
    padded = SEED_ONLY + EVAL.replace("PARAMS", "dict(shuffle=False)")
    hits = _rules(_project(tmp_path / "padded", {"train.py": padded}), "eval-padding-duplicates")
    assert [h.line for h in hits] == [_line(padded, "sampler = torch.utils.data.distributed")]


def test_a_loss_summed_before_one_backward_is_no_gradient_accumulation(tmp_path):
    """Openpilot-Deepdive: `total_loss += loss / n` each time step, and `if (t + 1) % n == 0:` runs the one
    backward and the step: the loss accumulates, not the gradients, so no backward all-reduces between steps (no
    accumulation-without-no-sync). A backward each step with the step gated is accumulation: found."""
    train = SEED_ONLY + ("dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nn = 4\nfor batch in range(3):\n"
                         "    total_loss = 0\n    for t in range(8):\n        loss = model(torch.ones(2)).sum()\n"
                         "BODY")
    summed = train.replace("BODY", "        total_loss += loss / n\n        if (t + 1) % n == 0:\n"
                                   "            opt.zero_grad()\n            total_loss.backward()\n"
                                   "            opt.step()\n            total_loss = 0\n")
    assert not _rules(_project(tmp_path / "summed", {"train.py": summed}), "accumulation-without-no-sync")
    accumulated = train.replace("BODY", "        (loss / n).backward()\n        if (t + 1) % n == 0:\n"
                                        "            opt.step()\n            opt.zero_grad()\n")
    hits = _rules(_project(tmp_path / "accumulated", {"train.py": accumulated}), "accumulation-without-no-sync")
    assert [h.line for h in hits] == [_line(accumulated, "if (t + 1) % n == 0")]


def test_an_infinite_loader_that_remakes_its_iterator_when_it_runs_out(tmp_path):
    """ResRep: InfiniteDataLoader makes its iterator in __init__ but, on StopIteration, `self.dataset_iterator =
    super().__iter__()` in __next__: the next pass's iterator starts after the epoch's set_epoch (no
    set-epoch-late). YOLOv5's, whose iterator is never re-made, is a persistent one: found."""
    loader = ("import torch\nclass InfiniteDataLoader(torch.utils.data.DataLoader):\n"
              "    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n"
              "        self.dataset_iterator = super().__iter__()\n    def __iter__(self):\n        return self\n"
              "    def __next__(self):\nNEXT")
    train = SEED_ONLY + ("from data import InfiniteDataLoader\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "data = list(range(64))\nsampler = torch.utils.data.distributed.DistributedSampler(data)\n"
                         "train_data = InfiniteDataLoader(data, batch_size=8, sampler=sampler)\n"
                         "for epoch in range(3):\n    sampler.set_epoch(epoch)\n    for step in range(4):\n"
                         "        x = next(train_data)\n        loss = model(x).sum()\n        opt.zero_grad()\n"
                         "        loss.backward()\n        opt.step()\n")
    remade = loader.replace("NEXT", "        try:\n            return next(self.dataset_iterator)\n"
                                    "        except StopIteration:\n"
                                    "            self.dataset_iterator = super().__iter__()\n"
                                    "            return next(self.dataset_iterator)\n")
    assert not _rules(_project(tmp_path / "remade", {"train.py": train, "data.py": remade}), "set-epoch-late")
    kept = loader.replace("NEXT", "        return next(self.dataset_iterator)\n")
    hits = _rules(_project(tmp_path / "kept", {"train.py": train, "data.py": kept}), "set-epoch-late")
    assert [h.line for h in hits] == [_line(train, "sampler.set_epoch(epoch)")]


def test_a_logger_a_class_keeps_from_its_callers(tmp_path):
    """MetaICL: the `__main__` block configures the root logger on every rank and makes `logger =
    logging.getLogger(__name__)`, hands it to main(logger, args), which builds `Model(logger)`, whose __init__
    keeps `self.logger = logger`; do_train's `self.logger.info('train loss %.2f' % np.mean(train_losses))` prints
    on every rank (every-rank-prints-loss). A print of the step count alone is no loss."""
    model = ("import torch, numpy as np\nclass Model:\n    def __init__(self, logger, net):\n"
             "        self.logger = logger\n        self.net = net\n    def do_train(self, opt):\n"
             "        train_losses = []\n        for step in range(3):\n"
             "            loss = self.net(torch.ones(2)).sum()\n            opt.zero_grad()\n"
             "            loss.backward()\n            opt.step()\n            train_losses.append(loss.item())\n"
             "            self.logger.info(SHOWN)\n")
    train = SEED_ONLY + ("import logging\nfrom model import Model\ndef main(logger):\n"
                         "    dist.init_process_group('gloo')\n    net = DDP(torch.nn.Linear(2, 2))\n"
                         "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n    Model(logger, net).do_train(opt)\n"
                         "if __name__ == '__main__':\n"
                         "    logging.basicConfig(level=logging.INFO, handlers=[logging.StreamHandler()])\n"
                         "    logger = logging.getLogger(__name__)\n    main(logger)\n")
    lossy = model.replace("SHOWN", "'train loss %.2f' % np.mean(train_losses)")
    hits = _rules(_project(tmp_path / "lossy", {"train.py": train, "model.py": lossy}), "every-rank-prints-loss")
    assert [h.line for h in hits] == [_line(lossy, "self.logger.info(")]
    steps = model.replace("SHOWN", "'step %d' % step")
    assert not _rules(_project(tmp_path / "steps", {"train.py": train, "model.py": steps}), "every-rank-prints-loss")
