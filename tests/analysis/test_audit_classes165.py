"""Issue 35: classes of round 159-164's first look (docs/measured/cpu2/audit_heldout_round159.txt) and of the rounds
after it, fixed after their first looks, each quiet and loud."""

from test_audit import _project
from test_audit_classes135 import SEEDED

from lab_utils.analysis import audit


def _rules(found, name: str | None = None) -> list[str]:
    return [f.rule for f in found if name is None or f.path.endswith(name)]


EVAL = (SEEDED + "from torch.utils.data import DataLoader, DistributedSampler\n{imports}"
        "model = DDP(Net())\nval_set = Data()\nval_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, "
        "shuffle=False))\ndef run_val(model, val_loaders):\n    val_result = []\n"
        "    for name, val_loader in zip(['val'], val_loaders):\n        result = inference(model, val_loader)\n"
        "        val_result.append(result)\n    values = []\n    for each in val_result:\n"
        "        values.append(each[0])\n    gathered = all_gather(torch.tensor(values).cpu())\n"
        "    gathered = [t.view(-1) for t in gathered]\n    valid = torch.cat(gathered)\n"
        "    val_result = float(valid[valid >= 0].mean())\n    return val_result\n"
        "run_val(model, [val_loader])\n")
OWN = ("def inference(model, loader):\n    correct = torch.zeros(1)\n    for x, y in loader:\n"
       "        correct += (model(x).argmax(1) == y).sum()\n    return (correct / len(loader.dataset),)\n")


def test_a_metric_an_unseen_evaluation_returned_is_not_a_count_of_the_padding(tmp_path):
    """maskrcnn-benchmark's scene-graph trainers (Scene-Graph-Benchmark, PySGG, CAPN): `dataset_result =
    inference(cfg, model, loader, ...)` from maskrcnn_benchmark/engine/inference.py, a file their copies lack, then
    the per-rank results are all_gathered: whether the padded duplicates are counted is decided inside inference
    (which gathers the predictions keyed by image id), so no finding. The same loop over the project's own
    inference, which counts each rank's padded shard, is the finding."""
    unseen = EVAL.format(imports="from maskrcnn_benchmark.engine.inference import inference\n"
                                 "from maskrcnn_benchmark.utils.comm import all_gather\n")
    quiet = _project(tmp_path / "q", {"train.py": unseen})
    assert "eval-padding-duplicates" not in _rules(audit.audit_paths([quiet]))
    own = EVAL.format(imports="from comm import all_gather\nfrom engine import inference\n")
    loud = _project(tmp_path / "l", {"train.py": own, "engine.py": "import torch\n" + OWN,
                                     "comm.py": "import torch.distributed as dist\ndef all_gather(t):\n"
                                                "    out = [t.clone() for _ in range(2)]\n"
                                                "    dist.all_gather(out, t)\n    return out\n"})
    assert "eval-padding-duplicates" in _rules(audit.audit_paths([loud])), [
        (f.rule, f.line) for f in audit.audit_paths([loud])]


def test_a_switch_handed_to_a_parameter_is_not_a_rank():
    """OpenDCVC: `train_one_epoch(..., distributed=(args.local_rank != -1))`, then `if distributed:
    dist.all_reduce(stats)` inside: true on every rank of the DDP run, so every rank joins the collective. A
    parameter handed the rank's own test (`args.local_rank != 0`) is every rank but 0: the others never join."""
    body = (SEEDED + "import argparse\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--local_rank', type=int, default=-1)\nargs = parser.parse_args()\n"
            "args.local_rank = int(os.environ['LOCAL_RANK'])\n"
            "def train_one_epoch(model, loader, distributed=False):\n    total = 0.0\n    for x in loader:\n"
            "        total += float(model(x).mean())\n    if distributed:\n        t = torch.tensor([total])\n"
            "        dist.all_reduce(t)\n        total = t.item()\n    return total\n"
            "model = DDP(Net())\ntrain_one_epoch(model, loader, distributed=(args.local_rank {op}))\n")
    assert "collective-under-rank0" not in _rules(audit.audit_source(body.format(op="!= -1")))
    assert "collective-under-rank0" in _rules(audit.audit_source(body.format(op="!= 0")))
    # ... and `not distributed or (distributed and dist.get_rank() == 0)` stays rank 0's guard: the running loss
    # printed under it is rank 0's own
    shown = body.replace("        total += float(model(x).mean())\n", "        loss = model(x).mean()\n"
                         "        total += loss.item()\n        if not distributed or (distributed and "
                         "dist.get_rank() == 0):\n            print(loss.item())\n        loss.backward()\n")
    assert "rank0-local-loss" in _rules(audit.audit_source(shown.format(op="!= -1")))


def test_a_classmethod_reaches_its_class_through_cls(tmp_path):
    """ffcv-imagenet: `ImageNetTrainer.launch_from_args()` spawns `cls._exec_wrapper`, which calls `cls.exec(...)`,
    which builds `trainer = cls(gpu=gpu)` and calls `trainer.train()`; the model is built and wrapped in a method
    its __init__ calls. A seed there is the run's seed; without one, the no-seed finding names the wrap."""
    text = ("import torch, torch.distributed as dist, torch.multiprocessing as mp\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "class Trainer:\n    def __init__(self, gpu):\n        self.gpu = gpu\n"
            "        dist.init_process_group('gloo', rank=gpu, world_size=2)\n{seed}"
            "        self.model = self.create_model()\n"
            "    def create_model(self):\n        model = torch.nn.Linear(4, 4)\n"
            "        model = DDP(model)\n        return model\n"
            "    def train(self):\n        self.model(torch.ones(1, 4)).sum().backward()\n"
            "    @classmethod\n    def launch(cls):\n        mp.spawn(cls._exec_wrapper, nprocs=2)\n"
            "    @classmethod\n    def _exec_wrapper(cls, *args):\n        cls.exec(*args)\n"
            "    @classmethod\n    def exec(cls, gpu):\n        trainer = cls(gpu=gpu)\n        trainer.train()\n"
            "if __name__ == '__main__':\n    Trainer.launch()\n")
    seeded = _project(tmp_path / "q", {"train.py": text.format(seed="        torch.manual_seed(0)\n")})
    assert "no-seed" not in _rules(audit.audit_paths([seeded]))
    bare = audit.audit_paths([_project(tmp_path / "l", {"train.py": text.format(seed="")})])
    found = [f for f in bare if f.rule == "no-seed"]
    assert found and any(line == 10 for _, line in found[0].related), [(f.rule, f.line, f.related) for f in bare]
