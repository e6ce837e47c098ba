"""Issue 35, held-out batches 93-98 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_batch93..98.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project, rules

from lab_utils.analysis import audit

SWITCHED = ("import os, torch, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
            "if 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:\n    dist.init_process_group('nccl')\n")


def found(root) -> list:
    return [f.rule for f in audit.audit_paths([root])]


def test_helpers_nothing_names_run_nothing(tmp_path):
    """semantic-segmentation's utils.py: `reduce_tensor` (an all_reduce outside the switch) and a
    `@torch.no_grad() def throughput(dataloader, ...)` peeking `next(iter(dataloader))`, neither called nor
    imported anywhere: dead code in these files. Once the script imports and calls them, they run."""
    utils = ("import torch, torch.distributed as dist\ndef reduce_tensor(t):\n    rt = t.clone()\n"
             "    dist.all_reduce(rt)\n    return rt\n@torch.no_grad()\ndef throughput(dataloader, model):\n"
             "    images, _ = next(iter(dataloader))\n    return model(images)\n")
    train = SWITCHED + "{imp}model = DDP(Net())\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n{use}"
    quiet = _project(tmp_path / "quiet", {"utils.py": utils, "train.py": train.format(imp="", use="")})
    assert not {"collective-outside-switch", "peek-iterator"} & set(found(quiet)), found(quiet)
    loud = _project(tmp_path / "loud", {"utils.py": utils, "train.py": train.format(
        imp="from utils import reduce_tensor, throughput\n",
        use="    print(reduce_tensor(loss))\nthroughput(loader, model)\n")})
    assert {"collective-outside-switch", "peek-iterator"} <= set(found(loud)), found(loud)


def test_a_sync_flag_read_from_the_project_yaml(tmp_path):
    """CRIS: `if args.sync_bn: model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` with args read from
    config/cris_r50.yaml, which sets `sync_bn: True`: converted in the default run."""
    script = (DDP_HEAD + "import torch.nn as nn\ntorch.manual_seed(0)\nargs = load_cfg('config/run.yaml')\n"
              "model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\nif args.sync_bn:\n"
              "    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model)\n")
    on = _project(tmp_path / "on", {"train.py": script, "config/run.yaml": "TRAIN:\n  sync_bn: True\n"})
    off = _project(tmp_path / "off", {"train.py": script, "config/run.yaml": "TRAIN:\n  lr: 0.1\n"})
    assert "batchnorm-without-sync" not in found(on)
    assert "batchnorm-without-sync" in found(off)


def test_gathered_results_kept_once_per_sample_id(tmp_path):
    """DETR-style coco_eval (TransTrack): `merge()` all_gathers the image ids and evaluations, then keeps
    `np.unique(merged_img_ids, return_index=True)`: the padded duplicates are dropped before the metric."""
    evaluator = ("import numpy as np\nimport torch.distributed as dist\ndef all_gather(x):\n"
                 "    out = [None] * dist.get_world_size()\n    dist.all_gather_object(out, x)\n    return out\n"
                 "def merge(img_ids, evals):\n    all_ids = all_gather(img_ids)\n    merged = []\n"
                 "    for p in all_ids:\n        merged.extend(p)\n{keep}    return merged\n")
    script = (DDP_HEAD + "torch.manual_seed(0)\nfrom coco_eval import merge\nmodel = DDP(Net())\n"
              "sampler_val = DistributedSampler(dataset_val, shuffle=False)\n"
              "def evaluate(model, loader):\n    ids, out = [], []\n    with torch.no_grad():\n"
              "        for x, i in loader:\n            ids.append(i)\n            out.append(model(x))\n"
              "    stats = torch.tensor([len(ids)])\n    dist.all_reduce(stats)\n    return merge(ids, out)\n"
              "for epoch in range(2):\n    evaluate(model, DataLoader(dataset_val, sampler=sampler_val))\n")
    dedup = "    merged, idx = np.unique(np.array(merged), return_index=True)\n"
    quiet = _project(tmp_path / "quiet", {"coco_eval.py": evaluator.format(keep=dedup), "train.py": script})
    loud = _project(tmp_path / "loud", {"coco_eval.py": evaluator.format(keep=""), "train.py": script})
    assert "eval-padding-duplicates" not in found(quiet)
    assert "eval-padding-duplicates" in found(loud)


def test_an_option_declared_through_a_wrapper_and_a_ddp_class_held_in_a_name():
    """CroCo-Stereo: `add_arg('--accum_iter', default=1, ...)`, a thin wrapper of add_argument, so its
    `update_grad=(step + 1) % accum_iter == 0` steps every micro-batch. TPVFormer: `ddp_model_module =
    torch.nn.parallel.DistributedDataParallel`, then `my_model = ddp_model_module(...)`: a DDP wrap."""
    accum = ("import argparse\nparser = argparse.ArgumentParser()\ndef add_arg(*a, **k):\n"
             "    parser.add_argument(*a, **k)\nadd_arg('--accum_iter', default={n}, type=int)\n"
             "args = parser.parse_args()\nmodel = DDP(Net())\naccum_iter = args.accum_iter\n"
             "for step, x in enumerate(loader):\n    loss = model(x) / accum_iter\n"
             "    loss_scaler(loss, opt, parameters=model.parameters(), update_grad=(step + 1) % accum_iter == 0)\n")
    assert "accumulation-without-no-sync" not in rules(accum.format(n=1))
    assert "accumulation-without-no-sync" in rules(accum.format(n=4))
    alias = ("ddp_model_module = torch.nn.parallel.{cls}\nmy_model = ddp_model_module(Net())\n"
             "for x in loader:\n    my_model(x).sum().backward()\nif rank == 0:\n"
             "    torch.save({{'state_dict': my_model.state_dict()}}, 'c.pth')\n")
    assert "save-without-module" in rules(alias.format(cls="DistributedDataParallel"))
    assert "save-without-module" not in rules(alias.format(cls="DataParallelLike"))
