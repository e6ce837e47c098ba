"""Issue 35: classes of round 306-311's first look (docs/measured/cpu2/audit_heldout_round306.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (7ce93ef)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, STEP, _rules

LOOP = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP


def test_the_function_that_counts_epochs_gets_the_set_epoch_finding(tmp_path):
    """TAPE: utils.setup_loader builds a shuffling DistributedSampler; run_train calls it and loops `for epoch_id
    in range(...): run_train_epoch(...)`, run_eval calls it for its one evaluation (loops over batches): the
    finding goes to run_train's call, where set_epoch belongs. With set_epoch called there, nothing."""
    utils = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
             "def setup_loader(dataset, batch_size):\n    sampler = DistributedSampler(dataset)\n"
             "    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)\n")
    training = ("import torch\nimport utils\n"
                "def run_train_epoch(epoch_id, train_loader, model, opt):\n    for x in train_loader:\n"
                "        loss = model(x).sum()\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
                "def run_train(model, opt, dataset):\n    train_loader = utils.setup_loader(dataset, 2)\n"
                "    for epoch_id in range(3):\nSET        run_train_epoch(epoch_id, train_loader, model, opt)\n"
                "def run_eval(model, dataset):\n    valid_loader = utils.setup_loader(dataset, 2)\n"
                "    for batch in valid_loader:\n        for x in batch:\n            print(model(x).sum().item())\n")
    main = SEED_ONLY + ("import training\ndist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nds = [torch.ones(2)] * 8\n"
                        "training.run_train(model, opt, ds)\ntraining.run_eval(model, ds)\n")
    never = training.replace("SET", "")
    hits = _rules(_project(tmp_path / "never", {"main.py": main, "training.py": never, "utils.py": utils}),
                  "set-epoch-missing")
    assert [(h.path.rsplit("/", 1)[-1], h.line) for h in hits] == [
        ("training.py", _line(never, "train_loader = utils.setup_loader("))]
    each = training.replace("SET", "        train_loader.sampler.set_epoch(epoch_id)\n")
    assert not _rules(_project(tmp_path / "each", {"main.py": main, "training.py": each, "utils.py": utils}),
                      "set-epoch-missing")


def test_a_rank_0_mask_the_class_body_defines(tmp_path):
    """SMDE's ModelSaver: `def _parallel_mask(func): def inner(self, *args, **kwargs): if self.rank_id == 0:
    return func(self, *args, **kwargs)` in the class body, then `@_parallel_mask def save_model(...)`: every
    rank calls it, rank 0 alone saves, no save-on-every-rank. Without the mask every rank writes the file."""
    saver = ("import torch\nclass ModelSaver(object):\n    def __init__(self, rank_id=0):\n"
             "        self.rank_id = rank_id\n    def _parallel_mask(func):\n"
             "        def inner(self, *args, **kwargs):\n"
             "            if self.rank_id == 0:\n                return func(self, *args, **kwargs)\n"
             "        return inner\nMASK    def save_model(self, model, epoch):\n"
             "        torch.save(model.state_dict(), f'model_{epoch}.pth')\n")
    train = SEED_ONLY + ("from saver import ModelSaver\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nsaver = ModelSaver(rank_id=dist.get_rank())\n" + LOOP +
                         "    saver.save_model(model.module, step)\n")
    masked = saver.replace("MASK", "    @_parallel_mask\n")
    assert not _rules(_project(tmp_path / "masked", {"train.py": train, "saver.py": masked}), "save-on-every-rank")
    plain = saver.replace("MASK", "")
    assert _rules(_project(tmp_path / "plain", {"train.py": train, "saver.py": plain}), "save-on-every-rank")


def test_a_sampler_whose_total_is_the_set_s_length_pads_nothing(tmp_path):
    """GDKD's DistributedEvalSampler(DistributedSampler): its __init__ sets `self.total_size = len(self.dataset)`
    (and one sample fewer on the last ranks), so torch's __iter__ pads nothing: the test metric reduced over ranks
    counts each image once, no eval-padding-duplicates. Keeping torch's total_size pads."""
    sampler = ("from torch.utils.data import DistributedSampler\nclass DistributedEvalSampler(DistributedSampler):\n"
               "    def __init__(self, dataset, shuffle=False, seed=0):\n"
               "        super().__init__(dataset, seed=seed, shuffle=shuffle, drop_last=False)\nTOTAL")
    train = SEED_ONLY + ("from torch.utils.data import DataLoader\nfrom sampler import DistributedEvalSampler\n"
                         "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "def validate(loader, net):\n    correct, total = torch.zeros(1), torch.zeros(1)\n"
                         "    for x in loader:\n        correct += net(x).sum().detach()\n        total += 1\n"
                         "    dist.all_reduce(correct)\n    dist.all_reduce(total)\n"
                         "    return (correct / total).item()\n"
                         "test_set = [torch.ones(2)] * 5\n"
                         "test_loader = DataLoader(test_set, batch_size=1, sampler=DistributedEvalSampler(test_set))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(3):\n" + STEP +
                         "    acc = validate(test_loader, model)\n"
                         "    if dist.get_rank() == 0:\n        print('acc', acc)\n")
    exact = sampler.replace("TOTAL", "        if len(self.dataset) % self.num_replicas != 0:\n"
                            "            if self.rank >= len(self.dataset) % self.num_replicas:\n"
                            "                self.num_samples -= 1\n            self.total_size = len(self.dataset)\n")
    assert not _rules(_project(tmp_path / "exact", {"train.py": train, "sampler.py": exact}),
                      "eval-padding-duplicates")
    padded = sampler.replace("TOTAL", "        self.kind = 'eval'\n")
    assert _rules(_project(tmp_path / "padded", {"train.py": train, "sampler.py": padded}), "eval-padding-duplicates")


def test_plain_weights_apart_and_the_wrapper_reloaded_in_a_method(tmp_path):
    """GDKD's Trainer: the script wraps the distiller and builds Trainer(distiller); train() resumes with
    `self.distiller.load_state_dict(state['model'])` and each epoch saves both `self.distiller.state_dict()` (the
    run's own resume point) and `self.distiller.module.student.state_dict()` (the plain weights): no
    save-without-module. Without the plain export only the wrapped keys leave the run."""
    trainer = ("import torch\nclass Trainer:\n    def __init__(self, distiller, opt):\n"
               "        self.distiller = distiller\n        self.opt = opt\n    def train(self, resume=False):\n"
               "        if resume:\n            state = torch.load('latest.pth', map_location='cpu')\n"
               "            self.distiller.load_state_dict(state['model'])\n        for epoch in range(3):\n"
               "            loss = self.distiller(torch.ones(2)).sum()\n            loss.backward()\n"
               "            self.opt.step()\n            if torch.distributed.get_rank() == 0:\n"
               "                torch.save({'model': self.distiller.state_dict()}, 'latest.pth')\nPLAIN")
    train = SEED_ONLY + ("from trainer import Trainer\ndist.init_process_group('gloo')\n"
                         "distiller = torch.nn.Module()\ndistiller.student = torch.nn.Linear(2, 2)\n"
                         "distiller.forward = distiller.student.forward\ndistiller = DDP(distiller)\n"
                         "opt = torch.optim.SGD(distiller.parameters(), lr=0.1)\nTrainer(distiller, opt).train()\n")
    apart = trainer.replace("PLAIN", "                plain = {'model': self.distiller.module.student.state_dict()}\n"
                            "                torch.save(plain, 'student_latest.pth')\n")
    assert not _rules(_project(tmp_path / "apart", {"train.py": train, "trainer.py": apart}), "save-without-module")
    only = trainer.replace("PLAIN", "")
    assert _rules(_project(tmp_path / "only", {"train.py": train, "trainer.py": only}), "save-without-module")
