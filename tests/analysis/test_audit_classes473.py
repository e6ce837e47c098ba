"""Issue 35: classes of round 473-477's first look (docs/measured/cpu2/audit_heldout_round473.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (d6955a7)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_switch_method_on_a_rank_the_launcher_set(tmp_path):
    """stereo_toolbox: `self.local_rank = int(os.environ.get('LOCAL_RANK', -1))` (or -1 without CUDA),
    `is_distributed()` returns `self.local_rank != -1`, and `is_main_process()` returns `self.local_rank == 0 or
    not self.is_distributed()`: true on rank 0 alone in a launched run, so the save under it is rank 0's. With the
    switch an option the user passes, `--dist`, the guard leaks."""
    train = (DDP + "import os, argparse\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--dist', action='store_true')\nclass Trainer:\n    def __init__(self, args):\n"
             "        self.args = args\n        self.local_rank = int(os.environ.get('LOCAL_RANK', -1))\n"
             "        if not torch.cuda.is_available():\n            self.local_rank = -1\n"
             "    def is_distributed(self):\n        return SWITCH\n    def is_main_process(self):\n"
             "        return self.local_rank == 0 or not self.is_distributed()\n"
             "    def save_checkpoint(self, model):\n        if not self.is_main_process():\n            return\n"
             "        torch.save(model.module.state_dict(), 'ckpt.pth')\n    def train(self):\n"
             "        dist.init_process_group('gloo')\n        torch.manual_seed(0)\n"
             "        model = DDP(torch.nn.Linear(2, 2))\n        for epoch in range(3):\n"
             "            model(torch.ones(2)).sum().backward()\n            self.save_checkpoint(model)\n"
             "if __name__ == '__main__':\n    Trainer(parser.parse_args()).train()\n")
    launched = train.replace("SWITCH", "self.local_rank != -1")
    assert not _rules(_project(tmp_path / "launched", {"train.py": launched}), "save-on-every-rank")
    option = train.replace("SWITCH", "self.args.dist")
    assert _rules(_project(tmp_path / "option", {"train.py": option}), "save-on-every-rank")


def test_a_hugging_face_save_pretrained_on_every_rank(tmp_path):
    """DistributedTrainingGPT2: `model_to_save = model.module if hasattr(model, 'module') else model`, then
    `model_to_save.save_pretrained(output_dir + 'final_model')` on every rank: every process writes the files.
    Under `if dist.get_rank() == 0:` (or a tokenizer's save) it is no finding."""
    train = (DDP + "from transformers import GPT2LMHeadModel, BertTokenizer\ndist.init_process_group('gloo')\n"
             "torch.manual_seed(0)\nmodel = DDP(GPT2LMHeadModel.from_pretrained('gpt2'))\n"
             "tokenizer = BertTokenizer.from_pretrained('bert')\nfor epoch in range(3):\n"
             "    model(torch.ones(2, dtype=torch.long)).loss.backward()\n"
             "model_to_save = model.module if hasattr(model, 'module') else model\nGUARD"
             "model_to_save.save_pretrained('final_model')\n")
    every = train.replace("GUARD", "")
    assert _rules(_project(tmp_path / "every", {"train.py": every}), "save-on-every-rank")
    rank0 = train.replace("GUARD", "if dist.get_rank() == 0:\n    ").replace(
        "    model_to_save.save_pretrained", "    model_to_save.save_pretrained")
    assert not _rules(_project(tmp_path / "rank0", {"train.py": rank0}), "save-on-every-rank")
    tokenizer = train.replace("GUARD", "").replace("model_to_save.save_pretrained", "tokenizer.save_pretrained")
    assert not _rules(_project(tmp_path / "tokenizer", {"train.py": tokenizer}), "save-on-every-rank")


def test_a_loader_class_that_sets_its_sampler_epoch(tmp_path):
    """Protenix: `DistributedDataLoader(DataLoader)` whose `__iter__` runs `self.sampler.set_epoch(self.counter)`
    and moves the counter on: the sampler it is handed gets a new epoch each pass, with no set_epoch in the
    training loop. Handed to a plain DataLoader, every epoch repeats epoch 0's order."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
            "class DistributedDataLoader(DataLoader):\n"
            "    def __init__(self, dataset, batch_size, shuffle=False, sampler=None):\n"
            "        if sampler is not None:\n            self.sampler = sampler\n        else:\n"
            "            self.sampler = DistributedSampler(dataset, shuffle=shuffle)\n"
            "        super().__init__(dataset, batch_size=batch_size, sampler=self.sampler)\n"
            "        self.counter = 0\n    def __iter__(self):\n"
            "        self.sampler.set_epoch(self.counter)\n        self.counter += 1\n"
            "        return super().__iter__()\ndef get_dataloaders(dataset):\n"
            "    train_sampler = DistributedSampler(dataset)\n"
            "    return LOADER(dataset=dataset, batch_size=1, shuffle=False, sampler=train_sampler)\n")
    train = (DDP + "from dataloader import get_dataloaders\ndef main():\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    train_dl = get_dataloaders([torch.ones(2)] * 64)\n    for epoch in range(3):\n"
             "        for x in train_dl:\n            model(x).sum().backward()\nmain()\n")
    own = {"train.py": train, "dataloader.py": data.replace("LOADER", "DistributedDataLoader")}
    assert not _rules(_project(tmp_path / "own", own), "set-epoch-missing")
    plain = {"train.py": train, "dataloader.py": data.replace("LOADER", "DataLoader").replace(
        "        self.sampler.set_epoch(self.counter)\n", "")}
    assert _rules(_project(tmp_path / "plain", plain), "set-epoch-missing")
