"""Issue 35: classes of round 484-489's first look (docs/measured/cpu2/audit_heldout_round484.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (0587cdf)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_config_key_no_config_sets(tmp_path):
    """APTM: `if ('attr' in config.keys()) and config['attr']: train_attr(...)` with the YAML config loaded from
    configs/Retrieval_cuhk.yaml, which has no `attr` key: the default run takes the other arm, so train_attr's
    rank-0 loss log is not the run's. With `attr: True` in the YAML it is."""
    train = (DDP + "import yaml\ndef train_attr(model, loader):\n    for x in loader:\n"
             "        loss = model(x).sum()\n        loss.backward()\n        if dist.get_rank() == 0:\n"
             "            print('loss', loss.item())\ndef train(model, loader):\n    for x in loader:\n"
             "        dist.all_reduce(model(x).sum())\nif __name__ == '__main__':\n"
             "    config = yaml.load(open('configs/Retrieval_cuhk.yaml'), Loader=yaml.Loader)\n"
             "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    for epoch in range(3):\n        if ('attr' in config.keys()) and config['attr']:\n"
             "            train_attr(model, [torch.ones(2)] * 8)\n        else:\n"
             "            train(model, [torch.ones(2)] * 8)\n")
    absent = {"Retrieval.py": train, "configs/Retrieval_cuhk.yaml": "batch_size_train: 120\nlr: 0.0001\n"}
    assert not _rules(_project(tmp_path / "absent", absent), "rank0-local-loss")
    on = {"Retrieval.py": train, "configs/Retrieval_cuhk.yaml": "batch_size_train: 120\nattr: True\n"}
    assert _rules(_project(tmp_path / "on", on), "rank0-local-loss")
