"""Issue 35: slips this stop's full held-out runs showed on batches 1-269 (diffed line by line against the run
before the stop), fixed in 3fc4c03; the last two tests fail at 96460a0, the first is a guard (its small layout
passes there too; TransGeo's own files did not)."""

from test_audit import _project
from test_audit_classes246 import SEED_ONLY, STEP, _rules

EXAMPLES = SEED_ONLY + ("import argparse\np = argparse.ArgumentParser()\n"
                        "p.add_argument('--gpu', type=int, default=None)\n"
                        "p.add_argument('--distributed', action='store_true')\nargs = p.parse_args()\n"
                        "model = torch.nn.Linear(2, 2)\nif args.distributed:\n    dist.init_process_group('gloo')\n"
                        "    if args.gpu is not None:\n        model = DDP(model, device_ids=[args.gpu])\n    else:\n"
                        "        model = DDP(model)\nelif args.gpu is not None:\n    model = model.cuda(args.gpu)\n"
                        "else:\n    model = torch.nn.DataParallel(model).cuda()\n"
                        "if not args.distributed or dist.get_rank() == 0:\n"
                        "    torch.save({'state_dict': model.state_dict()}, 'ckpt.pth')\n")


def test_the_pytorch_examples_layout_keeps_its_wrapper_checkpoint_finding(tmp_path):
    """TransGeo (pytorch/examples' ImageNet layout): `if args.distributed: DDP(...) elif args.gpu is not None:
    plain else: DataParallel(...)`: the single run on one GPU keeps the plain model, so the wrapper's checkpoint
    does not load into it (save-without-module), whatever the elif chain's DataParallel arm does."""
    assert _rules(_project(tmp_path / "p", {"train.py": EXAMPLES}), "save-without-module")


def test_a_print_under_a_flag_the_call_leaves_off(tmp_path):
    """SAM2: `def display(self, batch, enable_print=False): logging.info(...); if enable_print: print(...)`, called
    as `progress.display(i)`: the print never runs, so no every-rank print of the meters' loss."""
    train = SEED_ONLY + (
        "class Meter:\n    def update(self, v):\n        self.v = v\n"
        "    def __str__(self):\n        return str(self.v)\n"
        "class ProgressMeter:\n    def __init__(self, meters):\n        self.meters = meters\n"
        "    def display(self, batch, enable_print=False):\n        line = ' '.join(str(m) for m in self.meters)\n"
        "        if enable_print:\n            print(line)\n"
        "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nlosses = Meter()\nprogress = ProgressMeter([losses])\n"
        "for i in range(3):\n" + STEP + "    losses.update(loss.item())\n    progress.display(i)\n")
    assert not _rules(_project(tmp_path / "p", {"train.py": train}), "every-rank-prints-loss")


def test_a_step_count_named_for_the_loss_is_no_loss(tmp_path):
    """pytorch-auto-drive: `if step % loss_num_steps == loss_num_steps - 1: print(... running_loss[k] /
    loss_num_steps)` with running_loss summed from a reduced record: loss_num_steps is a count, not a loss."""
    train = SEED_ONLY + (
        "import builtins\ndef reduce_dict(d):\n    for v in d.values():\n        dist.all_reduce(v)\n    return d\n"
        "dist.init_process_group('gloo')\nif dist.get_rank() != 0:\n    builtins.print = lambda *a: None\n"
        "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nloss_num_steps = 10\n"
        "running_loss = None\nfor i in range(30):\n" + STEP + "    log_dict = reduce_dict({'loss': loss.detach()})\n"
        "    if running_loss is None:\n        running_loss = {k: 0.0 for k in log_dict.keys()}\n"
        "    for k in log_dict.keys():\n        running_loss[k] += log_dict[k]\n"
        "    if i % loss_num_steps == loss_num_steps - 1:\n        for k in running_loss.keys():\n"
        "            print('%s: %.4f' % (k, running_loss[k] / loss_num_steps))\n")
    assert not _rules(_project(tmp_path / "p", {"train.py": train}), "rank0-local-loss")
