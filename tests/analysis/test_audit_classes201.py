"""Issue 35: classes of round 201-206's first look (docs/measured/cpu2/audit_heldout_round201.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (009df2a)."""


from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _has
from test_audit_classes195 import LOOP

from lab_utils.analysis import audit


def test_the_rank_of_a_node_is_worked_out_once_per_depth(tmp_path, monkeypatch):
    """OpenOOD: helpers called from many functions, each called from many places, made the audit ask the same
    rank question along every path (6.5 minutes on one project, 1.7 s once answered once per node and depth)."""
    from lab_utils.analysis.audit.ranks import Guards

    lines = ["import torch.distributed as dist", "def leaf():", "    print('x')"]
    for level in range(4):  # every function of a level calls every function of the level below
        below = ["leaf"] if level == 0 else [f"f{level - 1}_{j}" for j in range(6)]
        for i in range(6):
            lines += [f"def f{level}_{i}():"] + [f"    {b}()" for b in below]
    lines += ["def main():", "    dist.init_process_group('gloo')", "    if dist.get_rank() == 0:", "        f3_0()",
              "main()"]
    asked: dict = {}
    inner = Guards._effective

    def counting(self, m, node, depth):
        asked[id(node), depth] = asked.get((id(node), depth), 0) + 1
        return inner(self, m, node, depth)

    monkeypatch.setattr(Guards, "_effective", counting)
    _found(_project(tmp_path, {"train.py": "\n".join(lines) + "\n"}))
    assert asked and max(asked.values()) <= 2  # (once while the callers are indexed, once after)


def test_gathers_after_the_steps_backward_or_with_grad_off_feed_no_gradient(tmp_path):
    """The retina grader: predictions gathered (`from torch.distributed import all_gather`) after the step's
    backward, for the training metrics, and in an evaluation under torch.set_grad_enabled(False): neither feeds a
    gradient. (Asked of the rule's two tests directly: the grader's own shape is reported check-by-hand at most.)"""
    from lab_utils.analysis.audit.module import Module
    from lab_utils.analysis.audit.rules.gradients import _after_the_steps_backward, _grad_disabled_before

    text = ("import torch\nfrom torch.distributed import all_gather\ndef train(model, opt, loader):\n"
            "    for x in loader:\n        y = model(x)\n        GATHER_BEFORE\n        loss = (y ** 2).sum()\n"
            "        loss.backward()\n        opt.step()\n        GATHER_AFTER\n"
            "def evaluate(model, loader):\n    torch.set_grad_enabled(SWITCH)\n    for x in loader:\n"
            "        y = model(x)\n        all_gather([y, y], y)\n")
    gather = "all_gather([y, y], y)"
    path = tmp_path / "train.py"
    cases = ((gather, "pass", "False", (False, True)), ("pass", gather, "True", (True, False)))
    for before, after, switch, want in cases:
        path.write_text(text.replace("GATHER_BEFORE", before).replace("GATHER_AFTER", after).replace("SWITCH", switch))
        m = Module(path, "train.py", path.read_text())
        gathers = sorted((c for c in m.calls if c.lineno and getattr(c.func, "id", "") == "all_gather"),
                         key=lambda c: c.lineno)
        in_train, in_eval = gathers[0], gathers[-1]
        assert (_after_the_steps_backward(m, in_train), _grad_disabled_before(m.enclosing(in_eval), in_eval)) == want
    # the same gather, grad on, in a loss the step backwards through, is this rule's defect
    loss = SEEDED + ("from torch.distributed import all_gather\ndef contrastive_loss(y):\n"
                     "    ys = [torch.zeros_like(y) for _ in range(2)]\n    all_gather(ys, y)\n"
                     "    return (torch.cat(ys) @ y).sum()\n") + LOOP.replace(
        "loss = model(torch.ones(2)).sum()", "loss = contrastive_loss(model(torch.ones(2)))")
    assert _has(_project(tmp_path / "c", {"train.py": loss}), "gather-without-grad")


EVAL = (SEEDED + "from torch.distributed import all_gather\nmodel = DDP(torch.nn.Linear(2, 2))\n"
        "val_set = list(range(5))\n"
        "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))\n"
        "def evaluate(model, loader):\n    preds = []\n    for x in loader:\n        preds.append(model(x))\n"
        "    p = torch.cat(preds)\n    ps = [torch.zeros_like(p) for _ in range(2)]\n    GATHER\n"
        "    return torch.cat(ps)CUT\n"
        "for epoch in range(2):\n    evaluate(model, val_loader)\n")


def test_an_evaluation_gathering_with_a_bare_all_gather_counts_the_padding(tmp_path):
    """The retina grader's eval(): `all_gather(y_pred_list, y_pred)` imported from torch.distributed, the padded
    duplicates in the kappa. A gather through a helper that cuts the result back to the set's size does not."""
    loud = EVAL.replace("GATHER", "all_gather(ps, p)").replace("CUT", "")
    assert _has(_project(tmp_path / "a", {"train.py": loud}), "eval-padding-duplicates")


def test_a_gather_two_calls_down_whose_caller_cuts_the_padding(tmp_path):
    """UniGaze: the evaluation loop calls test(), which calls test_wlabel(), which gathers through
    misc.gather_tensors and keeps `[:num_samples]` of each gathered array: the padded duplicates never reach the
    metric, so test() is no reduction that counts them; without the cut it is. (Asked of the evaluation model's
    question directly: UniGaze's loop over its loaders' dict is more than a fixture can say in a few lines.)"""
    from lab_utils.analysis.audit.evaluation import _counts_through

    misc = ("import torch, torch.distributed as dist\ndef gather_tensors(t):\n"
            "    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]\n    dist.all_gather(out, t)\n"
            "    return torch.cat(out)\n")
    train = ("import torch\nimport misc\ndef test_wlabel(model, loader):\n    preds = []\n    for x in loader:\n"
             "        preds.append(model(x))\n    num_samples = len(loader.dataset)\n"
             "    g = misc.gather_tensors(torch.cat(preds))CUT\n    return g.mean()\n"
             "def test(model, loader):\n    return test_wlabel(model, loader)\n")
    for cut, counts in (("[:num_samples]", False), ("", True)):
        root = _project(tmp_path / str(counts), {"train.py": train.replace("CUT", cut), "misc.py": misc})
        files, top, named = audit._expand([root])
        f = audit.Facts(audit.Project(files, top, named))
        m = f.p.modules["train.py"]
        assert _counts_through(f, m, m.functions["test"], 2) is counts


def test_the_root_logger_given_a_console_on_rank0_alone(tmp_path):
    """The FAS challenge code: create_logger(dist_rank=...) takes `logging.getLogger()` and adds its console
    handler only `if dist_rank == 0:`; `logging.info(... progress ...)` shows rank 0's own meters."""
    log = ("import logging, sys\ndef create_logger(out, dist_rank=0):\n    logger = logging.getLogger()\n"
           "    if GUARD:\n        h = logging.StreamHandler(sys.stdout)\n        logger.addHandler(h)\n"
           "    logger.addHandler(logging.FileHandler(f'{out}/log_rank{dist_rank}.txt'))\n    return logger\n")
    train = SEEDED + "import logging\nfrom log import create_logger\ncreate_logger('.', dist_rank=rank)\n" + LOOP + (
        "    logging.info(f'loss {loss.item()}')\n")
    on0 = {"train.py": train, "log.py": log.replace("GUARD", "dist_rank == 0")}
    every = {"train.py": train, "log.py": log.replace("GUARD", "True")}
    assert {f.rule for f in _found(_project(tmp_path / "a", on0))} >= {"rank0-local-loss"}
    assert "every-rank-prints-loss" not in {f.rule for f in _found(_project(tmp_path / "a", on0))}
    assert "every-rank-prints-loss" in {f.rule for f in _found(_project(tmp_path / "b", every))}


def test_the_gpu_count_is_the_world_size(tmp_path):
    """BISS: `eff_batch_size = batch_size * torch.cuda.device_count()`, `lr = lr * eff_batch_size / 256`: one
    process per visible GPU, so the lr grows with the number of ranks."""
    train = SEEDED + ("batch_size = 64\neff = batch_size * COUNT\nlr = 1e-4 * eff / 256\n"
                      "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.AdamW(model.parameters(), lr=lr)\n")
    assert _has(_project(tmp_path / "a", {"train.py": train.replace("COUNT", "torch.cuda.device_count()")}),
                "lr-grows-with-world-size")
    assert not _has(_project(tmp_path / "b", {"train.py": train.replace("COUNT", "2")}), "lr-grows-with-world-size")


def test_a_run_through_an_unlinked_runner_that_seeds(tmp_path):
    """OpenOOD: `pipeline = get_pipeline(config)` from a module these files lack, `pipeline.run()`; the project's
    TrainOEPipeline.run() seeds torch first. Without that seed, nothing does."""
    pipe = ("import torch\nclass TrainPipeline:\n    def __init__(self, config):\n        self.config = config\n"
            "    def run(self):\n        SEED\n        return self.config\n")
    train = ("import torch, torch.distributed as dist\nfrom proj.pipelines.utils import get_pipeline\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\ndef main(config):\n"
             "    dist.init_process_group('gloo')\n    DDP(torch.nn.Linear(2, 2))\n"
             "    pipeline = get_pipeline(config)\n    pipeline.run()\nif __name__ == '__main__':\n    main({})\n")
    seeded = {"main.py": train, "proj/pipelines/train.py": pipe.replace("SEED", "torch.manual_seed(0)")}
    unseeded = {"main.py": train, "proj/pipelines/train.py": pipe.replace("SEED", "pass")}
    assert not _has(_project(tmp_path / "a", seeded), "no-seed")
    assert _has(_project(tmp_path / "b", unseeded), "no-seed")


def test_a_dataset_reading_its_samples_with_torch_load(tmp_path):
    """ESD: `image, label = torch.load(... + '_batch.pt')` in a Dataset's __getitem__: a sample, not a
    checkpoint onto the rank's GPU. The same load in the script is."""
    train = SEEDED + ("class Batches(torch.utils.data.Dataset):\n    def __len__(self):\n        return 4\n"
                      "    def __getitem__(self, idx):\n        return torch.load(f'{idx}_batch.pt')\n"
                      "model = DDP(torch.nn.Linear(2, 2))\nSCRIPT\n")
    assert not _has(_project(tmp_path / "a", {"train.py": train.replace("SCRIPT", "pass")}),
                    "load-without-map-location")
    assert _has(_project(tmp_path / "b", {"train.py": train.replace("SCRIPT", "sd = torch.load('model.pt')")}),
                "load-without-map-location")


def test_a_distributed_sampler_replaced_before_any_loader_takes_it(tmp_path):
    """ESD: `train_sampler = DistributedSampler(train_dataset)` under `if args.distributed:`, then
    `train_sampler = SubsetRandomSampler(train_idx)` before the DataLoader: no loader gets the first one."""
    train = SEEDED + ("from torch.utils.data import SubsetRandomSampler\ndef main(distributed):\n"
                      "    data = list(range(8))\n    if distributed:\n"
                      "        train_sampler = DistributedSampler(data)\n    else:\n        train_sampler = None\n"
                      "    REPLACE\n    loader = DataLoader(data, sampler=train_sampler)\n"
                      "    for epoch in range(3):\n        for x in loader:\n            pass\nmain(True)\n")
    assert not _has(_project(tmp_path / "a", {"train.py": train.replace(
        "REPLACE", "train_sampler = SubsetRandomSampler(list(range(6)))")}), "set-epoch-missing")
    assert _has(_project(tmp_path / "b", {"train.py": train.replace("REPLACE", "pass")}), "set-epoch-missing")


def test_a_loader_that_looks_up_the_prefixed_key(tmp_path):
    """Scene-Diffuser's load_ckpt: `if 'module.' + key in saved_state_dict:` for each of the model's keys: a
    checkpoint of the wrapper loads into the plain model."""
    train = SEEDED + "model = DDP(torch.nn.Linear(2, 2))\nif rank == 0:\n    torch.save(model.state_dict(), 'c.pt')\n"
    test = ("import torch\ndef load_ckpt(model, path):\n    saved = torch.load(path, map_location='cpu')\n"
            "    own = model.state_dict()\n    for key in own:\n        if LOOKUP in saved:\n"
            "            own[key] = saved[LOOKUP]\n    model.load_state_dict(own)\n"
            "load_ckpt(torch.nn.Linear(2, 2), 'c.pt')\n")
    assert not _has(_project(tmp_path / "a", {"train.py": train, "test.py": test.replace("LOOKUP", "'module.' + key")}),
                    "save-without-module")
    assert _has(_project(tmp_path / "b", {"train.py": train, "test.py": test.replace("LOOKUP", "key")}),
                "save-without-module")


def test_a_helper_writing_the_losses_it_is_handed_is_one_finding(tmp_path):
    """VSCode's save_loss(save_dir, ..., epoch_total_loss, epoch_loss, epoch_loss_s, epoch): one write per loss
    to one file on every rank is one defect, named where the script calls the helper."""
    train = SEEDED + ("def save_loss(path, total_loss, loss_a, loss_b):\n    fh = open(path, 'a')\n"
                      "    fh.write(str(total_loss))\n    fh.write(str(loss_a))\n    fh.write(str(loss_b))\n"
                      "    fh.close()\n") + LOOP + (
        "    save_loss('./loss.txt', loss.item(), loss.item(), loss.item())\n")
    hits = [f for f in _found(_project(tmp_path, {"train.py": train})) if f.rule == "every-rank-prints-loss"]
    assert len(hits) == 1
    call = next(i for i, s in enumerate(train.splitlines(), 1) if "save_loss('./loss.txt'" in s)
    assert call in {line for _, line in hits[0].related}


def test_the_first_gpus_device_is_rank0(tmp_path):
    """BISS's MAE trainer: `if device == torch.device('cuda:0'):` around the print of its own losses: one
    process per GPU, so only rank 0 prints, its own micro-batch's loss."""
    train = SEEDED + ("def train_one_epoch(model, opt, device):\n    for x in range(3):\n"
                      "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
                      "        opt.step()\n        if device == torch.device(DEV):\n            print(loss.item())\n"
                      "model = DDP(torch.nn.Linear(2, 2))\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "train_one_epoch(model, opt, torch.device('cuda', rank))\n")
    first = {f.rule for f in _found(_project(tmp_path / "a", {"train.py": train.replace("DEV", "'cuda:0'")}))}
    assert "rank0-local-loss" in first and "every-rank-prints-loss" not in first
    assert "every-rank-prints-loss" in {f.rule for f in _found(_project(
        tmp_path / "b", {"train.py": train.replace("DEV", "'cpu'")}))}


def test_a_loader_handed_to_another_librarys_training_engine(tmp_path):
    """UPT: the DistributedSampler's loader goes into `CustomisedDLE(DistributedLearningEngine)` from pocket.core,
    whose epoch loop (and set_epoch) lives in that library; no project loop iterates the loader."""
    utils = "from BASE import DistributedLearningEngine\nclass CustomisedDLE(DistributedLearningEngine):\n    pass\n"
    train = SEEDED + ("from utils import CustomisedDLE\ndata = list(range(8))\n"
                      "train_loader = DataLoader(data, sampler=DistributedSampler(data))\n"
                      "engine = CustomisedDLE(torch.nn.Linear(2, 2), train_loader)\nengine(3)\n")
    assert not _has(_project(tmp_path / "a", {"train.py": train, "utils.py": utils.replace("BASE", "pocket.core")}),
                    "set-epoch-missing")
    # the script's own epoch loop over the loader: the epochs run here, and nothing sets the epoch
    looped = train + "for epoch in range(3):\n    for x in train_loader:\n        pass\n"
    assert _has(_project(tmp_path / "b", {"train.py": looped, "utils.py": utils.replace("BASE", "pocket.core")}),
                "set-epoch-missing")
