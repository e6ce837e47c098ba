"""Issue 35: classes of round 438-443's first look (docs/measured/cpu2/audit_heldout_round438.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (2efc3f2)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_one_sample_drawn_before_the_epochs_from_an_iterator(tmp_path):
    """LapDepth: `data_iter = iter(loader)` and one `next(data_iter)` for a fixed sample to plot, then every epoch
    `sampler.set_epoch(epoch)` and `for ... in loader:`, a fresh iterator each epoch (no set-epoch-late). Drawing
    the steps from that one iterator in the loop is the finding."""
    train = (DDP + "from torch.utils.data import DataLoader, DistributedSampler\ndef main():\n"
             "    torch.manual_seed(0)\n    dist.init_process_group('gloo')\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    data = [torch.ones(2)] * 8\n"
             "    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data))\n"
             "    data_iter = iter(loader)\n    fixed = next(data_iter)\n    for epoch in range(3):\n"
             "        loader.sampler.set_epoch(epoch)\nLOOPif __name__ == '__main__':\n    main()\n")
    fresh = train.replace("LOOP", "        for x in loader:\n            model(x).sum().backward()\n")
    assert not _rules(_project(tmp_path / "fresh", {"train.py": fresh}), "set-epoch-late")
    drawn = train.replace("LOOP", "        for step in range(4):\n            x = next(data_iter)\n"
                                  "            model(x).sum().backward()\n")
    assert _rules(_project(tmp_path / "drawn", {"train.py": drawn}), "set-epoch-late")


def test_a_summed_cross_entropy_read_out_as_a_metric(tmp_path):
    """The music composer's validate(): `CE += F.cross_entropy(..., reduction='sum').item()`, divided by the token
    count on return: a metric no backward reaches (no sum-loss-unscaled). The training step's own summed loss,
    backpropagated, is the finding."""
    train = (DDP + "import torch.nn.functional as F\ndef validate(model):\n    CE, n = 0.0, 0\n"
             "    with torch.no_grad():\n        for i in range(3):\n            logits = model(torch.ones(4, 2))\n"
             "            CE += F.cross_entropy(logits, torch.zeros(4, dtype=torch.long), reduction='sum').item()\n"
             "            n += 4\n    return CE / n\ntorch.manual_seed(0)\ndist.init_process_group('gloo')\n"
             "model = DDP(torch.nn.Linear(2, 2))\nfor step in range(3):\n    logits = model(torch.ones(4, 2))\n"
             "    loss = F.cross_entropy(logits, torch.zeros(4, dtype=torch.long), reduction=REDUCTION)\n"
             "    loss.backward()\nprint(validate(model))\n")
    hits = _rules(_project(tmp_path / "mean", {"train.py": train.replace("REDUCTION", "'mean'")}),
                  "sum-loss-unscaled")
    assert not hits, [(h.line, h.message) for h in hits]
    assert _rules(_project(tmp_path / "sum", {"train.py": train.replace("REDUCTION", "'sum'")}), "sum-loss-unscaled")


def test_a_sampler_class_handed_to_the_loader_builder(tmp_path):
    """PointConvFormer: `getdataLoaders(cfg, torch.utils.data.distributed.DistributedSampler)` under DDP, whose
    `validation_sampler = sampler(validation_dataset)` pads the evaluation set, and validate() all-reduces its
    sums (eval-padding-duplicates). Handed a SequentialSampler it is quiet."""
    data = ("import torch\nfrom torch.utils.data import DataLoader\ndef getdataLoaders(cfg, sampler):\n"
            "    train_ds, validation_dataset = [torch.ones(2)] * 9, [torch.ones(2)] * 5\n"
            "    training_sampler = sampler(train_ds)\n    validation_sampler = sampler(validation_dataset)\n"
            "    train_loader = DataLoader(train_ds, batch_size=2, sampler=training_sampler, drop_last=True)\n"
            "    val_loader = DataLoader(validation_dataset, batch_size=2, sampler=validation_sampler)\n"
            "    return train_loader, val_loader\n"
            "def get_loaders(cfg):\n    return getdataLoaders(cfg, SAMPLER)\n")
    train = (DDP + "from data import get_loaders\ndef validate(model, loader):\n    total = torch.zeros(1)\n"
             "    with torch.no_grad():\n        for x in loader:\n            total += model(x).sum()\n"
             "    dist.all_reduce(total)\n    return total.item()\ntorch.manual_seed(0)\n"
             "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
             "train_loader, val_loader = get_loaders({})\nfor epoch in range(2):\n"
             "    train_loader.sampler.set_epoch(epoch)\n"
             "    for x in train_loader:\n        model(x).sum().backward()\n"
             "    print(validate(model, val_loader))\n")
    padded = {"train.py": train,
              "data.py": data.replace("SAMPLER", "torch.utils.data.distributed.DistributedSampler")}
    assert _rules(_project(tmp_path / "padded", padded), "eval-padding-duplicates")
    plain = {"train.py": train, "data.py": data.replace("SAMPLER", "torch.utils.data.SequentialSampler")}
    assert not _rules(_project(tmp_path / "plain", plain), "eval-padding-duplicates")
