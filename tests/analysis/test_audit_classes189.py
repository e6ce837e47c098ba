"""Issue 35: classes of round 189-194's first look (docs/measured/cpu2/audit_heldout_round189.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (442a061)."""

from pathlib import Path

from test_audit import DDP_HEAD, _project
from test_audit_classes135 import SEEDED

from lab_utils.analysis import audit


def _found(root: Path) -> list:
    return audit.audit_paths([root])


def _has(root: Path, rule: str) -> bool:
    return any(f.rule == rule for f in _found(root))


def _places(root: Path, rule: str) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for f in _found(root) if f.rule == rule
            for p, line in ((f.path, f.line), *f.related)}


def _line(text: str, part: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if part in s)


def test_the_unwrapped_name_of_the_one_process_arm_is_no_wrapper(tmp_path):
    """SDFusion: `if opt.distributed: wrap; self.df_module = self.df.module` `else: self.df_module = self.df`;
    save() writes `self.df_module.state_dict()`: plain keys either way. A copy of the wrapper itself is a
    finding."""
    train = SEEDED + ("class M:\n    def __init__(self, opt):\n        self.df = torch.nn.Linear(2, 2)\n"
                      "        if opt.distributed:\n            self.df = DDP(self.df)\n"
                      "            self.df_module = UNWRAP\n        else:\n            self.df_module = self.df\n"
                      "    def save(self):\n        if rank == 0:\n"
                      "            torch.save(self.df_module.state_dict(), 'df.pt')\n")
    assert not _has(_project(tmp_path / "a", {"train.py": train.replace("UNWRAP", "self.df.module")}),
                    "save-without-module")
    assert _has(_project(tmp_path / "b", {"train.py": train.replace("UNWRAP", "self.df")}), "save-without-module")


def test_a_key_filter_without_module_strips_the_prefix(tmp_path):
    """LibFewShot's save_model: `".".join(p for p in k.split(".") if p != "module")` for each key: the file
    loads into the plain model."""
    train = SEEDED + ("model = DDP(torch.nn.Linear(2, 2))\nsd = model.state_dict()\nFILTER\n"
                      "if rank == 0:\n    torch.save(sd, 'c.pt')\n")
    strip = "sd = {'.'.join(p for p in k.split('.') if p != 'module'): v for k, v in sd.items()}"
    assert not _has(_project(tmp_path / "a", {"train.py": train.replace("FILTER", strip)}), "save-without-module")
    assert _has(_project(tmp_path / "b", {"train.py": train.replace("FILTER", "")}), "save-without-module")


def test_a_save_helper_called_only_under_an_option_off_by_default_is_not_followed(tmp_path):
    """SLAM-LLM: train() hands the DDP model to save_model_checkpoint_peft (which unwraps it) under
    `enable_ddp`, and to an FSDP save of its state_dict() only under `elif cfg.enable_fsdp:` (False by default)."""
    helpers = ("import torch\ndef save_peft(model, cfg):\n    model = model.module\n"
               "    torch.save(model.state_dict(), 'm.pt')\n"
               "def save_full(model, cfg):\n    torch.save(model.state_dict(), 'full.pt')\n")
    train = SEEDED + ("import argparse\nfrom helpers import save_peft, save_full\n"
                      "p = argparse.ArgumentParser()\np.add_argument('--enable_fsdp', action='store_true')\n"
                      "cfg = p.parse_args()\n"
                      "def train(model, cfg):\n    if rank == 0:\n        if FSDP:\n            save_full(model, cfg)\n"
                      "        else:\n            save_peft(model, cfg)\n"
                      "model = DDP(torch.nn.Linear(2, 2))\ntrain(model, cfg)\n")
    off = {"helpers.py": helpers, "train.py": train.replace("FSDP", "cfg.enable_fsdp")}
    assert not _has(_project(tmp_path / "a", off), "save-without-module")
    on = {"helpers.py": helpers, "train.py": train.replace("FSDP", "True")}
    assert _has(_project(tmp_path / "b", on), "save-without-module")


def test_set_epoch_missing_names_where_the_sampler_helper_is_called(tmp_path):
    """SDFusion: data_sampler(dataset, shuffle, distributed) in base_dataset.py returns the DistributedSampler;
    dataloader.py calls it for the train loader, which an endless generator iterates; nothing sets the epoch. The
    finding names that call."""
    sampler = ("from torch.utils import data\ndef data_sampler(dataset, shuffle, distributed):\n    if distributed:\n"
               "        return data.distributed.DistributedSampler(dataset, shuffle=shuffle)\n"
               "    return data.RandomSampler(dataset)\n")
    loader = ("import torch.utils.data\nfrom base_dataset import data_sampler\ndef make(ds, opt):\n"
              "    return torch.utils.data.DataLoader(ds, batch_size=2,\n"
              "        sampler=data_sampler(ds, shuffle=True, distributed=opt.distributed))\n")
    loader += "def get_data_generator(loader):\n    while True:\n        for data in loader:\n            yield data\n"
    train = SEEDED + ("from dataloader import make, get_data_generator\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "gen = get_data_generator(make([1, 2], None))\n"
                      "for it in range(1000):\n    model(next(gen)).sum().backward()\n")
    files = {"base_dataset.py": sampler, "dataloader.py": loader, "train.py": train}
    assert ("dataloader.py", _line(loader, "sampler=data_sampler")) in _places(_project(tmp_path, files),
                                                                               "set-epoch-missing")


def test_a_distributed_switch_on_by_default_leaves_no_single_process_run(tmp_path):
    """POEM: `--distributed default=True, type=bool` (no command line turns it off): set_epoch under `if
    arg.distributed:` always runs. A switch off by default (store_true) leaves a run whose sampler is never set."""
    train = SEEDED.replace('dist.init_process_group("gloo")\n', "") + (
        "import argparse\np = argparse.ArgumentParser()\nSWITCH\narg = p.parse_args()\n"
        "if arg.distributed:\n    dist.init_process_group('gloo')\nmodel = torch.nn.Linear(2, 2)\n"
        "sampler = DistributedSampler([1, 2], num_replicas=1, rank=0)\n"
        "loader = DataLoader([1, 2], sampler=sampler)\nfor epoch in range(3):\n    if arg.distributed:\n"
        "        sampler.set_epoch(epoch)\n    for x in loader:\n        model(x).sum().backward()\n")
    on = train.replace("SWITCH", "p.add_argument('--distributed', default=True, type=bool)")
    assert not _has(_project(tmp_path / "a", {"train.py": on}), "set-epoch-missing")
    off = train.replace("SWITCH", "p.add_argument('--distributed', action='store_true')")
    assert _has(_project(tmp_path / "b", {"train.py": off}), "set-epoch-missing")


def test_the_arm_of_a_config_switch_read_by_key_is_one_process(tmp_path):
    """DeepfakeBench: `if loaders and not self.config['ddp']: self.test_epoch()` (one process) `elif
    self.config['ddp'] and dist.get_rank() == 0: self.test_epoch()`: the save in test_epoch is rank 0's."""
    train = SEEDED + ("class T:\n    def __init__(self, config):\n        self.config = config\n"
                      "        self.model = DDP(torch.nn.Linear(2, 2))\n"
                      "    def test_epoch(self):\n        torch.save(self.model.module.state_dict(), 'best.pt')\n"
                      "    def train_epoch(self, loaders):\n        if loaders and not self.config[KEY]:\n"
                      "            self.test_epoch()\n        elif self.config[KEY] and dist.get_rank() == 0:\n"
                      "            self.test_epoch()\n")
    assert not _has(_project(tmp_path / "a", {"train.py": train.replace("KEY", "'ddp'")}), "save-on-every-rank")
    assert _has(_project(tmp_path / "b", {"train.py": train.replace("KEY", "'eval'")}), "save-on-every-rank")


def test_no_seed_names_the_scripts_call_that_builds_the_wrapping_class(tmp_path):
    """LIA: train.py's main() builds `Trainer(args, device, rank)`, whose __init__ (trainer.py) builds and wraps the
    generator; nothing seeds torch. The finding names the script's Trainer(...) line."""
    trainer = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nclass Trainer:\n"
               "    def __init__(self, args, rank):\n        self.gen = DDP(torch.nn.Linear(2, 2))\n")
    train = ("import torch, torch.distributed as dist, torch.multiprocessing as mp\nfrom trainer import Trainer\n"
             "def main(rank, args):\n    dist.init_process_group('gloo')\n    trainer = Trainer(args, rank)\n"
             "if __name__ == '__main__':\n    mp.spawn(main, args=(None,), nprocs=2)\n")
    places = _places(_project(tmp_path, {"trainer.py": trainer, "train.py": train}), "no-seed")
    assert ("train.py", _line(train, "trainer = Trainer(")) in places


def test_a_rank0_helper_that_runs_the_wrapper_twice_is_one_finding(tmp_path):
    """LIA: rank 0 alone calls trainer.sample(), which runs `self.gen(a, b)` and `self.gen(a, None)`: one defect,
    one finding, naming both calls."""
    trainer = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nclass Trainer:\n"
               "    def __init__(self):\n        self.gen = DDP(torch.nn.BatchNorm1d(2))\n"
               "    def sample(self, a):\n        with torch.no_grad():\n            x = self.gen(a)\n"
               "            y = self.gen(a + 1)\n        return x, y\n")
    train = SEEDED + ("from trainer import Trainer\ntrainer = Trainer()\nfor step in range(3):\n"
                      "    if rank == 0:\n        trainer.sample(torch.ones(2, 2))\n")
    found = [f for f in _found(_project(tmp_path, {"trainer.py": trainer, "train.py": train}))
             if f.rule == "ddp-forward-under-rank0"]
    assert len(found) == 1 and {line for _, line in found[0].related} >= {_line(trainer, "x = self.gen"),
                                                                          _line(trainer, "y = self.gen")}


def test_an_accumulation_count_a_hydra_override_sets(tmp_path):
    """SLAM-LLM: train(..., gradient_accumulation_steps) gets the config's 1 by default, and the launch script
    passes `++train_config.gradient_accumulation_steps=8`; of the two step gates (an fp16 arm off by default and
    the plain one), the plain one is the run's. Without the override the default run steps every micro-batch."""
    train = SEEDED + ("from dataclasses import dataclass\n@dataclass\nclass TrainConfig:\n"
                      "    gradient_accumulation_steps: int = 1\n    use_fp16: bool = False\n"
                      "def train(model, loader, opt, cfg, gradient_accumulation_steps):\n"
                      "    for step, x in enumerate(loader):\n"
                      "        loss = model(x).sum() / gradient_accumulation_steps\n"
                      "        if cfg.use_fp16:\n            loss.backward()\n"
                      "            if (step + 1) % gradient_accumulation_steps == 0:\n                opt.step()\n"
                      "        else:\n            loss.backward()\n"
                      "            if (step + 1) % gradient_accumulation_steps == 0:\n                opt.step()\n"
                      "cfg = TrainConfig()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "train(model, [], None, cfg, cfg.gradient_accumulation_steps)\n")
    sh = "torchrun --nproc_per_node 2 train.py \\\n  ++train_config.gradient_accumulation_steps=8\n"
    assert _has(_project(tmp_path / "a", {"train.py": train, "run.sh": sh}), "accumulation-without-no-sync")
    assert not _has(_project(tmp_path / "b", {"train.py": train, "run.sh": sh.replace("=8", "=1")}),
                    "accumulation-without-no-sync")


def test_a_count_arm_the_launch_script_turns_on_accumulates(tmp_path):
    """HashTrans (Swin's loop): `if config.TRAIN.ACCUMULATION_STEPS > 1:` accumulates, else steps each batch; its
    script passes `--accumulation-steps 2`. With no script passing a count above one the default run takes the
    plain arm (RSP's scene recognition, MotionRGBD): quiet."""
    train = SEEDED + ("import argparse\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--accumulation-steps', type=int, default=1)\nargs = p.parse_args()\n"
                      "model = DDP(torch.nn.Linear(2, 2))\ndef epoch(loader, opt):\n"
                      "    for idx, x in enumerate(loader):\n        loss = model(x).sum()\n"
                      "        if args.accumulation_steps > 1:\n"
                      "            (loss / args.accumulation_steps).backward()\n"
                      "            if (idx + 1) % args.accumulation_steps == 0:\n                opt.step()\n"
                      "        else:\n            loss.backward()\n            opt.step()\n")
    sh = "python -m torch.distributed.launch --nproc_per_node 2 train.py --accumulation-steps 2\n"
    assert _has(_project(tmp_path / "a", {"train.py": train, "run.sh": sh}), "accumulation-without-no-sync")
    assert not _has(_project(tmp_path / "b", {"train.py": train}), "accumulation-without-no-sync")


def test_a_hyperpyyaml_config_that_seeds_on_load_seeds(tmp_path):
    """SpeechBrain's recipes: `__set_seed: !apply:speechbrain.utils.seed_everything [!ref <seed>]` in the
    hparams YAML seeds torch when the script loads it with load_hyperpyyaml; with no such line nothing does
    (nor does such a YAML that no hyperpyyaml loads)."""
    train = DDP_HEAD + ("from hyperpyyaml import load_hyperpyyaml\nhparams = load_hyperpyyaml(open('h.yaml'))\n"
                        "model = DDP(torch.nn.Linear(2, 2))\n")
    yaml = "seed: 1986\n__set_seed: !apply:speechbrain.utils.seed_everything [!ref <seed>]\n"
    assert not _has(_project(tmp_path / "a", {"train.py": train, "hparams/train.yaml": yaml}), "no-seed")
    assert _has(_project(tmp_path / "b", {"train.py": train, "hparams/train.yaml": "seed: 1986\n"}), "no-seed")
