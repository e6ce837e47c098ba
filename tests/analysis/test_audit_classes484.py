"""Issue 35: classes of round 484-489's first look (docs/measured/cpu2/audit_heldout_round484.txt), fixed after
it, each quiet and loud; the class test fails at the first look's code (0587cdf). The last one guards against what
the full regression after round 478 showed this stop's own save_pretrained rule would break (BERT-style guards)."""

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


def test_a_one_process_test_beside_rank_0_in_a_bert_style_guard(tmp_path):
    """The full regression after round 473 (which made Hugging Face's save_pretrained a checkpoint save): ALBERT's
    and BERT-NER's `if args.do_train and (args.local_rank == -1 or torch.distributed.get_rank() == 0):` guards
    their final save; the script sets up the group only when `args.local_rank != -1`, so `local_rank == -1` is the
    run without DDP and the guard is rank 0's. Without that tie (the group set up whatever local_rank says), a
    launcher that leaves --local_rank at -1 makes every rank pass it (leaky)."""
    train = (DDP + "import argparse\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--local_rank', type=int, default=-1)\n"
             "parser.add_argument('--do_train', action='store_true')\nargs = parser.parse_args()\nSETUP"
             "torch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(2, 2))\nmodel(torch.ones(2)).sum().backward()\n"
             "if args.do_train and (args.local_rank == -1 or torch.distributed.get_rank() == 0):\n"
             "    model_to_save = model.module if hasattr(model, 'module') else model\n"
             "    model_to_save.save_pretrained('out')\n")
    tied = train.replace("SETUP", "if args.local_rank == -1:\n    device = 'cpu'\nelse:\n"
                                  "    dist.init_process_group('gloo')\n")
    assert not _rules(_project(tmp_path / "tied", {"run_glue.py": tied}), "save-on-every-rank")
    untied = train.replace("SETUP", "dist.init_process_group('gloo')\n")
    assert _rules(_project(tmp_path / "untied", {"run_glue.py": untied}), "save-on-every-rank")

