"""Issue 35: classes of round 288-293's first look (docs/measured/cpu2/audit_heldout_round288.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (36fe639)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, STEP, _rules

XRAY = HEAD + ("class UNet(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               "        self.bn = torch.nn.BatchNorm1d(2)\n    def forward(self, x):\n        return self.bn(x)\n"
               "def setup_ddp():\n    dist.init_process_group('gloo')\n    return dist.get_rank()\n"
               "def train_model_ddp(model, loader, local_rank):\n    model = DDP(model)\n"
               "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x in loader:\n"
               "        loss = model(x).sum()\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
               "def test_model(model, loader):\n    with torch.no_grad():\n        for x in loader:\n"
               "            model(x)\nif __name__ == '__main__':\n    local_rank = setup_ddp()\n    model = UNet()\n"
               "    train_model_ddp(model, [], local_rank)\n    if local_rank == 0:\n        test_model(TESTED, [])\n")


def test_a_script_s_model_is_not_the_wrapper_a_function_it_calls_makes(tmp_path):
    """X-ray denoising: `model = UNet()` in the `__main__` block, `train_model_ddp(model, ...)` rebinds its own
    parameter to `DDP(model)`; after it the script's `model` is still the plain UNet, so rank 0's
    `test_model(model, ...)` runs no wrapper. The script builds a class it defines and calls its training
    function: it is a script, not a model file trying itself out, so its missing seed is reported."""
    root = _project(tmp_path / "plain", {"train.py": XRAY.replace("TESTED", "model")})
    assert not _rules(root, "ddp-forward-under-rank0")
    assert _rules(root, "no-seed")


def test_rank_0_of_a_one_process_run(tmp_path):
    """Retinal OCT: `if rank == 0 and world_size == 1: evaluate_model(model, ...)` with `model` the DDP wrapper:
    only a one-process run takes the arm, so no other rank waits on its forward. `if rank == 0:` alone does."""
    train = SEED_ONLY + ("def evaluate_model(model, loader):\n    with torch.no_grad():\n        for x in loader:\n"
                         "            model(x)\ndef run(rank, world_size):\n    dist.init_process_group('gloo')\n"
                         "    model = DDP(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))\n"
                         "    if TEST:\n        evaluate_model(model, [])\n")
    quiet = train.replace("TEST", "rank == 0 and world_size == 1")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "ddp-forward-under-rank0")
    loud = train.replace("TEST", "rank == 0")
    assert _rules(_project(tmp_path / "loud", {"train.py": loud}), "ddp-forward-under-rank0")


def test_a_helper_made_root_logger_with_a_console_on_every_rank(tmp_path):
    """baby-llama2: `def get_logger(filename, verbosity=1, name=None): logger = logging.getLogger(name)` adds a
    StreamHandler under no rank guard, and the script's `logger = get_logger(path)` logs `loss.item()` on every
    rank: world_size interleaved loss lines. A helper that names its logger and adds the console only on rank 0
    does not."""
    train = SEED_ONLY + (
        "import logging\ndef get_logger(filename, verbosity=1, name=None):\n    logger = logging.getLogger(name)\n"
        "    logger.setLevel(logging.INFO)\n    sh = logging.StreamHandler()\nGUARD    logger.addHandler(sh)\n"
        "    return logger\ndef train_epoch(model, opt):\n    for step in range(3):\n"
        + "".join("    " + x + "\n" for x in STEP.splitlines()) +
        "        logger.info('loss:{:.3f}'.format(loss.item()))\n"
        "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    logger = get_logger('log.log')\n"
        "    model = DDP(torch.nn.Linear(2, 2))\n    train_epoch(model, torch.optim.SGD(model.parameters(), lr=0.1))\n")
    loud = train.replace("GUARD", "")
    assert [h.line for h in _rules(_project(tmp_path / "loud", {"train.py": loud}), "every-rank-prints-loss")] == [
        _line(loud, "logger.info('loss")]
    quiet = train.replace("GUARD    logger.addHandler(sh)\n", "    if dist.get_rank() == 0:\n"
                                                               "        logger.addHandler(sh)\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "every-rank-prints-loss")


def test_a_launch_line_that_counts_an_array(tmp_path):
    """Copy-is-all-you-need: `python -m torch.distributed.launch --nproc_per_node=${#gpu_ids[@]} --master_port
    28444 train.py`: the `#` of `${#...}` starts no comment, so the fixed port after it is read."""
    train = SEED_ONLY + "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
    sh = ("gpu_ids=(${cuda//,/ })\nCUDA_VISIBLE_DEVICES=$cuda python -m torch.distributed.launch "
          "--nproc_per_node=${#gpu_ids[@]} --master_port 28444 train.py  # the run\n")
    hits = _rules(_project(tmp_path / "p", {"train.py": train, "train.sh": sh}), "hard-coded-master-port")
    assert [h.line for h in hits] == [2]
