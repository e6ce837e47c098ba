"""The project's Python config files as the option defaults read them: the values a config module gives a key at
its top level or in its dicts, a yacs defaults file's `_C.KEY = False`, and a config function's `args.key = False`
over an option's default. DefaultOptions (options.py) inherits them, as it does YamlConfigs; `self.p` is the
project, `self.cache` the audit's cache."""

from __future__ import annotations

import ast
import re

from .files import UNKNOWN
from .project import Module
from .syntax import callee, const_str, const_value, dotted
from .yaml_configs import YamlConfigs

CONFIGISH = re.compile(r"^(cfg|config|conf|opt|hparams)$", re.I)


def unconditional(m: Module, node: ast.AST) -> bool:
    """`node` runs whenever its function (or module) does: no branch, loop or handler around it there."""
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
        if isinstance(n, (ast.If, ast.For, ast.While, ast.Try, ast.ExceptHandler, ast.With)):
            return False
        n = m.parent.get(id(n))
    return True


class PythonConfigs(YamlConfigs):
    def config_defaults(self, key: str) -> list[ast.AST]:
        """The values a Python config file of the project gives `key` at its top level (`sync_bn = False`,
        `gradient_accumulation_steps = 1` in Pointcept's configs/_base_/default_runtime.py), or to the config
        object it builds there (`config = edict()`, `config.resume = False`: SwinFace's configs/config_train.py)."""
        yacs_final = self.p.on_disk and self.yaml_files_naming(key) is False
        return [a.value for mm in self.p.modules.values() if re.search(r"(^|/)configs?(/|_|\.)", mm.rel)
                for a in mm.tree.body if isinstance(a, ast.Assign) and len(a.targets) == 1 and (
                    isinstance(a.targets[0], ast.Name) and a.targets[0].id == key
                    or isinstance(a.targets[0], ast.Attribute) and a.targets[0].attr == key
                    and isinstance(a.targets[0].value, ast.Name) and (
                        CONFIGISH.search(a.targets[0].value.id) or a.targets[0].value.id == "_C" and yacs_final))]
        # (`_C.sync_bn = False`: a yacs defaults file, Efficient Teacher's configs/defaults.py, whose experiment
        # YAMLs are there and none names the key; with no YAML at hand an experiment file may turn it on:
        # HigherHRNet's AUTO_RESUME)

    def _config_keywords(self, key: str) -> list[ast.AST]:
        """What a Python config file of the project gives `key` inside its dicts: `dict(seed=1111)`, `{'seed': 1}`."""
        mods = [mm for mm in self.p.modules.values() if re.search(r"(^|/)configs?(/|_|\.)", mm.rel)]
        return [k.value for mm in mods for c in mm.calls if callee(c) == "dict" for k in c.keywords if k.arg == key] + [
            val for mm in mods for d in mm.nodes if isinstance(d, ast.Dict) for k, val in zip(d.keys, d.values,
                                                                                           strict=True)
            if k is not None and const_str(k) == key]

    def _set_in_config(self, t: ast.Attribute):
        """The constant a project config function gives `args.attr` in its own body (PersFormer's
        config/persformer_openlane.py: `def config(args): ... args.pretrained = False`, over --pretrained's default
        True), when no code outside the config files sets it; UNKNOWN otherwise."""
        if dotted(t).count(".") != 1:
            return UNKNOWN
        sets = [(mm, a) for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign) and len(
            a.targets) == 1 and isinstance(a.targets[0], ast.Attribute) and a.targets[0].attr == t.attr]
        config = [a.value for mm, a in sets if re.search(r"(^|/)configs?(/|_|\.)", mm.rel) and isinstance(
            mm.parent.get(id(a)), ast.FunctionDef) and isinstance(a.value, ast.Constant)]
        return config[0].value if config and len(config) == len(sets) and len({
            repr(v.value) for v in config}) == 1 else UNKNOWN

    def _config_default_off(self, t: ast.Attribute) -> bool:
        """`cfg.MODEL.SYNC_BN` where the project's config defaults set `_C.MODEL.SYNC_BN = False` (a yacs
        default.py, HigherHRNet), or `self.cfg.sync_bn` where a Python config file sets `sync_bn = False`
        (Pointcept), and no YAML file of the project turns the key on."""
        parts = dotted(t).split(".")
        if len(parts) < 3 and not (len(parts) == 2 and CONFIGISH.search(parts[0])):
            return False
        tail = ".".join(parts[1:])
        defaults = [a.value for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign)
                    and len(a.targets) == 1 and dotted(a.targets[0]).split(".", 1)[-1] == tail
                    and dotted(a.targets[0]).count(".") == len(parts) - 1 and len(parts) > 2]
        # (or a node built with its keys: `_C.SOLVER.SWA = CN({"ENABLED": False})`, RCAN-it's defaults.py)
        defaults += [v for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign)
                     and len(a.targets) == 1 and len(parts) > 2 and dotted(a.targets[0]).split(".", 1)[-1] ==
                     ".".join(parts[1 + (parts[0] == "self"):-1]) and isinstance(a.value, ast.Call) and a.value.args
                     and isinstance(a.value.args[0], ast.Dict) for k, v in zip(a.value.args[0].keys,
                                                                              a.value.args[0].values, strict=True)
                     if const_str(k) == parts[-1]]
        if CONFIGISH.search(parts[-2]):
            defaults += self.config_defaults(parts[-1])
        sets = [(mm, a) for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign) and len(
            a.targets) == 1 and dotted(a.targets[0]).count(".") == 1 and dotted(a.targets[0]).endswith(f".{parts[-1]}")]
        if len(parts) == 2 and any(self.off_by_default(mm, a) for mm, a in sets):
            # a yacs `_C.THROUGHPUT_MODE = False` only an option turns on (TinyViT's `if args.throughput:`)
            defaults += [a.value for mm, a in sets if unconditional(mm, a)]
        if not defaults:  # (the defaults file not among these: every experiment YAML that sets the key sets it
            return self._yaml_value(parts[-1]) is False  # off, CID's `SYNC_BN: False` in experiments/coco.yaml)
        if not all(const_value(v) is False for v in defaults):
            return False
        return not self._yaml_turns_on(parts[-1])

    def constant_true(self, s: ast.AST) -> bool:
        """`if CFG.TRAIN_DDP:` where the config class says `TRAIN_DDP = True` and no code sets it otherwise
        (Pix2Poly): a constant, not a switch, so what it guards runs in every run."""
        test = s.test if isinstance(s, ast.If) else s
        name = test.attr if isinstance(test, ast.Attribute) else test.id if isinstance(test, ast.Name) else None
        binds = [a for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign) and any(
            (t.attr if isinstance(t, ast.Attribute) else t.id if isinstance(t, ast.Name) else None) == name
            for t in a.targets)] if name else []
        return bool(binds) and all(const_value(a.value) is True for a in binds)
