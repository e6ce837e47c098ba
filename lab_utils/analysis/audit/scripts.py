"""What a script runs, as far as the rules' consequences go: a library's demo under its main guard that the
training run never executes, a script that only evaluates loaded weights (nothing it runs steps), a class the
default settings never pick (a class table indexed by an option's default, a config's `target:`), and a function
called only in arms the default settings skip. The registry drops findings in code the default run never
executes."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .files import project_files, shell_scripts
from .options import UNKNOWN
from .project import Module
from .switches import is_switch_test, one_process_arm
from .syntax import EVAL_WORD, RANKISH, callee, const_str, dotted, kw, mentions_ddp


def demo_block(f: Facts, m: Module, node: ast.AST) -> bool:
    """`node` lies in the `if __name__ == "__main__":` block of a library module another audited file imports
    (CasMVSNet's models/module.py ends in a plotting demo), and that block sets up no DDP: the training run
    imports the module and never runs the block."""
    guard = next((s for s in m.tree.body if isinstance(s, ast.If) and "__name__" in {
        dotted(x) for x in ast.walk(s.test)} and any(x is node for x in ast.walk(s))), None)
    if guard is None or not any(m.rel in f.p.imports_of(u) for u in f.p.modules.values() if u is not m):
        return False
    keys = set()
    for c in (x for x in ast.walk(guard) if isinstance(x, ast.Call)):
        for tm, tf in f.p.resolve(m, c):
            keys |= f.p.reach(tm, tf)
    calls = [(m, c) for c in ast.walk(guard) if isinstance(c, ast.Call)] + f.p.calls_in(keys)
    return not any(callee(c) in ("init_process_group", "spawn") or f.is_ddp_call(mm, c) for mm, c in calls)

def evaluation_script(f: Facts, m: Module) -> bool:
    """An entry script that only evaluates: nothing it runs calls backward or an optimizer step, and it says it
    evaluates (named test/eval/inference, or it puts a model in eval mode or under no_grad). Its DDP model
    (loaded weights) is never trained, so an unseeded init or per-rank BatchNorm statistics change nothing."""
    cache = f.cache.setdefault("evaluation_script", {})
    if m.rel not in cache:
        top = [s for s in m.tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
        calls = [c for s in top for c in ast.walk(s) if isinstance(c, ast.Call)] + [
            c for _, c in f.p.calls_in(f.entry_scope(m))]
        # (`self.var_opt.backward_clip_step(loss=loss)`, VAR's AmpOptimizer from a file these copies lack)
        steps = any("backward" in callee(c) or callee(c) == "step" and re.search(r"opt", dotted(c.func), re.I)
                    or "scaler" in callee(c).lower() for c in calls) or any(
            # (or it runs a function named for training whose step is in a library: torchdistill's train_one_epoch
            # hands the loss to training_box.update)
            re.fullmatch(r"train(_one)?(_an)?(_epoch)?", callee(c)) and not isinstance(c.func, ast.Attribute)
            for c in calls) or any(re.fullmatch(r"optimi[sz]e_param\w*|train(ing)?_step", callee(c)) for c in calls)
        # (or a model object's own step in a file these copies lack: BasicSR-style `model.optimize_parameters(
        # current_step)`, DA-CLIP's train.py)
        stem = m.rel.rsplit("/", 1)[-1].removesuffix(".py")
        says = any(EVAL_WORD.fullmatch(w) for w in re.split(r"[_\W]+", stem)) or any(
            callee(c) in ("eval", "no_grad", "inference_mode") and isinstance(c.func, ast.Attribute)
            for c in calls)
        cache[m.rel] = not steps and says
    return cache[m.rel]


def shadowed(m: Module, node: ast.AST) -> bool:
    """`node` lies in a module-level function that the module defines again further down (RepVGG's utils.py has
    two load_checkpoint): the name binds the last one, so the first never runs."""
    top = next((s for s in m.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                and s.lineno <= getattr(node, "lineno", 0) <= (s.end_lineno or s.lineno)), None)
    return top is not None and m.functions.get(top.name) is not top



def unchosen(f: Facts, m: Module, node: ast.AST) -> bool:
    """`node` lies in a method of a class the default run never builds: a table of classes picked by an option's
    default (UER-py's `str2trainer[args.data_processor]` with --data_processor 'bert': BertTrainer and its bases
    run, MlmTrainer and ClsTrainer do not), or a sibling of the class the project's config names as its `target`
    (DifFace's `target: trainer.TrainerSR` beside TrainerDiffusionFace) that nothing else names."""
    fn = m.enclosing(node)
    cls = m.class_of(fn) if fn is not None else None
    return cls is not None and (m.rel, cls) in _unchosen_classes(f)


def _unchosen_classes(f: Facts) -> set[tuple[str, str]]:
    if "unchosen" in f.cache:
        return f.cache["unchosen"]
    f.p.methods(next(iter(f.p.modules.values())), "", "__init__")  # (builds the class index)
    index = f.p._class_index
    named = {n.id for mm in f.p.modules.values() for n in mm.nodes if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Load)}
    out: set[tuple[str, str]] = set()
    for mm in f.p.modules.values():
        for a in mm.nodes:
            if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
                    and isinstance(a.value, ast.Dict) and len(a.value.keys) >= 2
                    and all(const_str(k) is not None for k in a.value.keys)
                    and all(isinstance(v, ast.Name) and v.id in index for v in a.value.values)):
                continue
            table = dict(zip((k.value for k in a.value.keys), (v.id for v in a.value.values), strict=True))
            picks = [(um, n.slice) for um in f.p.modules.values() for n in um.nodes if isinstance(n, ast.Subscript)
                     and isinstance(n.value, ast.Name) and n.value.id == a.targets[0].id]
            keys = {f.default_value(um, x) for um, x in picks}
            if not picks or not keys <= set(table):
                continue  # an index the default run does not fix: any class may run
            chosen = _with_bases(f, {table[k] for k in keys})
            # (a class named outside tables and class statements is built directly somewhere: it may run)
            out |= {(cm.rel, c) for c in set(table.values()) - chosen for cm, _ in index.get(c, [])
                    if _named_count(f, c) <= _table_count(f, c)}
    targets = _config_targets(f)
    for c in targets & set(index):
        chosen = _with_bases(f, {c})
        for cm, _ in index[c]:
            family = {b for _, b in _all_bases(f, cm, c)}
            for name in cm.classes:
                if name in chosen or name in targets or name in named:
                    continue
                if family & {b for _, b in _all_bases(f, cm, name)} or c in {b for _, b in _all_bases(f, cm, name)}:
                    out.add((cm.rel, name))
    f.cache["unchosen"] = out
    return out


def _named_count(f: Facts, cls: str) -> int:
    """Loads of the class's name in the project, but for `super(Cls, self)`."""
    return sum(1 for mm in f.p.modules.values() for n in mm.nodes if isinstance(n, ast.Name) and n.id == cls
               and isinstance(n.ctx, ast.Load) and not any(
                   isinstance(c, ast.Call) and callee(c) == "super" and c.args and c.args[0] is n for c in mm.nodes))


def _table_count(f: Facts, cls: str) -> int:
    """How often the class's name is a value of a string-keyed dict, or a base in a class statement."""
    return sum(1 for mm in f.p.modules.values() for n in mm.nodes
               for v in (n.values if isinstance(n, ast.Dict) else n.bases if isinstance(n, ast.ClassDef) else [])
               if isinstance(v, ast.Name) and v.id == cls)


def _all_bases(f: Facts, m: Module, cls: str) -> list[tuple[Module, str]]:
    out, todo = [], f.p.bases_of(m, cls)
    while todo:
        bm, b = todo.pop()
        if (bm.rel, b) not in {(x.rel, y) for x, y in out}:
            out.append((bm, b))
            todo += f.p.bases_of(bm, b)
    return out


def _with_bases(f: Facts, classes: set[str]) -> set[str]:
    index = f.p._class_index
    return classes | {b for c in classes for cm, _ in index.get(c, []) for _, b in _all_bases(f, cm, c)}


def _config_targets(f: Facts) -> set[str]:
    """Class names the project's YAML configs build by a dotted `target:` (`target: trainer.TrainerSR`)."""
    if not f.p.on_disk:
        return set()
    out = set()
    for path in [*project_files(f.p.root, ".yaml"), *project_files(f.p.root, ".yml")]:
        try:
            text = path.read_text(encoding="utf-8", errors="replace") if path.stat().st_size < 1_000_000 else ""
        except OSError:
            continue
        out |= set(re.findall(r"^\s*target\s*:\s*['\"]?[\w.]+\.([A-Z]\w*)", text, re.M))
    return out


def off_the_default_path(f: Facts, m: Module, node: ast.AST, depth: int = 2) -> bool:
    """`node` lies in a function that every project call runs only in an arm the default run does not take
    (RoboFlamingo's `if args.head_type == "diffusion": train_one_epoch_calvin_diff(...) elif args.fusion_mode ==
    'two_way': ...`, with --head_type 'lstm' and the launch script's --fusion_mode post): that code does not run.
    A function nothing here calls is left alone (its caller may be a file these copies lack)."""
    if arm_off(f, m, node):
        return True  # (VoiceCraft's `if self.args.dynamic_batching:` ... else: DistributedSampler(...), with the
        # launch script's --dynamic_batching 1: the else does not run)
    fn = m.enclosing(node)
    while fn is not None and m.enclosing(fn) is not None:
        fn = m.enclosing(fn)
    if fn is None:
        return False
    cache = f.cache.setdefault("off_path", {})
    key = (m.rel, id(fn), depth)
    if key not in cache:
        cache[key] = False  # (a recursive call reaches the function again: not known off)
        sites = f.p.callers(m, fn)
        cache[key] = bool(sites) and not _handed_on(f, fn) and all(
            arm_off(f, cm, s) or depth > 0 and off_the_default_path(f, cm, s, depth - 1) for cm, s in sites)
    return cache[key]


def one_process_only(f: Facts, m: Module, node: ast.AST, depth: int = 2) -> bool:
    """`node` lies in a function that every project call runs only on the one-process path (MatterSim's `if
    is_distributed: self.save_model_ddp(...) else: self.save_model(...)`, handed is_distributed=True by the DDP
    script): the DDP run never executes it."""
    fn = m.enclosing(node)
    while fn is not None and m.enclosing(fn) is not None:
        fn = m.enclosing(fn)
    if fn is None:
        return False
    sites = f.p.callers(m, fn)
    return bool(sites) and not _handed_on(f, fn) and all(
        one_process_arm(cm, s) or depth > 0 and one_process_only(f, cm, s, depth - 1) for cm, s in sites)


def _handed_on(f: Facts, fn: ast.AST) -> bool:
    """The function is also passed by name (`mp.spawn(main_worker, ...)`, a callback, a thread target): it runs
    where it is handed, whatever arms its direct calls sit in (HybrIK's `main_worker(None, opt, cfg)` only under
    --launcher slurm)."""
    if "handed_names" not in f.cache:
        calls = {id(c.func) for mm in f.p.modules.values() for c in mm.calls}
        f.cache["handed_names"] = {n.id if isinstance(n, ast.Name) else n.attr for mm in f.p.modules.values()
                                   for n in mm.nodes if isinstance(n, (ast.Name, ast.Attribute))
                                   and isinstance(n.ctx, ast.Load) and id(n) not in calls}
    return getattr(fn, "name", None) in f.cache["handed_names"]


def arm_off(f: Facts, m: Module, node: ast.AST) -> bool:
    """`node` sits in the body of an `if` whose test the default settings fail, or in the else of one they pass."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(n, (ast.If, ast.IfExp)) and not _sets_up_the_group(n):
            holds = _default_truth(f, m, n.test)
            body = n.body if isinstance(n.body, list) else [n.body]
            orelse = n.orelse if isinstance(n.orelse, list) else [n.orelse]
            if holds is False and any(child is b for b in body) or holds is True and any(child is b for b in orelse):
                return True
        child, n = n, m.parent.get(id(n))
    return False


def _sets_up_the_group(n: ast.AST) -> bool:
    """An `if` whose arms set up the process group or wrap the model (image-restoration-sde's `if args.launcher ==
    "none": ... else: init_dist()`): the distributed switch, which the DDP run takes whatever its default."""
    return is_switch_test(n.test) or any(isinstance(x, ast.Call) and (
        re.search(r"init_process_group|init_dist|setup_dist|DistributedDataParallel|^DDP$", callee(x)))
        for x in ast.walk(n))


def _default_truth(f: Facts, m: Module, t: ast.AST) -> bool | None:
    """Whether `args.head_type == "diffusion"` (or `self.args.dynamic_batching`) holds in the default run: the
    launch scripts' value of the option when they pass one, else its default; None when unknown (or the setting
    is about ranks, devices or the distributed switch, which the DDP run sets)."""
    if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Load) and re.fullmatch(r"(self\.)?(args|opt|cfg)",
                                                                                      dotted(t.value) or ""):
        if re.search(r"rank|gpu|world|local|dist|device|ddp|parallel", t.attr, re.I):
            return None
        value = script_value(f, t.attr)
        if value is not None and not value.startswith(("-", "\\")):
            return value.lower() not in ("", "0", "false", "none", "''", '""')
        if t.attr in f._passed_in_launch_scripts() or t.attr in f.set_on_by_default():
            return True  # a flag the scripts pass bare (`--keep`, a store_true option), or one set_defaults turns on
            # (DeiT's `parser.set_defaults(repeated_aug=True)`: its RASampler arm, not the DistributedSampler's)
        options = [c for mm in f.p.modules.values() for c in mm.calls if callee(c) == "add_argument" and any(
            (const_str(a) or "").lstrip("-").replace("-", "_") == t.attr for a in c.args)]
        if options and all(isinstance(kw(c, "default"), ast.Constant) and kw(c, "default").value is True
                           and const_str(kw(c, "action")) != "store_false" for c in options):
            return True  # on unless a command turns it off (L2P's `--unscale_lr`, type=bool default=True: any
            # value a command passes is true too)
        return None  # (a default alone does not say: a README's command the files lack may pass `--do_train`)
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Is, ast.IsNot)) and \
            isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value is None:
        return _none_test_truth(f, t)
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.In, ast.NotIn)) and \
            const_str(t.left) and f.p.on_disk and _config_section(f, t.comparators[0]):
        # `'sampler' in config[mode]` (OpenOCR): whether the project's YAML configs name the key (all, or none)
        named = f.yaml_files_naming(const_str(t.left))
        return None if named is None else named == isinstance(t.ops[0], ast.In)
    if isinstance(t, ast.Name) and not re.search(r"rank|gpu|world|local|dist|device|ddp|parallel|main", t.id,
                                                 re.I) and t.id not in f.g.flag_kinds.get(m.rel, {}):
        # a parameter a YAML config fills (AnimateDiff's `if scale_lr:`, `scale_lr: bool = False`, `main(**config)`);
        # not a rank's flag (3D-EMGP's `verbose`, zeroed off rank 0)
        value = f.default_value(m, t)
        return None if value is UNKNOWN else bool(value)
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)) and \
            isinstance(t.left, (ast.Name, ast.Subscript)) and isinstance(t.comparators[0], ast.Constant) and \
            isinstance(t.comparators[0].value, str):
        value = f.default_value(m, t.left)  # `adjust_lr == 'sqrt'` with `adjust_lr: none` in the YAML (VQ-Diffusion)
        return None if not isinstance(value, str) else (value == t.comparators[0].value) == isinstance(t.ops[0], ast.Eq)
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq))
            and isinstance(t.left, ast.Attribute) and isinstance(t.comparators[0], ast.Constant)
            and isinstance(t.comparators[0].value, str)):
        return None
    if re.search(r"rank|gpu|world|local|dist|device", t.left.attr, re.I) or t.left.attr in (
            "mode", "phase", "split", "stage", "task"):
        return None  # (a mode the script switches itself, or one every command sets)
    value = script_value(f, t.left.attr)
    if value is None and f.p.on_disk and shell_scripts(f.p.root):
        # the option's default, when the project's own launch scripts (which do not pass it) define the run; with
        # none in these files, a README's command may well pass `--task_name forecast` (Timer): unknown
        value = f.default_value(m, t.left)
    if value is UNKNOWN or not isinstance(value, str):
        return None
    return (value == t.comparators[0].value) == isinstance(t.ops[0], ast.Eq)


def _config_section(f: Facts, x: ast.AST) -> bool:
    """`x` is a mapping of the project's config: `cfg`, `config[mode]`, or `config['Train']` where a YAML file
    opens a `Train:` section; not `config['task_name']`, a value a substring is looked for in (UniTS)."""
    if isinstance(x, (ast.Name, ast.Attribute)):
        return re.search(r"cfg|conf", dotted(x), re.I) is not None
    if not (isinstance(x, ast.Subscript) and re.search(r"cfg|conf", dotted(x.value), re.I)):
        return False
    key = const_str(x.slice)
    return key is None or f.yaml_files_naming(key, section=True) is not False


def _none_test_truth(f: Facts, t: ast.Compare) -> bool | None:
    """Whether `args.checkpoint is not None` (or `is None`) holds in the default run: an option with no default
    that the launch scripts leave out (or pass as an empty shell variable) is None; None when unknown."""
    x = t.left
    if not (isinstance(x, ast.Attribute) and re.fullmatch(r"(self\.)?(args|opt|cfg)", dotted(x.value) or "")) or \
            re.search(r"rank|gpu|world|local|dist|device", x.attr, re.I):
        return None
    value = script_value(f, x.attr)
    if value is None and x.attr in f._passed_in_launch_scripts() or value:
        return None if not value else isinstance(t.ops[0], ast.IsNot)
    options = [c for mm in f.p.modules.values() for c in mm.calls if callee(c) == "add_argument" and any(
        (const_str(a) or "").lstrip("-").replace("-", "_") == x.attr for a in c.args)]
    if options and all(kw(c, "default") is None or isinstance(kw(c, "default"), ast.Constant)
                       and kw(c, "default").value is None for c in options):
        return isinstance(t.ops[0], ast.Is)
    if options and all(isinstance(kw(c, "default"), ast.Constant) and kw(c, "default").value is not None
                       for c in options):
        return isinstance(t.ops[0], ast.IsNot)  # `if args.lr is None:` with `--lr default=5e-5` (Spann3R): only
        # an option left unset is None, and this one has a default
    return None


def script_value(f: Facts, attr: str) -> str | None:
    """The one value the project's shell scripts give `--attr` (`--fusion_mode post`); None when none passes it
    or they disagree."""
    if not f.p.on_disk:
        return None
    found = set()
    for path in shell_scripts(f.p.root):
        text = path.read_text(encoding="utf-8", errors="replace")
        # (a value through a shell variable the script sets: LEAD's `--gradient_accumulation_steps=${GAS}`)
        # (`checkpoint=` left empty, then `${checkpoint:+--checkpoint $checkpoint}`: WeKws's run.sh passes nothing)
        variables = dict(re.findall(r"^\s*(?:export\s+)?(\w+)=['\"]?([^\s'\"]*)", text, re.M))
        key = re.escape(attr).replace("_", "[_-]")  # (`--attr value`, `--accumulation-steps 2` for its attribute
        # accumulation_steps, or a Hydra override `++train_config.attr=value`: SLAM-LLM; a short option, `-accu 16`)
        short = "|".join(re.escape(o) for o in f.option_spellings().get(attr, ()) if o != attr) or "(?!)"
        for v in re.findall(rf"(?<![\w-])(?:--{key}|-(?:{short}))[= ]+(\S+)|(?<![\w.])\+{{0,2}}(?:\w+\.)+{key}=(\S+)",
                            text):
            v = next(x for x in v if x)
            v = v.strip("'\"")
            name = re.fullmatch(r"\$\{?(\w+)\}?", v)
            found.add(variables.get(name.group(1), v) if name else v)
    return found.pop() if len(found) == 1 else None


def undistributed_script(p, m: Module) -> bool:
    """An entry script that neither it nor anything it imports from the project distributes: no process group, no
    DDP or FSDP, no rank read, no torch.distributed call (3D-EMGP's finetune_qm9.py beside its DDP pretraining
    scripts), and that no other module imports. It runs as one process, so no finding about ranks belongs to it."""
    if not m.entry:
        return False
    kept = p.__dict__.setdefault("_undistributed", {})
    if m.rel not in kept and any(m.rel in p.imports_of(o) for o in p.modules.values() if o is not m):
        kept[m.rel] = False  # a module others import (SFA3D's kitti_dataloader.py, with a demo under its main
        # guard): its functions run in their run, whatever its own main block does
    if m.rel not in kept:
        mods = [m, *(p.modules[r] for r in p.imports_of(m) if r in p.modules)]
        mods += [tm for c in m.calls for tm, _ in p.resolve(m, c)]  # (`import pfns.train`, `pfns.train.train()`)
        kept[m.rel] = not any(mentions_ddp(x) or x.rank_tainted or reads_a_rank(x) or any(
            re.match(r"(torch\.)?dist(ributed)?\.", dotted(c.func)) for c in x.calls) for x in mods)
    return kept[m.rel]


def reads_a_rank(m: Module) -> bool:
    """The module reads a rank by name (`torch.cuda.set_device(args.local_rank)` in MedCoSS's script, whose
    launcher engine sets up the group in a file these copies lack), not just `args.gpu`, which names the GPUs a
    one-process script may see (TransBTS's test.py)."""
    return any(isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n.attr != "gpu"
               and RANKISH.search(n.attr) for n in m.nodes)
