"""Issue 35, held-out batches 59-62 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_batch59..62.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project, rules

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def found(root) -> list:
    return [f.rule for f in audit.audit_paths([root])]


def test_accumulation_in_an_engines_step_function_and_a_count_from_yaml(tmp_path):
    """ConvAI (pytorch-ignite): `def update(engine, batch)` runs once per micro-batch and steps only when
    `engine.state.iteration % args.gradient_accumulation_steps == 0`: accumulation, reported at the gate. Latte:
    the count is read from a YAML config where it is 1: no accumulation."""
    step = ("model = DDP(Net())\ndef update(engine, batch):\n    loss = model(batch).sum() / args.{n}\n"
            "    loss.backward()\n    if engine.state.iteration % args.{n} == 0:\n        opt.step()\n"
            "        opt.zero_grad()\n    return loss.item()\ntrainer = Engine(update)\n")
    hits = [f for f in audit.audit_source(SEEDED + step.format(n="gradient_accumulation_steps"))
            if f.rule == "accumulation-without-no-sync"]
    assert hits and "engine.state.iteration" in hits[0].message, hits
    script = SEEDED + step.format(n="gradient_accumulation_steps")
    one = _project(tmp_path / "one", {"train.py": script, "configs/train.yaml": "gradient_accumulation_steps: 1\n"})
    four = _project(tmp_path / "four", {"train.py": script, "configs/train.yaml": "gradient_accumulation_steps: 4\n"})
    assert "accumulation-without-no-sync" not in found(one)
    assert "accumulation-without-no-sync" in found(four)


def test_a_closure_whose_collective_runs_only_under_the_switch():
    """SegmenTron: `def reduce_tensor(t): dist.all_reduce(t)` inside update(), called only under `if
    self.distributed:`: the single-process run never reaches the collective."""
    src = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\n"
           "args = p.parse_args()\nif args.distributed:\n    dist.init_process_group('gloo')\n"
           "class Metric:\n    def __init__(self, distributed):\n        self.distributed = distributed\n"
           "    def update(self, x):\n        def reduce_tensor(t):\n            dist.all_reduce(t)\n"
           "            return t\n{guard}        self.total = reduce_tensor(x)\n"
           "metric = Metric(args.distributed)\nfor x in loader:\n    metric.update(x)\n")
    head = "import torch, torch.distributed as dist\ntorch.manual_seed(0)\n"
    assert "collective-outside-switch" not in rules(src.format(guard="        if self.distributed:\n    "), head)
    assert "collective-outside-switch" in rules(src.format(guard=""), head)


def test_an_or_early_return_on_the_rank_and_values_reduced_in_a_loop():
    """VICRegL: `if args.rank != 0 or epoch % freq != 0: return` guards its checkpoint helper; its logs are
    reduced in place, `for v in logs.values(): dist.reduce(v.div_(world_size), 0)`, before rank 0 prints them."""
    save = ("def checkpoint(args, epoch, model):\n    if {test}:\n        return\n"
            "    torch.save(model.module.state_dict(), 'model.pth')\nmodel = DDP(Net())\nfor epoch in range(2):\n"
            "    for x in loader:\n        model(x).sum().backward()\n    checkpoint(args, epoch, model)\n")
    assert "save-on-every-rank" not in rules(save.format(test="args.rank != 0 or epoch % args.freq != 0"))
    assert "save-on-every-rank" in rules(save.format(test="epoch % args.freq != 0"))
    logs = ("import json\nmodel = DDP(Net())\nfor x in loader:\n    loss, logs = model(x)\n    loss.backward()\n"
            "{reduce}    if rank == 0:\n        stats = dict(step=1)\n        stats.update(logs)\n"
            "        print(json.dumps(stats))\n")
    assert "rank0-local-loss" not in rules(logs.format(
        reduce="    for v in logs.values():\n        dist.reduce(v.div_(world_size), 0)\n"))
    assert "rank0-local-loss" in rules(logs.format(reduce=""))


def test_an_evaluation_split_asked_for_only_under_an_option_off_by_default(tmp_path):
    """VICRegL: `if args.evaluate: val_loader, _ = build_loader(args, is_train=False)`: the default run never
    evaluates, so the padding sampler counts nothing."""
    lib = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
           "def build_loader(args, is_train):\n    ds = make(is_train)\n"
           "    sampler = DistributedSampler(ds, shuffle=is_train)\n"
           "    return DataLoader(ds, sampler=sampler), sampler\n")
    script = (SEEDED + "import argparse\nfrom datasets import build_loader\np = argparse.ArgumentParser()\n"
              "p.add_argument('--evaluate', action='store_true')\nargs = p.parse_args()\nmodel = DDP(Net())\n"
              "train_loader, sampler = build_loader(args, is_train=True)\n{guard}"
              "val_loader, _ = build_loader(args, is_train=False)\nfor epoch in range(2):\n"
              "    sampler.set_epoch(epoch)\n    for x in train_loader:\n        model(x).sum().backward()\n"
              "    {guard}evaluate(model, val_loader)\n"
              "def evaluate(model, loader):\n    with torch.no_grad():\n        for x in loader:\n"
              "            acc = model(x).mean()\n            dist.all_reduce(acc)\n")
    quiet = _project(tmp_path / "off", {"datasets.py": lib, "train.py": script.format(guard="if args.evaluate: ")})
    loud = _project(tmp_path / "on", {"datasets.py": lib, "train.py": script.format(guard="")})
    assert "eval-padding-duplicates" not in found(quiet)
    assert "eval-padding-duplicates" in found(loud)


def test_a_gather_of_predicted_classes_and_the_lr_line_of_a_long_call():
    """iBOT: concat_all_gather(probs.max(dim=1)[1]) and of the labels, for an accuracy: class indices carry no
    gradient. Its lr is scaled by the world size inside a call spanning lines: reported at the product's line."""
    helper = ("def concat_all_gather(tensor):\n    out = [torch.ones_like(tensor) for _ in range(world_size)]\n"
              "    dist.all_gather(out, tensor)\n    return torch.cat(out)\nmodel = DDP(Net())\n"
              "for x, labels in loader:\n    probs = model(x)\n    probs.sum().backward()\n    opt.step()\n"
              "    pred = concat_all_gather({arg})\n")
    assert "gather-without-grad" not in rules(helper.format(arg="probs.max(dim=1)[1]"))
    assert "gather-without-grad" in rules(helper.format(arg="probs"))
    lr = ("lr_schedule = cosine_scheduler(\n    args.lr * (args.batch_size_per_gpu * dist.get_world_size()) / 256,\n"
          "    args.min_lr, args.epochs)\n")
    hits = [f for f in audit.audit_source(SEEDED + lr) if f.rule == "lr-grows-with-world-size"]
    assert [h.line for h in hits] == [SEEDED.count("\n") + 2], hits


def test_a_printer_helper_these_files_lack_and_a_settings_field_off_by_default():
    """ColBERT: rank 0 prints its own running loss through `print_message` from colbert.utils.utils (not in these
    files); its in-batch-negatives print sits under `config.use_ib_negatives`, a settings dataclass field whose
    default is DefaultVal(False)."""
    src = ("from colbert.utils.utils import print_message\nfrom dataclasses import dataclass\n@dataclass\n"
           "class Settings:\n    use_ib_negatives: bool = DefaultVal({ib})\nconfig = Settings()\n"
           "model = DDP(Net())\ntrain_loss = 0\nfor x in loader:\n    loss = model(x).sum()\n"
           "    if config.use_ib_negatives:\n        if rank < 1:\n            print('ib', loss.item())\n"
           "    loss.backward()\n    train_loss = 0.9 * train_loss + 0.1 * loss.item()\n{log}")
    log = "    if rank < 1:\n        print_message(train_loss)\n"
    assert "rank0-local-loss" not in rules(src.format(ib="False", log=""))
    assert "rank0-local-loss" in rules(src.format(ib="True", log=""))
    assert "rank0-local-loss" in rules(src.format(ib="False", log=log))


def test_a_resume_path_option_whose_parser_these_files_lack():
    """SegmenTron: `if args.resume and os.path.isfile(args.resume): torch.load(args.resume)` where no audited file
    defines --resume: an optional file, not part of the default run. Defined with a default path, it is."""
    src = ("import os\n{parser}model = DDP(Net())\nif args.resume and os.path.isfile(args.resume):\n"
           "    state = torch.load(args.resume)\n    model.load_state_dict(state['state_dict'])\n")
    defined = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--resume', default='ckpt/last.pth')\n"
               "args = p.parse_args()\n")
    assert "load-without-map-location" not in rules(src.format(parser=""))
    assert "load-without-map-location" in rules(src.format(parser=defined))


def test_an_ema_copy_overwritten_with_the_wrapped_models_weights():
    """Latte: `ema = deepcopy(model).to(device)` before the wrap, then `update_ema(ema, model.module, decay=0)`
    after it: the EMA starts from rank 0's broadcast weights on every rank."""
    src = ("from copy import deepcopy\ntorch.manual_seed(args.seed + rank)\nmodel = Net()\n"
           "ema = deepcopy(model).to(device)\nmodel = DDP(model)\n{sync}for x in loader:\n"
           "    model(x).sum().backward()\n    update_ema(ema, model.module)\nevaluate(ema)\n")
    head = DDP_HEAD
    assert "seed-per-rank" not in rules(src.format(sync="update_ema(ema, model.module, decay=0)\n"), head)
    assert "seed-per-rank" in rules(src.format(sync=""), head)
