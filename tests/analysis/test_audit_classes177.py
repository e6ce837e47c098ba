"""Issue 35: classes of round 177-182's first look (docs/measured/cpu2/audit_heldout_round177.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (94f32f0)."""

from pathlib import Path

from test_audit import _project
from test_audit_classes135 import SEEDED

from lab_utils.analysis import audit


def _places(finding) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for p, line in ((finding.path, finding.line), *finding.related)}


def _rules(root: Path) -> list[tuple[str, int]]:
    return sorted((f.rule, f.line) for f in audit.audit_paths([root]))


def _line(text: str, part: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if part in s)


LOOP = SEEDED + ("model = DDP(Net())\nsampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=sampler)\n"
                 "for epoch in range(10):\n")


def test_set_epoch_inside_the_loop_over_its_own_loader_is_late(tmp_path):
    """OTAvatar: `for it, data in enumerate(train_dataset): train_dataset.sampler.set_epoch(epoch)`; MX-Font the
    same inside `for batch in cyclize(loader)`. The loop made the loader's iterator, which drew the epoch's
    indices, before its body runs: epoch 1 repeats epoch 0's order. Before the loop it is right."""
    late = LOOP + "    for i, x in enumerate(loader):\n        loader.sampler.set_epoch(epoch)\n" \
                  "        model(x).sum().backward()\n"
    assert ("set-epoch-late", _line(late, "set_epoch")) in _rules(_project(tmp_path / "a", {"train.py": late}))
    by_name = late.replace("loader.sampler.set_epoch", "sampler.set_epoch")
    assert ("set-epoch-late", _line(late, "set_epoch")) in _rules(_project(tmp_path / "b", {"train.py": by_name}))
    early = LOOP + ("    sampler.set_epoch(epoch)\n    for i, x in enumerate(loader):\n"
                    "        model(x).sum().backward()\n")
    assert not [r for r in _rules(_project(tmp_path / "c", {"train.py": early})) if r[0].startswith("set-epoch")]


def test_a_one_process_test_in_a_rank0_guard_is_no_leak(tmp_path):
    """slr_handshape's is_main_process: `'WORLD_SIZE' not in os.environ or os.environ['WORLD_SIZE'] == '1' or
    os.environ['LOCAL_RANK'] == '0'`: each arm is true only on rank 0 (or in a run of one process), so the save
    under it is rank 0's. An option in that place (`not args.mp or ...`) would leak under torchrun."""
    guard = ("def is_main_process():\n    return 'WORLD_SIZE' not in os.environ or "
             "os.environ['WORLD_SIZE'] == '1' or os.environ['LOCAL_RANK'] == '0'\n")
    train = SEEDED + guard + "model = DDP(Net())\nif is_main_process():\n" \
                             "    torch.save(model.module.state_dict(), 'last.pt')\n"
    assert "save-on-every-rank" not in [r for r, _ in _rules(_project(tmp_path / "a", {"train.py": train}))]
    leaky = train.replace("os.environ['WORLD_SIZE'] == '1'", "args.single")
    assert "save-on-every-rank" in [r for r, _ in _rules(_project(tmp_path / "b", {"train.py": leaky}))]


LOGGER = ("import torch\nclass Logger:\n    def __init__(self, d):\n        self.d = d\n"
          "    def __enter__(self):\n        return self\n    def __exit__(self, *a):\n        pass\n"
          "    def log_epoch(self, epoch, models):\n        self.models = models\n        self.save_cpk(epoch)\n"
          "    def save_cpk(self, epoch):\n        torch.save({k: v.state_dict() for k, v in self.models.items()}, "
          "f'{self.d}/{epoch}.pt')\n")


def test_an_instance_bound_by_with_runs_its_class_methods(tmp_path):
    """DaGAN: `with Logger(log_dir) as logger:` ... `logger.log_epoch(epoch, models)`, whose save_cpk saves with
    no rank guard: every rank writes the checkpoint. Under `if rank == 0:` it is rank 0's."""
    train = SEEDED + "from logger import Logger\nmodel = DDP(Net())\nwith Logger('out') as logger:\n" \
                     "    for epoch in range(3):\n        logger.log_epoch(epoch, {'g': model.module})\n"
    found = _rules(_project(tmp_path / "a", {"train.py": train, "logger.py": LOGGER}))
    assert "save-on-every-rank" in [r for r, _ in found], found
    guarded = train.replace("        logger.log_epoch", "        if rank == 0:\n            logger.log_epoch")
    found = _rules(_project(tmp_path / "b", {"train.py": guarded, "logger.py": LOGGER}))
    assert "save-on-every-rank" not in [r for r, _ in found], found


def test_a_running_sum_of_the_loss_is_the_loss_whatever_its_name(tmp_path):
    """`total += loss.item()`, then every rank prints `total / len(loader)`: its own shard's mean. A text built
    from the loss (`msg += fmt(loss_info)`) or a metric a loss module computes is not such a sum."""
    train = LOOP + ("    total = 0\n    for x in loader:\n        loss = model(x).mean()\n        loss.backward()\n"
                    "        opt.step()\n        total += loss.item()\n    print(total / len(loader))\n")
    found = _rules(_project(tmp_path / "a", {"train.py": train}))
    assert ("every-rank-prints-loss", _line(train, "print(total")) in found, found
    metric = train.replace("total += loss.item()", "total += lpips_loss(x, x)")
    assert "every-rank-prints-loss" not in [r for r, _ in _rules(_project(tmp_path / "b", {"train.py": metric}))]


def test_a_gloss_dictionary_is_no_loss(tmp_path):
    """Sign language's `gloss_dict` (the glosses' vocabulary; VAC_CSLR): `arg.num_classes = len(gloss_dict) + 1`
    fills no loss record, so rank 0 printing the arguments logs no loss."""
    train = SEEDED + ("model = DDP(Net())\nclass Processor:\n    def __init__(self, arg):\n        self.arg = arg\n"
                      "        self.gloss_dict = load()\n        self.arg.model_args['num_classes'] = "
                      "len(self.gloss_dict) + 1\n    def start(self):\n        if rank == 0:\n"
                      "            print(vars(self.arg))\n        for x in loader:\n"
                      "            loss = model(x).mean()\n"
                      "            loss.backward()\n            opt.step()\n"
                      "Processor(args).start()\n")
    assert "rank0-local-loss" not in [r for r, _ in _rules(_project(tmp_path / "a", {"train.py": train}))]
    lossy = train.replace("gloss_dict", "loss_dict")  # (a record named a loss: what `gloss_dict` read as)
    assert "rank0-local-loss" in [r for r, _ in _rules(_project(tmp_path / "b", {"train.py": lossy}))]


SWITCHED = ("import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as "
            "DDP\ntorch.manual_seed(0)\nclass Group:\n    def size(self):\n        return 1\nDEFAULT_GROUP = Group()\n"
            "if int(os.environ.get('WORLD_SIZE', 1)) > 1:\n    dist.init_process_group('nccl')\n"
            "    DEFAULT_GROUP = dist.group.WORLD\n"
            "def sync_sparse(g, group):\n    def sync(t):\n        dist.all_reduce(t, group=group)\n    sync(g)\n"
            "def sync_dense(g, group):\n    dist.all_reduce(g, group=group)\n"
            "def step(g, mode):\n    sync_func = sync_sparse if mode else sync_dense\n"
            "    if mode == 'sparse':\n        sync_func = sync_sparse\n    else:\n        sync_func = sync_dense\n"
            "    if DEFAULT_GROUP.size() > 1:\n        sync_func(g, DEFAULT_GROUP)\n"
            "for i in range(10):\n    step(torch.zeros(2), 'sparse')\n")


def test_a_group_size_is_a_switch_and_a_function_runs_where_its_alias_is_called(tmp_path):
    """Grendel-GS: `if utils.DEFAULT_GROUP.size() > 1: sync_func(self, group)` with `sync_func =
    sync_gradients_sparsely` picked in an if chain; the all_reduce sits in a closure of that function. The
    collectives run only at two ranks or more, so the one-process run never reaches them."""
    assert "collective-outside-switch" not in [r for r, _ in _rules(_project(tmp_path / "a", {"train.py": SWITCHED}))]
    unswitched = SWITCHED.replace("    if DEFAULT_GROUP.size() > 1:\n        sync_func(g, DEFAULT_GROUP)\n",
                                  "    sync_func(g, DEFAULT_GROUP)\n")
    assert "collective-outside-switch" in [r for r, _ in _rules(_project(tmp_path / "b", {"train.py": unswitched}))]


def test_a_constant_start_before_the_loop_does_not_decide_what_the_log_reads(tmp_path):
    """Grendel-GS: `ema_loss_for_log = 0` before the loop; at the top of each iteration rank 0's bar shows it; later
    in the iteration it takes the all-reduced loss. The log reads the reduced value (of the iteration before)."""
    train = LOOP + ("    ema_loss = 0\n    for x in loader:\n        if rank == 0:\n            print(f'{ema_loss}')\n"
                    "        loss = model(x).mean()\n        loss.backward()\n        opt.step()\n"
                    "        l = loss.detach()\n        dist.all_reduce(l)\n        ema_loss = l.item()\n")
    assert "rank0-local-loss" not in [r for r, _ in _rules(_project(tmp_path / "a", {"train.py": train}))]
    unreduced = train.replace("        dist.all_reduce(l)\n", "")
    assert "rank0-local-loss" in [r for r, _ in _rules(_project(tmp_path / "b", {"train.py": unreduced}))]


def test_a_key_of_a_record_named_a_loss_is_a_loss(tmp_path):
    """RALF: `train_loss_dict = train(...)`, then rank 0 logs `train_loss_dict["G/total"]`: the record is named a
    loss, and its key names which one; only a setting's key (`["lr"]`) reads no loss."""
    train = SEEDED + ("model = DDP(Net())\ndef train_one(loader):\n    out = {'G/total': []}\n    for x in loader:\n"
                      "        loss = model(x).mean()\n        loss.backward()\n        opt.step()\n"
                      "        out['G/total'].append(loss.item())\n"
                      "    return {k: sum(v) / len(v) for k, v in out.items()}\n"
                      "for epoch in range(3):\n    train_loss_dict = train_one(loader)\n    if rank == 0:\n"
                      "        print('train_loss = %.4f' % train_loss_dict['G/total'])\n")
    assert "rank0-local-loss" in [r for r, _ in _rules(_project(tmp_path / "a", {"train.py": train}))]
    setting = train.replace("train_loss_dict['G/total']", "train_loss_dict['lr']")
    assert "rank0-local-loss" not in [r for r, _ in _rules(_project(tmp_path / "b", {"train.py": setting}))]


def test_a_gather_of_values_made_under_no_grad_loses_no_gradient(tmp_path):
    """GALIP's FID/CLIP-score test: `clip_cos = torch.FloatTensor([0.0])`, then `clip_cos = clip_cos + sim` inside
    `with torch.no_grad():`, then `dist.all_gather(gathered, clip_cos)` and `torch.cat(gathered)`: nothing to lose."""
    helper = ("import torch, torch.distributed as dist\ndef clip_score_loss(model, loader, n):\n"
              "    clip_cos = torch.FloatTensor([0.0])\n    for x in loader:\n        with torch.no_grad():\n"
              "            clip_cos = clip_cos + model(x).mean()\n"
              "    gathered = [torch.empty_like(clip_cos) for _ in range(n)]\n    dist.all_gather(gathered, clip_cos)\n"
              "    return torch.cat(gathered).mean()\n")
    train = SEEDED + "from metric import clip_score_loss\nmodel = DDP(Net())\nfor epoch in range(3):\n" \
                     "    loss = clip_score_loss(model, loader, world_size)\n    loss.backward()\n"
    files = {"train.py": train, "metric.py": helper}
    assert "gather-without-grad" not in [r for r, _ in _rules(_project(tmp_path / "a", files))]
    graded = {**files, "metric.py": helper.replace("        with torch.no_grad():\n            clip_cos",
                                                   "        clip_cos")}
    assert "gather-without-grad" in [r for r, _ in _rules(_project(tmp_path / "b", graded))]


def test_set_epoch_missing_names_where_a_tuple_returned_loader_is_iterated(tmp_path):
    """BEVCar: `train_dataloader, _ = compile_data(...)` (the builder returns the train and val loaders), then
    `iter(train_dataloader)` re-made whenever it is exhausted, with no set_epoch: the finding names that line."""
    data = ("from torch.utils.data import DataLoader, DistributedSampler\ndef compile_data(ds, vs):\n"
            "    train = DataLoader(ds, sampler=DistributedSampler(ds))\n    val = DataLoader(vs)\n"
            "    return train, val\n")
    train = SEEDED + ("from data import compile_data\nmodel = DDP(Net())\ntrain_loader, _ = compile_data(ds, vs)\n"
                      "for epoch in range(3):\n    it = iter(train_loader)\n    for step in range(100):\n"
                      "        model(next(it)).sum().backward()\n")
    found = [f for f in audit.audit_paths([_project(tmp_path, {"train.py": train, "data.py": data})])
             if f.rule == "set-epoch-missing"]
    line = next(i for i, s in enumerate(train.splitlines(), 1) if "iter(train_loader)" in s)
    assert len(found) == 1 and ("train.py", line) in _places(found[0]), [(f.line, f.related) for f in found]


RECORDER = ("class Recorder:\n    def __init__(self, path):\n        self.path = path\n"
            "    @master_only\n    def print_log(self, s):\n        print(s)\n")


def test_a_record_backwarded_by_key_and_a_printer_handed_in_as_a_parameter(tmp_path):
    """slr_handshape: `output['total_loss'].backward()`, then rank 0 writes every `'_loss'` entry of `output`: the
    record holds the loss (`wandb.log({k: v for k, v in output.items() if '_loss' in k})`). VAC_CSLR:
    `seq_train(loader, model, opt, recoder)` is handed `self.recoder =
    utils.Recorder(...)`, whose `@master_only` print_log prints rank 0's own `loss.item()`."""
    slr = SEEDED + ("model = DDP(Net())\nfor x in loader:\n    output = model(x)\n    output['total_loss'].backward()\n"
                    "    opt.step()\n    if rank == 0:\n"
                    "        wandb.log({k: v for k, v in output.items() if '_loss' in k})\n")
    assert "rank0-local-loss" in [r for r, _ in _rules(_project(tmp_path / "a", {"train.py": slr}))]
    seq = ("def seq_train(loader, model, opt, recoder):\n    for x in loader:\n        loss = model(x).mean()\n"
           "        loss.backward()\n        opt.step()\n        recoder.print_log(f'Loss: {loss.item()}')\n")
    main = SEEDED + ("from seq import seq_train\nfrom record import Recorder\nmodel = DDP(Net())\n"
                     "class Processor:\n    def __init__(self):\n        self.recoder = Recorder('log.txt')\n"
                     "    def start(self):\n        seq_train(loader, model, opt, self.recoder)\nProcessor().start()\n")
    files = {"main.py": main, "seq.py": seq, "record.py": "from dist import master_only\n" + RECORDER,
             "dist.py": "import torch.distributed as dist\ndef master_only(f):\n    def w(*a, **k):\n"
                        "        if dist.get_rank() == 0:\n            return f(*a, **k)\n    return w\n"}
    found = [f for f in audit.audit_paths([_project(tmp_path / "b", files)]) if "loss" in f.rule]
    assert [(f.rule, Path(f.path).name) for f in found] == [("rank0-local-loss", "seq.py")], found


def test_a_switch_on_the_launchers_world_size_variable(tmp_path):
    """`if int(os.environ.get('WORLD_SIZE', 1)) > 1: dist.init_process_group(...)`: a distributed switch read
    straight from the launcher's variable; an all_reduce outside it breaks the one-process run."""
    train = ("import os, torch, torch.distributed as dist\ntorch.manual_seed(0)\n"
             "if int(os.environ.get('WORLD_SIZE', 1)) > 1:\n    dist.init_process_group('nccl')\n"
             "def sync(g):\n    dist.all_reduce(g)\nfor i in range(10):\n    sync(torch.zeros(2))\n")
    assert "collective-outside-switch" in [r for r, _ in _rules(_project(tmp_path / "a", {"train.py": train}))]
    switched = train.replace("    sync(torch.zeros(2))", "    if int(os.environ.get('WORLD_SIZE', 1)) > 1:\n"
                                                          "        sync(torch.zeros(2))")
    assert "collective-outside-switch" not in [r for r, _ in _rules(_project(tmp_path / "b", {"train.py": switched}))]


AVERAGER = ("class Logger:\n    def __init__(self, rank):\n        self.rank = rank\n        self.avg = Averager()\n"
            "    def __enter__(self):\n        return self\n    def __exit__(self, *a):\n        pass\n"
            "    def log_iteration(self, it, loss=None, metrics=None):\n"
            "        if self.rank != 0:\n            return\n"
            "        log_str = f'it {it}'\n        if loss is not None:\n            self.avg.update(loss)\n"
            "            log_str += f' Loss: {self.avg.value}'\n        print(log_str)\n"
            "class Averager:\n    def update(self, v):\n        self.value = v\n")


def test_a_logger_bound_by_with_and_fed_the_reduced_loss(tmp_path):
    """HaGRID: `with Logger(..., gpu_id) as logger:` in the training loop, `dist.reduce(loss, dst=0)`, then
    `logger.log_iteration(i, epoch, loss.item())`, whose rank-0 text carries the meter it feeds `loss` into; the
    evaluation calls hand no loss (the parameter's default). Fed the unreduced loss, it is rank 0's own."""
    train = SEEDED + ("from logger import Logger\nmodel = DDP(Net())\nfor epoch in range(3):\n"
                      "    with Logger(rank) as logger:\n        for i, x in enumerate(loader):\n"
                      "            loss = model(x).mean()\n            loss.backward()\n            opt.step()\n"
                      "            dist.reduce(loss, dst=0)\n            loss = loss / world_size\n"
                      "            logger.log_iteration(i, loss.item())\n"
                      "    with Logger(rank) as logger:\n        logger.log_iteration(0, metrics={'f1': 1.0})\n")
    files = {"train.py": train, "logger.py": AVERAGER}
    assert "rank0-local-loss" not in [r for r, _ in _rules(_project(tmp_path / "a", files))]
    local = {**files, "train.py": train.replace("            dist.reduce(loss, dst=0)\n", "")}
    assert "rank0-local-loss" in [r for r, _ in _rules(_project(tmp_path / "b", local))]


LOSS_FILE = ("import numpy as np\nclass Logger:\n    def __init__(self, d):\n        self.loss_list = []\n"
             "        self.log_file = open(d + '/log.txt', 'a')\n    def __enter__(self):\n        return self\n"
             "    def __exit__(self, *a):\n        self.log_file.close()\n"
             "    def log_iter(self, losses):\n        self.loss_list.append(list(losses.values()))\n"
             "    def log_scores(self):\n        loss_mean = np.array(self.loss_list).mean(axis=0)\n"
             "        loss_string = '; '.join('%.5f' % v for v in loss_mean)\n"
             "        print(loss_string, file=self.log_file)\n        self.loss_list = []\n"
             "    def log_epoch(self, epoch):\n        self.epoch = epoch\n        self.log_scores()\n")


def test_a_method_the_loggers_hook_calls_on_itself_logs_the_fed_losses(tmp_path):
    """DaGAN: the training loop feeds `logger.log_iter(losses=...)` and ends each epoch with `logger.log_epoch(...)`,
    which calls `self.log_scores()`, whose print into the shared log.txt shows the fed losses: every rank appends
    its own. Under `if rank == 0:` only rank 0 writes them (its own micro-batches' losses)."""
    train = SEEDED + ("from logger import Logger\nmodel = DDP(Net())\nwith Logger('out') as logger:\n"
                      "    for epoch in range(3):\n        for x in loader:\n            loss = model(x).mean()\n"
                      "            loss.backward()\n            opt.step()\n"
                      "            logger.log_iter({'l': loss.item()})\n        logger.log_epoch(epoch)\n")
    found = audit.audit_paths([_project(tmp_path / "a", {"train.py": train, "logger.py": LOSS_FILE})])
    assert [(f.rule, Path(f.path).name) for f in found if "loss" in f.rule] == [
        ("every-rank-prints-loss", "logger.py")], found
    guarded = train.replace("        logger.log_epoch(epoch)",
                            "        if rank == 0:\n            logger.log_epoch(epoch)")
    found = audit.audit_paths([_project(tmp_path / "b", {"train.py": guarded, "logger.py": LOSS_FILE})])
    assert "every-rank-prints-loss" not in [f.rule for f in found], found
