"""Issue 35: classes of round 462-467's first look (docs/measured/cpu2/audit_heldout_round462.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (d413266)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_set_epoch_handed_on_as_a_bound_method(tmp_path):
    """VLN-HAMT: `pre_epoch = sampler.set_epoch`, returned beside the loader, and its MetaLoader calls the method
    at each pass: set_epoch is called, through a name. With no such reference the finding stays."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\ndef build_dataloader(ds):\n"
            "    sampler = DistributedSampler(ds)\n    pre_epoch = PRE\n"
            "    return DataLoader(ds, batch_size=4, sampler=sampler), pre_epoch\n")
    train = (DDP + "from loader import build_dataloader\ndist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
             "model = DDP(torch.nn.Linear(2, 2))\nloader, pre_epoch = build_dataloader([torch.ones(2)] * 64)\n"
             "for epoch in range(3):\n    pre_epoch(epoch)\n    for x in loader:\n        model(x).sum().backward()\n")
    handed = {"train.py": train, "loader.py": data.replace("PRE", "sampler.set_epoch")}
    assert not _rules(_project(tmp_path / "handed", handed), "set-epoch-missing")
    nothing = {"train.py": train, "loader.py": data.replace("PRE", "lambda e: None")}
    assert _rules(_project(tmp_path / "nothing", nothing), "set-epoch-missing")


def test_an_accumulation_count_a_json_config_sets_to_one(tmp_path):
    """VLN-HAMT: `--gradient_accumulation_steps` defaults to 16, but the script copies its JSON config onto the
    options (`for k, v in json.load(open(args.config)).items(): setattr(args, k, v)`) and the config says 1: the
    default run steps every micro-batch. With 4 in the config it accumulates without no_sync."""
    train = (DDP + "import argparse, json\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--gradient_accumulation_steps', type=int, default=16)\n"
             "parser.add_argument('--config', required=True)\nargs = parser.parse_args()\n"
             "for k, v in json.load(open(args.config)).items():\n    setattr(args, k, v)\n"
             "dist.init_process_group('gloo')\ntorch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step, x in enumerate([torch.ones(2)] * 64):\n"
             "    model(x).sum().backward()\n    if (step + 1) % args.gradient_accumulation_steps == 0:\n"
             "        opt.step()\n        opt.zero_grad()\n")
    one = {"train.py": train, "config/pretrain.json": '{\n    "gradient_accumulation_steps": 1,\n    "lr": 5e-05\n}\n'}
    assert not _rules(_project(tmp_path / "one", one), "accumulation-without-no-sync")
    four = {"train.py": train, "config/pretrain.json": '{\n    "gradient_accumulation_steps": 4\n}\n'}
    assert _rules(_project(tmp_path / "four", four), "accumulation-without-no-sync")


def test_a_rank0_flag_unpacked_from_a_helper_tuple_and_an_idle_object(tmp_path):
    """VLN-HAMT: `default_gpu, n_gpu, device = set_cuda(opts)` (set_cuda returns `dist.get_rank() == 0` in that
    slot, True without a group), then `model_saver = ModelSaver(...)` under `if default_gpu:` and `NoOp()` (a
    class whose every method does nothing) otherwise: `model_saver.save(model)` writes on rank 0 alone. With the
    other ranks given a real saver, every rank writes."""
    misc = ("import torch, torch.distributed as dist\ndef set_cuda(opts):\n    if opts.local_rank != -1:\n"
            "        dist.init_process_group('gloo')\n        default_gpu = dist.get_rank() == 0\n    else:\n"
            "        default_gpu = True\n    return default_gpu, 1, torch.device('cpu')\nclass NoOp(object):\n"
            "    def __getattr__(self, name):\n        return self.noop\n    def noop(self, *args, **kwargs):\n"
            "        return\nclass ModelSaver(object):\n    def __init__(self, d):\n        self.d = d\n"
            "    def save(self, model, step):\n        torch.save(model.state_dict(), f'{self.d}/model_{step}.pt')\n")
    train = (DDP + "import argparse\nfrom misc import NoOp, ModelSaver, set_cuda\n"
             "parser = argparse.ArgumentParser()\nparser.add_argument('--local_rank', type=int, default=-1)\n"
             "opts = parser.parse_args()\ndefault_gpu, n_gpu, device = set_cuda(opts)\ntorch.manual_seed(0)\n"
             "if default_gpu:\n    model_saver = ModelSaver('ckpts')\nelse:\n    model_saver = OTHER\n"
             "model = DDP(torch.nn.Linear(2, 2))\nfor step in range(10):\n    model(torch.ones(2)).sum().backward()\n"
             "model_saver.save(model.module, step)\n")
    idle = {"train.py": train.replace("OTHER", "NoOp()"), "misc.py": misc}
    assert not _rules(_project(tmp_path / "idle", idle), "save-on-every-rank")
    real = {"train.py": train.replace("OTHER", "ModelSaver('ckpts')"), "misc.py": misc}
    assert _rules(_project(tmp_path / "real", real), "save-on-every-rank")


def test_a_closure_inside_a_save_helper_is_judged_where_the_helper_is_called(tmp_path):
    """UnSAMFlow: `def save_checkpoint(path, states): def run_one_sample(...): torch.save(state, f)`, called by
    save_model, which rank 0 alone reaches (through the validation it runs): the closure's torch.save is the
    helper's; its calls are judged where they are made. Called on every rank, the call is the finding."""
    utils = ("import torch\ndef save_checkpoint(save_path, states):\n    def run_one_sample(save_path, state):\n"
             "        torch.save(state, save_path)\n    for s in states:\n        run_one_sample(save_path, s)\n")
    train = (DDP + "from utils import save_checkpoint\nclass Trainer:\n    def __init__(self, rank):\n"
             "        self.rank = rank\n        self.model = DDP(torch.nn.Linear(2, 2))\n"
             "    def save_model(self):\n        save_checkpoint('ckpt.pt', [self.model.module.state_dict()])\n"
             "    def validate(self):\n        self.save_model()\n    def train(self):\n"
             "        for epoch in range(3):\n"
             "            self.model(torch.ones(2)).sum().backward()\n            GUARD\n"
             "                self.validate()\n            dist.barrier()\n"
             "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    Trainer(dist.get_rank()).train()\n")
    rank0 = {"train.py": train.replace("GUARD", "if self.rank == 0:"), "utils.py": utils}
    assert not _rules(_project(tmp_path / "rank0", rank0), "save-on-every-rank")
    every = {"train.py": train.replace("GUARD", "if epoch >= 0:"), "utils.py": utils}
    hits = _rules(_project(tmp_path / "every", every), "save-on-every-rank")
    assert hits and all(h.path.endswith("train.py") for h in hits), [(h.path, h.line) for h in hits]


def test_a_text_built_from_a_meter_fed_the_loss(tmp_path):
    """UnSAMFlow: `key_meters.update([loss.item(), ...], n)`, then under `if self.rank == 0:` `istr = "..." +
    " Info {}".format(key_meters)` and `self.log(istr)`: the meter's text is rank 0's own loss. Fed the reduced
    loss, it is the global batch's."""
    train = (DDP + "class AverageMeter:\n    def __init__(self):\n        self.val = []\n"
             "    def update(self, val, n=1):\n        self.val = val\n    def __str__(self):\n"
             "        return str(self.val)\ndef reduce_mean(t):\n    dist.all_reduce(t)\n"
             "    return t / dist.get_world_size()\nclass Trainer:\n    def __init__(self, rank):\n"
             "        self.rank = rank\n        self.model = DDP(torch.nn.Linear(2, 2))\n    def log(self, s):\n"
             "        if self.rank == 0:\n            print(s)\n    def train(self):\n"
             "        key_meters = AverageMeter()\n        for step in range(100):\n"
             "            loss = self.model(torch.ones(2)).sum()\n            loss.backward()\n"
             "            key_meters.update([FED], 1)\n            if step % 10 == 0:\n"
             "                if self.rank == 0:\n                    istr = '{:04d}'.format(step) + ' Info {}'.format("
             "key_meters)\n                    self.log(istr)\n"
             "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    Trainer(dist.get_rank()).train()\n")
    own = train.replace("FED", "loss.item()")
    assert _rules(_project(tmp_path / "own", {"train.py": own}), "rank0-local-loss")
    reduced = train.replace("FED", "reduce_mean(loss.detach()).item()")
    assert not _rules(_project(tmp_path / "reduced", {"train.py": reduced}), "rank0-local-loss")
