"""What the default run leaves off: a store_true option, an empty option, a parameter that defaults to False and
that no caller turns on, or an instance flag set from one. The rules ask this before they report a defect that only
a run with that option on would have (`if args.sync_bn:`, `if self.is_hpo:`)."""

from __future__ import annotations

import ast
import re

from .dict_parsers import dict_parser_flags
from .empty_options import EmptyOptions, configish
from .files import UNKNOWN, launch_flags
from .project import Module
from .python_configs import CONFIGISH, unconditional
from .syntax import DIST_SWITCH, callee, const_str, const_value, dotted, kw, root, walk

# options that name a file the user may give (a checkpoint to resume or start from): unset unless given
OPTIONAL_PATH = re.compile(r"^(resume|resume_from|load|load_from|load_path|checkpoint|ckpt|init_from|pretrained|"
                           r"weights|finetune)$")

# switches to a mode other than training (OpenSTL's `if self.args.test:`, its parser not among the files): a
# training run leaves them off
TRAIN_FLAG = re.compile(r"^(do_?)?train(ing)?$", re.I)
MODE_FLAG = re.compile(r"^(test|test_only|eval|eval_only|evaluate|inference|demo|dry_run)$")


def _one(values: list):
    """The one value all of `values` agree on, else UNKNOWN (also when there are none)."""
    return values[0] if values and UNKNOWN not in values and len({repr(x) for x in values}) == 1 else UNKNOWN


def _bound_in(fn: ast.AST | None, name: str) -> bool:
    """`name` is a parameter of `fn` or assigned in it: a local, not the module's global."""
    if fn is None:
        return False
    params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)} if hasattr(fn, "args") else set()
    return name in params or any(isinstance(x, ast.Name) and x.id == name and isinstance(x.ctx, ast.Store)
                                 for x in walk(fn))


def _option_default(c: ast.Call):
    """What argparse gives an option nobody passes: its default=, False/True for store_true/store_false, None."""
    d = kw(c, "default")
    if d is not None:
        try:
            return ast.literal_eval(d)  # (`-1` is a unary minus, not a constant)
        except ValueError:
            return UNKNOWN
    return {"store_true": False, "store_false": True}.get(const_str(kw(c, "action")), None)


def option_text(flag: str) -> str:
    """How a finding names an option: `--sync_bn` for a command-line flag, `cfg.MODEL.SYNC_BN` (False in the
    config defaults) for a config key."""
    return f"`{flag}` (False in the project's config defaults)" if "." in flag else f"--{flag}"


class DefaultOptions(EmptyOptions):
    """Mixed into Facts: needs `self.p` (the Project) and `self.cache`."""

    def store_true_flags(self) -> dict[str, str]:
        """Command-line flags that are off unless given: `--sync-bn` (action='store_true', default not True), by
        the attribute argparse makes of them (`sync_bn`) -> the option as written."""
        if "flags" not in self.cache:
            out = {}
            for mm in self.p.modules.values():
                for a in mm.calls:
                    # (`-load_model`: a long option written with one dash, RawNeXt's parser)
                    opt = next((const_str(x) for x in a.args if const_str(x) and re.match(
                        r"--|-[A-Za-z][\w-]+$", const_str(x))), None)
                    default = kw(a, "default")
                    store_true = const_str(kw(a, "action")) == "store_true" and not (
                        isinstance(default, ast.Constant) and default.value is True)
                    # `--lora_reinit default=False, type=bool`: off unless given, however it is parsed
                    false_default = isinstance(default, ast.Constant) and default.value is False
                    # `--syn_bn default=0, type=int` (PET), tested as `if args.syn_bn:`: off unless given too
                    zero_int = isinstance(default, ast.Constant) and type(default.value) is int and \
                        default.value == 0 and dotted(kw(a, "type")) == "int"
                    # (a BooleanOptionalAction whose `--no-use_seed` the launch script passes: DFormer's train.sh)
                    if opt and callee(a) == "add_argument" and dotted(kw(a, "action")).endswith("OptionalAction") and \
                            "no_" + (o := opt.lstrip("-")).replace("-", "_") in self._passed_in_launch_scripts():
                        out[o.replace("-", "_")] = f"{o} (its launch script passes --no-{o})"
                        continue
                    if callee(a) == "add_argument" and opt and (store_true or false_default or zero_int):
                        key = (const_str(kw(a, "dest")) or opt.lstrip("-")).replace("-", "_")
                        # (timm's `-c config.yml` defaults: HEQuant's `sync_bn: True` turns --sync-bn on; a
                        # configargparse file, `is_config_file=True`: CLD-SGM's `is_image = true`)
                        if not ((_reads_yaml(mm) or any(k.arg == "is_config_file" for x in mm.calls
                                                        for k in x.keywords)) and self._yaml_turns_on(key)):
                            out[key] = opt.lstrip("-")
            out.update(dict_parser_flags(self.p))
            # on in the run judged: the distributed switch itself (P5's `--distributed`, which the DDP run passes),
            # and a flag the project's launch scripts pass (`--distributed --multiGPU` in its pretrain_*.sh)
            # (a copy: the cached set of passed flags is read elsewhere, and must not depend on who asked first)
            passed = set(self._passed_in_launch_scripts())
            # ... and a flag `parser.set_defaults(sync_bn=True)` turns on (EfficientFormer's, DeiT's --sync-bn)
            passed |= self.set_on_by_default()
            # ... and a flag the code itself turns on from other options (RobustNet's `if args.wt_layer[i] == 2:
            # args.use_wtloss = True`, with --wt_layer in its launch script)
            passed |= {t.attr for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign)
                       and isinstance(a.value, ast.Constant) and a.value.value is True
                       for t in a.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                       and t.value.id in ("args", "opt", "opts", "cfg", "config", "hparams")}
            # ... and a flag that asks for training (`--do_train`): the run judged is the training run
            self.cache["flags"] = {k: v for k, v in out.items() if k not in passed and v.replace("-", "_") not in
                                   passed and not DIST_SWITCH.search(k) and not TRAIN_FLAG.match(k)}
            self.cache["launched_flags"] = {k: v for k, v in out.items() if k in self._passed_in_launch_scripts()
                                            and not DIST_SWITCH.search(k)}
        return self.cache["flags"]

    def set_on_by_default(self) -> set[str]:
        """Options `parser.set_defaults(repeated_aug=True)` turns on (DeiT's --repeated-aug, --sync-bn)."""
        if "set_defaults" not in self.cache:
            self.cache["set_defaults"] = frozenset(
                k.arg for mm in self.p.modules.values() for a in mm.calls if callee(a) == "set_defaults"
                for k in a.keywords if k.arg and isinstance(k.value, ast.Constant) and k.value.value)
        return self.cache["set_defaults"]

    def _passed_in_launch_scripts(self) -> set[str]:
        """Every `--flag` a shell script of the project passes (as argparse's attribute, `-` read as `_`), and the
        attribute of a short option passed (YOWOv2's train_ucf.sh: `-accu 16` for `-accu/--accumulate`)."""
        if "passed" not in self.cache:
            flags = launch_flags(self.p.root) if self.p.on_disk else set()
            self.cache["passed"] = frozenset(flags | {d for d, spelled in self.option_spellings().items()
                                                      if spelled & flags})
        return self.cache["passed"]

    def option_spellings(self) -> dict[str, set[str]]:
        """Each add_argument's attribute -> its option strings as launch_flags reads them (`accu`, `accumulate`)."""
        if "spellings" not in self.cache:
            out: dict[str, set[str]] = {}
            for c in (c for mm in self.p.modules.values() for c in mm.calls if callee(c) == "add_argument"):
                opts = [const_str(a).lstrip("-").replace("-", "_") for a in c.args if (const_str(a) or "")[:1] == "-"]
                longs = [o for a, o in zip(c.args, opts, strict=False) if (const_str(a) or "").startswith("--")]
                if opts:
                    out.setdefault(const_str(kw(c, "dest")) or (longs or opts)[0], set()).update(opts)
            self.cache["spellings"] = out
        return self.cache["spellings"]

    def off_by_default(self, m: Module, node: ast.AST, depth: int = 2) -> str | None:
        """The flag `node` runs under when that flag is off in the default run: an enclosing `if args.sync_bn:`
        (or `if args.distributed and args.sync_bn:`) on a store_true option, or `if use_multi_epochs_loader:` on a
        parameter that defaults to False and that every caller leaves out or passes such an option. Its name, or
        None when the default run reaches `node`."""
        found = self.flag_gate(m, node, depth)
        return found[0] if found else None

    def flag_gate(self, m: Module, node: ast.AST, depth: int = 2) -> tuple[str, ast.If] | None:
        """(the flag, the `if` that tests it) for off_by_default()."""
        flags = self.store_true_flags()
        child, n = node, m.parent.get(id(node))
        while n is not None and not isinstance(n, ast.Module):
            if isinstance(n, ast.If) and any(child is b for b in n.orelse) and isinstance(n.test, ast.UnaryOp) and \
                    isinstance(n.test.op, ast.Not) and isinstance(n.test.operand, ast.Attribute) and \
                    n.test.operand.attr in flags:
                return flags[n.test.operand.attr], n  # the else of `if not args.load_model:` (RawNeXt's resume)
            if isinstance(n, ast.If) and any(child is b for b in n.orelse) and isinstance(n.test, ast.Attribute) and \
                    n.test.attr in self.cache["launched_flags"]:  # the else of `if args.distill:`, --distill in the
                return f"not --{self.cache['launched_flags'][n.test.attr]}", n  # launch script (New-VRWKV)
            # (`torch.load(...) if args.use_clip else None`: the arm of a conditional expression too, DebiasPL)
            if isinstance(n, (ast.If, ast.IfExp)) and any(child is b for b in (
                    n.body if isinstance(n.body, list) else [n.body])):
                for t in (n.test.values if isinstance(n.test, ast.BoolOp) and isinstance(n.test.op, ast.And)
                          else [n.test]):
                    if isinstance(t, (ast.Name, ast.Attribute)) and dotted(t) in self.g.flags.get(m.rel, ()):
                        continue  # a rank-0 flag (`self.print`, False but on rank 0), no option
                    if isinstance(t, ast.Attribute) and t.attr in flags and (
                            "--no-" in flags[t.attr] or not self._on_here(m, t.attr)):
                        return flags[t.attr], n
                    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.Is)) \
                            and const_value(t.comparators[0]) is True and isinstance(t.left, ast.Attribute) and \
                            t.left.attr in flags:
                        return flags[t.left.attr], n  # `if args.run_eval_only==True and ...` (MeshGraphormer)
                    empty = self._empty_option_tested(t)
                    if empty:
                        return empty, n
                    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.NotEq) and \
                            isinstance(t.left, ast.Name) and const_str(t.comparators[0]) == "" and \
                            self.default_value(m, t.left) == "":
                        return t.left.id, n  # `if head_resume != '':` with head_resume a config's empty path
                    copied = _copied_option(m, n, t) if isinstance(t, ast.Name) else None
                    if copied in flags:
                        return flags[copied], n  # `evaluation = args.evaluation`, then `if evaluation:` (GLNet)
                    if isinstance(t, ast.Name) and depth:
                        off = self._parameter_off(m, n, t.id, depth) or (
                            not _bound_in(m.enclosing(n), t.id) and self._global_flag(m, t.id))
                        if off:
                            return off, n
                    if isinstance(t, ast.Attribute) and dotted(t) == f"self.{t.attr}" and \
                            self._attribute_off(m, n, t.attr):
                        return t.attr, n
                    if isinstance(t, ast.Attribute) and not DIST_SWITCH.search(t.attr) and (self._config_default_off(
                            t) or self._set_in_config(t) is False):  # (SOLIDER-REID's `_C.MODEL.DIST_TRAIN =
                        return dotted(t), n  # False`: the switch a DDP run turns on, not an option it leaves off)
                    if isinstance(t, ast.Attribute) and CONFIGISH.search(root(t)) and not DIST_SWITCH.search(t.attr) \
                            and self._yaml_value(t.attr) is False and t.attr not in self._passed_in_launch_scripts():
                        return dotted(t), n  # `if cfg.overfit_batch:`, `overfit_batch: false` in the YAML (VidSitu)
                    # (a yacs node's `_C.AUTO_RESUME = False` is what experiment YAMLs override: only a settings
                    # dataclass field counts for a config object)
                    if isinstance(t, ast.Attribute) and depth and not self._is_option(t.attr) and \
                            not DIST_SWITCH.search(t.attr) and not self._yaml_turns_on(t.attr) and (
                            self._field_default(t.attr) is False or not CONFIGISH.search(root(t)) and
                            self.default_value(m, t) is False or _all_false(self.config_defaults(t.attr))):
                        # (or a key every Python config file of the project sets False, which the script merges
                        # into its args: DINO's `use_ema = False` in config/DINO/*.py, then `if args.use_ema:`)
                        return dotted(t), n  # a settings field that defaults to False (ColBERT's config)
                    unset = self._config_key_unset(m, t) or self._key_never_in_config(t)
                    if unset:
                        return unset, n
                    if isinstance(t, ast.Call) and callee(t) == "get" and isinstance(t.func, ast.Attribute) and len(
                            t.args) == 2 and configish(t.func.value) and isinstance(t.args[1], ast.Constant) \
                            and t.args[1].value in (False, None) and self._yaml_default(
                                const_str(t.args[0]) or "", t.args[1].value) in (False, None):
                        return ast.unparse(t), n  # `cfg['training_cfg'].get('use_pretrainedD', False)`, no YAML sets it
                    if isinstance(t, ast.Attribute) and OPTIONAL_PATH.match(t.attr) and self._never_defined(t.attr):
                        return f"{dotted(t)} (a path option these files never define)", n
                    if isinstance(t, ast.Attribute) and MODE_FLAG.match(t.attr) and self._never_defined(t.attr) and \
                            not self._yaml_turns_on(t.attr):  # (SphereFormer's YAML config: `evaluate: True`)
                        return f"{dotted(t)} (a mode switch these files never define)", n
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            child, n = n, m.parent.get(id(n))
        return None

    def _on_here(self, m: Module, attr: str) -> bool:
        """The script `m` runs with defines the option on by default, though another script of the project defines
        it off (LaBraM's tokenizer script: `--dist_eval action='store_true', default=True`; its fine-tuning script's
        is off): the flags are gathered project-wide, the default is this script's."""
        return any(callee(a) == "add_argument" and const_value(kw(a, "default")) is True and any(
            (const_str(x) or "").lstrip("-").replace("-", "_") == attr for x in a.args)
            for mm in {m, *self.p.related(m)} for a in mm.calls)

    def off_in_default_run(self, m: Module, node: ast.AST, depth: int = 2) -> str | None:
        """off_by_default(), or the function around `node` called only under such flags (`if args.lora_reinit:
        reinit_lora(model)`, whose body saves): the flag's name, or None when the default run reaches `node`."""
        off = self.off_by_default(m, node)
        if off or depth == 0:
            return off
        fn = m.enclosing(node)
        sites = self.p.callers(m, fn) if fn is not None else []
        if any(isinstance(v, ast.Name) and v.id == fn.name for cm, c in sites for mm in [cm] for x in mm.calls
               for v in (*x.args, *(k.value for k in x.keywords))):
            return None  # also handed on by name (NLSPN's `mp.spawn(train, ...)` beside `if ...: train(0, args)`)
        offs = [self.off_in_default_run(cm, c, depth - 1) for cm, c in sites]
        return offs[0] if offs and all(offs) else None

    def _attribute_off(self, m: Module, at: ast.AST, attr: str) -> bool:
        """`if self.is_hpo:` where the class (or a base) sets `self.is_hpo = is_hpo` from an __init__ parameter that
        defaults to False, and no call in the project passes that keyword (Equiformer builds its trainer through a
        registry with every other keyword spelled out): off in the default run."""
        fn = m.enclosing(at)
        cls = m.class_of(fn) if fn is not None else None
        todo, seen = [(m, cls)] if cls else [], set()
        while todo:
            cm, name = todo.pop()
            if (cm.rel, name) in seen or name not in cm.classes:
                continue
            seen.add((cm.rel, name))
            init = cm.functions.get(f"{name}.__init__")
            todo += self.p.bases_of(cm, name)
            if any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Attribute) and any(
                    dotted(x) == f"self.{attr}" for x in a.targets) and self._config_default_off(a.value)
                    for fn in cm.functions.values() if cm.class_of(fn) == name for a in walk(fn)):
                return True  # `self.sync_bn = cfg.sync_bn` in a setup method, the key False in the defaults
            if init is None:
                continue
            set_from = {a.value.id for a in walk(init) if isinstance(a, ast.Assign) and isinstance(
                a.value, ast.Name) and any(dotted(x) == f"self.{attr}" for x in a.targets)}
            args = init.args.args
            defaults = dict(zip([a.arg for a in args][len(args) - len(init.args.defaults):], init.args.defaults,
                                strict=True))
            for p in set_from & {k for k, d in defaults.items() if const_value(d) is False}:
                # (a subclass's `super().__init__(..., is_hpo=is_hpo)` hands its own default on)
                return not any(k.arg == p and const_value(k.value) is not False and dotted(k.value) != p
                               for mm in self.p.modules.values() for c in mm.calls for k in c.keywords)
        return False

    def _parameter_off(self, m: Module, at: ast.AST, name: str, depth: int) -> str | None:
        """A parameter that defaults to False and that every project caller leaves out, passes False, or passes
        a flag that is off by default: the flag's name (the parameter's when no caller names one)."""
        fn = m.enclosing(at)
        if fn is None:
            return None
        args = fn.args.args
        defaults = dict(zip([a.arg for a in args][len(args) - len(fn.args.defaults):], fn.args.defaults,
                            strict=True))
        defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
                         if d is not None})
        # (a required parameter counts when every caller hands it such a flag: AnimateDiff's `use_wandb: bool`,
        # `main(..., use_wandb=args.wandb, **config)`)
        required = name not in defaults and name in [a.arg for a in args]
        if not required and (name not in defaults or const_value(defaults[name]) not in (False, None)):
            return None
        if required and any(isinstance(x, ast.Name) and x.id == fn.name and isinstance(x.ctx, ast.Load)
                            and getattr(mm.parent.get(id(x)), "func", None) is not x for mm in self.p.modules.values()
                            for x in mm.nodes):
            return None  # (also handed to mp.spawn with its own arguments: SEA-RAFT's `main(..., use_ddp)`)
        sites, named = self.p.callers(m, fn), name
        if not sites:
            return None
        flags = self.store_true_flags()
        for _cm, c in sites:
            v = kw(c, name)
            params = [a.arg for a in args]
            if params[:1] in (["self"], ["cls"]):
                params = params[1:]
            if v is None and name in params and params.index(name) < len(c.args):
                v = c.args[params.index(name)]
            if v is None and required:
                return None
            if v is None or const_value(v) is False:
                continue
            if isinstance(v, ast.Attribute) and v.attr in flags:
                named = flags[v.attr]
                continue
            if isinstance(v, ast.Name) and self._global_flag(_cm, v.id):
                named = self._global_flag(_cm, v.id)
                continue
            return None
        return named

    def _global_flag(self, m: Module, name: str) -> str | None:
        """A module-level name bound only to an option that is off by default (UPR-Net's `RESUME = args.resume`
        in its main block, `--resume default=False`): the option, else None."""
        return self._cached("_global_flag", (m.rel, name), lambda key: self._global_flag_uncached(m, name))

    def _global_flag_uncached(self, m: Module, name: str) -> str | None:
        flags = self.store_true_flags()
        bound = [a.value for a in m.nodes if isinstance(a, ast.Assign) and m.enclosing(a) is None
                 and any(isinstance(x, ast.Name) and x.id == name for x in a.targets)]
        if len(bound) == 1 and isinstance(bound[0], ast.Attribute) and bound[0].attr in flags:
            return flags[bound[0].attr]
        if len(bound) == 1 and const_value(bound[0]) is False and not DIST_SWITCH.search(name):
            return name  # `sync_bn = False` in the script's settings block (bubbliiiing's YOLOX); not the switch
        return None

    def default_value(self, m: Module, v: ast.AST, depth: int = 2):
        """The constant `v` holds in the default run, or UNKNOWN: a literal; `args.accum_iter` where every
        add_argument (or a Python config file) of the option gives the same default (None when it names none);
        `int(x)`; `getattr(config.training, "key", 1)` where every YAML file of the project that names `key` gives
        that default too; a local name whose every assignment in its function holds one constant; a parameter
        that every project caller passes one (AudioMAE's `accum_iter = args.accum_iter`, MSST's
        `gradient_accumulation_steps` handed from a YAML key set to 1); an attribute no option sets
        (_attribute_default)."""
        if isinstance(v, ast.Constant):
            return v.value
        if isinstance(v, ast.Call) and callee(v) in ("int", "float") and len(v.args) == 1:
            return self.default_value(m, v.args[0], depth)
        if isinstance(v, ast.Call) and callee(v) == "getattr" and len(v.args) == 3 and const_str(v.args[1]):
            return self._yaml_default(const_str(v.args[1]), self.default_value(m, v.args[2], depth))
        if isinstance(v, ast.Subscript) and const_str(v.slice) and isinstance(v.value, (ast.Name, ast.Attribute)) and \
                CONFIGISH.search(dotted(v.value).split(".")[-1]):
            return self._yaml_value(const_str(v.slice))  # `config["ACCUMULATION_STEPS"]`, 1 in the YAML (MeMOTR)
        if isinstance(v, ast.Subscript) and const_str(v.slice):
            # `op_sc['optimizer']['step_iteration']`, a dict the module builds with that key (VQ-Diffusion's
            # `{'step_iteration': op_cfg.get('step_iteration', 1)}`): what every such entry holds
            held = [val for d in m.nodes if isinstance(d, ast.Dict) for k, val in zip(d.keys, d.values, strict=True)
                    if k is not None and const_str(k) == const_str(v.slice)]
            # ... or a config module's `opt_cfg['lr_scale_func'] = 'none'` (SIMPL's simpl_cfg.py)
            held += [a.value for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign)
                     and isinstance(a.value, ast.Constant) and any(isinstance(t, ast.Subscript) and const_str(
                         t.slice) == const_str(v.slice) for t in a.targets)]
            return _one([self.default_value(m, x, depth - 1) for x in held]) if held and depth else UNKNOWN
        if isinstance(v, ast.Call) and callee(v) == "get" and isinstance(v.func, ast.Attribute) and \
                len(v.args) == 2 and const_str(v.args[0]) and configish(v.func.value):
            # `self.cfg.get('HEAD_RESUME', '')` with `HEAD_RESUME: ""` in the task's YAML (TFace), or a Python
            # config's `common = dict(seed=1111, ...)` (vedastr's configs/cstr.py, read by `cfg.get('seed', None)`)
            given = self._config_keywords(const_str(v.args[0]))
            if given:
                return _one([self.default_value(m, x, 0) for x in given])
            return self._yaml_default(const_str(v.args[0]), self.default_value(m, v.args[1], depth))
        if isinstance(v, ast.Attribute):
            made = [kw(a.value, v.attr) for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                    and any(dotted(t) == dotted(v.value) for t in a.targets) and kw(a.value, v.attr) is not None]
            if made:  # `accelerator = Accelerator(gradient_accumulation_steps=1)`: what the object was built with
                return _one([self.default_value(m, x, depth) for x in made])
            prop = [r.value for fn in m.functions.values() if getattr(fn, "name", "") == v.attr and any(
                dotted(d) == "property" for d in fn.decorator_list) for r in walk(fn)
                if isinstance(r, ast.Return) and r.value is not None]
            if prop and dotted(v.value) == "self" and depth:  # a property: what it returns (MiniGPT-4's runner,
                return _one([self.default_value(m, x, depth - 1) for x in prop])  # `int(run_cfg.get(key, 1))`)
            options = [c for mm in self.p.modules.values() for c in mm.calls if callee(c) == "add_argument" and any(
                (const_str(a) or "").lstrip("-").replace("-", "_") == v.attr for a in c.args)]
            if not options:
                found = self._attribute_default(v.attr, depth)
                # ... else the project's YAML configs, read into args (Latte: `gradient_accumulation_steps: 1`)
                return found if found is not UNKNOWN else self._yaml_value(v.attr)
            values = {repr(_option_default(c)) for c in options} | {
                repr(const_value(d)) if isinstance(d, ast.Constant) else "?" for d in self.config_defaults(v.attr)}
            # ... and a launcher of the project that sets it (LiVT's script/finetune.py: `T.accum_iter = 8`)
            values |= {repr(a.value.value) for mm in self.p.modules.values() for a in mm.nodes if isinstance(
                a, ast.Assign) and isinstance(a.value, ast.Constant) and any(
                isinstance(t, ast.Attribute) and t.attr == v.attr for t in a.targets)}
            return _option_default(options[0]) if len(values) == 1 else UNKNOWN
        if not isinstance(v, ast.Name):
            return UNKNOWN
        fn = m.enclosing(v)
        scope = fn if fn is not None else m.tree
        sets = [a.value for a in walk(scope) if isinstance(a, ast.Assign) and len(a.targets) == 1
                and isinstance(a.targets[0], ast.Name) and a.targets[0].id == v.id]
        # (`epochs = int(epochs)` keeps what the name held before: its parameter's value)
        sets = [x for x in sets if not any(isinstance(n, ast.Name) and n.id == v.id for n in ast.walk(x))]
        if sets:
            return _one([self.default_value(m, x, depth) for x in sets])
        params = [a.arg for a in fn.args.args] if fn is not None and depth else []
        if v.id not in params:
            return UNKNOWN
        positional = params[1:] if params[:1] in (["self"], ["cls"]) else params
        if v.id not in positional:
            return UNKNOWN  # (`self` itself)
        values = []
        defaults = dict(zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults, strict=True))
        for cm, c in self.p.callers(m, fn):
            given = kw(c, v.id)
            if given is None and positional.index(v.id) < len(c.args):
                given = c.args[positional.index(v.id)]
            if given is None and v.id in defaults and any(k.arg is None for k in c.keywords):
                # `main(**config)` with a YAML config (AnimateDiff): the YAML's value of the key, else the default
                values.append(self._yaml_default(v.id, self.default_value(m, defaults[v.id], 0)))
                continue
            if given is None and v.id in defaults:
                given, cm = defaults[v.id], m  # left out: the parameter's default (`def fit(..., seed=None)`)
            if given is None or any(isinstance(a, ast.Starred) for a in c.args):
                return UNKNOWN
            values.append(self.default_value(cm, given, depth - 1))
        return _one(values)

    def _field_default(self, attr: str):
        return self._cached("_field_default", attr, self._field_default_uncached)

    def _field_default_uncached(self, attr: str):
        """The default of a settings dataclass field `attr: bool = DefaultVal(False)` (ColBERT), else UNKNOWN."""
        values = []
        for mm in self.p.modules.values():
            for a in mm.nodes:
                if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and a.target.id == attr and \
                        isinstance(mm.parent.get(id(a)), ast.ClassDef) and a.value is not None:
                    v = a.value
                    if isinstance(v, ast.Call) and len(v.args) == 1 and not v.keywords:
                        v = v.args[0]
                    elif isinstance(v, ast.Call) and kw(v, "default") is not None:
                        v = kw(v, "default")
                    values.append(v.value if isinstance(v, ast.Constant) else UNKNOWN)
        return _one(values)

    def _is_option(self, attr: str):
        return self._cached("_is_option", attr, self._is_option_uncached)

    def _is_option_uncached(self, attr: str) -> bool:
        """Some add_argument of the project defines --attr (store_true_flags judges those)."""
        return any(callee(c) == "add_argument" and any((const_str(a) or "").lstrip("-").replace("-", "_") == attr
                                                       for a in c.args) for mm in self.p.modules.values()
                   for c in mm.calls)

    def _never_defined(self, attr: str):
        return self._cached("_never_defined", attr, self._never_defined_uncached)

    def _never_defined_uncached(self, attr: str) -> bool:
        """No add_argument, config default, settings field or assignment of `attr` in the project: an option whose
        parser is elsewhere (SegmenTron's `args.resume`, parsed in a module these files lack)."""
        return not self._is_option(attr) and not any(
            isinstance(a, (ast.Assign, ast.AnnAssign)) and any(dotted(t).split(".")[-1] == attr for t in (
                a.targets if isinstance(a, ast.Assign) else [a.target])) for mm in self.p.modules.values()
            for a in mm.nodes)

    def _attribute_default(self, attr: str, depth: int):
        """An attribute no option sets: the constant every project assignment `X.attr = ...` gives, a setting
        handed on followed one step (YOLOX: `self.use_model_ema = exp.ema` in the trainer, `self.ema = True` in
        the Exp defaults; `self.seed = None` in the base Exp, which no subclass sets). An object assigned to a
        same-named attribute of another class (`self.ema = deepcopy(model)`) is no setting and is passed over;
        two different values, or none, give UNKNOWN."""
        if depth <= 0:
            return UNKNOWN
        values = []
        for mm in self.p.modules.values():
            for a in mm.nodes:
                if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Attribute) \
                        and a.targets[0].attr == attr and unconditional(mm, a):
                    # (semseg's `args.sync_bn = False` for one GPU is no default)
                    if isinstance(a.value, ast.Call):  # a config read (OpenOCR's `self.accumulation_steps =
                        # self.cfg['Global'].get('accumulation_steps', 1)`); an object built is no setting
                        read = self.default_value(mm, a.value, depth - 1)
                        values += [read] if read is not UNKNOWN else []
                        continue
                    handed = isinstance(a.value, (ast.Attribute, ast.Name)) and \
                        dotted(a.value).split(".")[-1] != attr
                    values.append(a.value.value if isinstance(a.value, ast.Constant) else
                                  self.default_value(mm, a.value, depth - 1) if handed else UNKNOWN)
        field = self._field_default(attr)  # a settings dataclass field (`sync_bn: bool = False`)
        return _one(values + ([field] if field is not UNKNOWN else []))

    def _config_key_unset(self, m: Module, t: ast.AST) -> str | None:
        """`if ckpt_path is not None:` after `ckpt_path = self.config.get('resume_state')`, where every YAML file of
        the project that names the key leaves it null (AMT's `resume_state: null`): false in the default run. The
        key, or None."""
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.IsNot, ast.NotEq)) \
                and isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value is None:
            v = t.left
        elif isinstance(t, (ast.Name, ast.Subscript, ast.Call)):
            v = t  # read for its truth: `if config['model']['checkpoint']:` under MolMCL's empty `checkpoint:`
        else:
            return None
        if isinstance(v, ast.Name):
            scope = m.enclosing(t) or m.tree
            bound = [a.value for a in walk(scope) if isinstance(a, ast.Assign)
                     and any(isinstance(x, ast.Name) and x.id == v.id for x in a.targets)]
            v = bound[0] if len(bound) == 1 else None
        key = None
        if isinstance(v, ast.Call) and callee(v) == "get" and isinstance(v.func, ast.Attribute) and \
                len(v.args) == 1 and not v.keywords and CONFIGISH.search(dotted(v.func.value).split(".")[-1]):
            key = const_str(v.args[0])
        elif isinstance(v, ast.Subscript) and (CONFIGISH.search(dotted(v.value).split(".")[-1])
                                               or configish(v.value)):
            key = const_str(v.slice)
        return key if key and self._yaml_null(key) else None

def _reads_yaml(m: Module) -> bool:
    """The module loads a YAML file (`yaml.safe_load(f)`, timm's config parser that sets the argparse defaults)."""
    return any(callee(c) in ("safe_load", "load", "full_load") and dotted(c.func).startswith("yaml.") for c in m.calls)


def _copied_option(m: Module, at: ast.AST, t: ast.Name) -> str | None:
    """The option a local name copies, when the function around `at` binds it once, from `args.<option>`."""
    fn = m.enclosing(at)
    binds = [a for a in walk(fn) if isinstance(a, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
        isinstance(x, ast.Name) and x.id == t.id for x in (a.targets if isinstance(a, ast.Assign) else [a.target]))
             ] if fn is not None else []
    v = binds[0].value if len(binds) == 1 and isinstance(binds[0], ast.Assign) else None
    return v.attr if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id in (
        "args", "opt", "opts", "config", "cfg") else None


def _all_false(values: list) -> bool:
    """Values that are there and all the constant False."""
    return bool(values) and all(const_value(v) is False for v in values)
