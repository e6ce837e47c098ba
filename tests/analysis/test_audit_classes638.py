"""Issue 35: classes of round 638-643's first look (docs/measured/cpu2/audit_heldout_round638.txt), fixed after
it, quiet and loud; each test fails at the first look's code (5a918afe). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_count_per_rank_is_no_rank(tmp_path):
    """torchtitan: `if num_tokens_per_pp_microbatch % seq_len_divisor != 0: raise ValueError(...)`, the count read
    from `config.training.num_tokens_per_microbatch_per_dp_rank`: no rank test, so what follows runs on every rank
    (no collective-under-rank0 at the seeding helper's broadcast). A test of the rank itself splits them."""
    src = (DDP + "def set_determinism(seed):\n    t = torch.tensor([seed])\n    dist.broadcast(t, 0)\n"
           "    torch.manual_seed(int(t))\ndef train(config):\n    dist.init_process_group('gloo')\n"
           "    n = config.num_tokens_per_microbatch_per_dp_rank\n    if TEST:\n        raise ValueError(n)\n"
           "    set_determinism(0)\n    model = DDP(torch.nn.Linear(2, 2))\n    model(torch.ones(2)).sum().backward()\n"
           "if __name__ == '__main__':\n    train(None)\n")
    assert not _rules(_project(tmp_path / "count", {"t.py": src.replace("TEST", "n % 2 != 0")}),
                      "collective-under-rank0")
    assert _rules(_project(tmp_path / "rank", {"t.py": src.replace("TEST", "dist.get_rank() != 0")}),
                  "collective-under-rank0")


def test_a_rank_unpacked_from_a_tuple_whose_single_run_value_is_minus_one(tmp_path):
    """ScaledYOLOv4: `epochs, rank = opt.epochs, opt.global_rank` with `opt.global_rank = -1` in the single run
    and `dist.get_rank()` in DDP, then `init_seeds(2 + rank)`: rank 0 seeds 2, the single run 1 (seed-per-rank).
    A single-run rank of 0 seeds alike."""
    src = (DDP + "import argparse\ndef train(opt):\n    epochs, rank = opt.epochs, opt.global_rank\n"
           "    torch.manual_seed(2 + rank)\n    model = torch.nn.Linear(2, 2)\n    if rank != -1:\n"
           "        model = DDP(model)\n    model(torch.ones(2)).sum().backward()\nif __name__ == '__main__':\n"
           "    p = argparse.ArgumentParser()\n    p.add_argument('--epochs', type=int, default=3)\n"
           "    opt = p.parse_args()\n    opt.global_rank = SINGLE\n    if 'RANK' in __import__('os').environ:\n"
           "        dist.init_process_group('gloo')\n        opt.global_rank = dist.get_rank()\n    train(opt)\n")
    assert [f.line for f in _rules(_project(tmp_path / "minus", {"t.py": src.replace("SINGLE", "-1")}),
                                   "seed-per-rank")] == [6]
    assert not _rules(_project(tmp_path / "zero", {"t.py": src.replace("SINGLE", "0")}), "seed-per-rank")


def test_a_save_under_one_term_of_an_and_whose_default_fails(tmp_path):
    """FunCodec: `if hasattr(options, 'num_updates') and options.save_ckpt_every_steps > 0 and ...: torch.save(...)`
    on every rank, --save_ckpt_every_steps defaulting to -1: the default run never saves there (no
    save-on-every-rank). With a positive default it does."""
    src = (DDP + "import argparse\nif __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
           "    p.add_argument('--save_ckpt_every_steps', type=int, default=EVERY)\n    options = p.parse_args()\n"
           "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    for step in range(4):\n        model(torch.ones(2)).sum().backward()\n"
           "        options.num_updates = step\n"
           "        if hasattr(options, 'num_updates') and options.save_ckpt_every_steps > 0 and \\\n"
           "                step % options.save_ckpt_every_steps == 0:\n"
           "            torch.save(model.module.state_dict(), f'checkpoint-{step}.pth')\n")
    assert not _rules(_project(tmp_path / "off", {"t.py": src.replace("EVERY", "-1")}), "save-on-every-rank")
    assert _rules(_project(tmp_path / "on", {"t.py": src.replace("EVERY", "100")}), "save-on-every-rank")


EVAL = (DDP + "import argparse\nfrom torch.utils.data import DataLoader, DistributedSampler, SequentialSampler\n"
        "def evaluate(model, loader):\n    total = torch.zeros(1)\n    with torch.no_grad():\n"
        "        for x in loader:\n"
        "            total += model(x).sum()\n    dist.all_reduce(total)\n    return total\n"
        "if __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--dist_eval', action='store_true', default=DEFAULT)\n    args = p.parse_args()\n"
        "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
        "    dataset_val = [torch.ones(2)] * 5\n    if args.dist_eval:\n"
        "        sampler_val = DistributedSampler(dataset_val, shuffle=False)\n    else:\n"
        "        sampler_val = SequentialSampler(dataset_val)\n"
        "    evaluate(model, DataLoader(dataset_val, sampler=sampler_val))\n")


def test_a_flag_this_script_defines_on_though_another_defines_it_off(tmp_path):
    """LaBraM: run_vqnsp_training.py's `--dist_eval action='store_true', default=True` (always on), beside
    run_class_finetuning.py's off-by-default --dist_eval: the tokenizer script's padded validation sampler runs
    (eval-padding-duplicates there). Where this script's own default is off, it is quiet."""
    on = _project(tmp_path / "on", {"run_vq.py": EVAL.replace("DEFAULT", "True"),
                                    "run_ft.py": EVAL.replace("DEFAULT", "False")})
    assert [f.path.rsplit("/", 1)[-1] for f in _rules(on, "eval-padding-duplicates")] == ["run_vq.py"]


def test_a_timm_model_the_project_registers_by_the_options_default(tmp_path):
    """RepViT: `create_model(args.model, ...)` (timm's), --model defaulting to 'repvit_m1_1', a builder the
    project registers with `@register_model` whose blocks are Conv2d+BatchNorm2d: batchnorm-without-sync at the
    wrap. A registered builder without BatchNorm is quiet."""
    model = ("import torch.nn as nn\nfrom timm.models import register_model\n@register_model\n"
             "def repvit_m1_1(pretrained=False):\n    return nn.Sequential(nn.Conv2d(3, 8, 3), NORM)\n")
    main = (DDP + "import argparse\nfrom timm.models import create_model\nimport model\n"
            "if __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
            "    p.add_argument('--model', default='repvit_m1_1', type=str)\n    args = p.parse_args()\n"
            "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    net = create_model(args.model)\n"
            "    net = DDP(net)\n    net(torch.ones(1, 3, 8, 8)).sum().backward()\n")
    bn = _project(tmp_path / "bn", {"model/repvit.py": model.replace("NORM", "nn.BatchNorm2d(8)"), "main.py": main})
    assert [f.line for f in _rules(bn, "batchnorm-without-sync")] == [13]
    ln = _project(tmp_path / "ln", {"model/repvit.py": model.replace("NORM", "nn.GroupNorm(1, 8)"), "main.py": main})
    assert not _rules(ln, "batchnorm-without-sync")
