"""The project model the rules query: what a call does, looked up through the project's helpers and classes
rather than read off its name. Which names hold the DDP-wrapped model, what seeds torch, which values are averaged
over ranks (reductions.py: a collective, a reducing helper, a model whose forward reduces), what is a checkpoint save,
what is a collective, which code trains, where a script sets up the process group. Facts are computed once per
project."""

from __future__ import annotations

import ast
import re

from .call_switches import switched_off_by_the_call
from .entries import chosen_by_name
from .evaluation import eval_loop_reduces
from .none_arms import untaken_none_arm
from .project import Module, Project
from .ranks import Guards
from .reductions import Reductions
from .stdout_sinks import rank0_writer
from .switches import dead_branch, refuses_one_process, switched
from .syntax import (
    COLLECTIVES,
    CUDA_SEEDS,
    DIST_SWITCH,
    EVAL_WORD,
    LOSSISH,
    OTHER_SEEDS,
    SEED_HELPER,
    SPAWNS,
    TORCH_SEEDS,
    callee,
    calls_of,
    const_str,
    const_value,
    dotted,
    handed_a_seed,
    is_stub,
    kw,
    root,
    walk,
)
from .wrappers import is_ddp_call, wrapped_names

UNSEEN_SAVER = re.compile(r"save_(model|checkpoint|ckpt|network|weights|state)")


def _to_file(c: ast.Call) -> bool:
    """torch.save into a file, not into an in-memory buffer (`io.BytesIO()`, a name like buf / mem_file)."""
    target = c.args[1] if len(c.args) > 1 else kw(c, "f")
    return not (target is not None and ("buf" in dotted(target).lower() or "mem" in dotted(target).lower()
                                        or isinstance(target, ast.Call) and callee(target) == "BytesIO"))


class Facts(Reductions):
    def __init__(self, project: Project):
        self.p = project
        # the project's own subclasses of DistributedDataParallel (Hyperion's TorchDDP, which forwards unknown
        # attributes to .module): a call of one wraps like DDP (wrappers.is_ddp_call reads this off each module)
        subclasses = {c.name for m in project.modules.values() for c in m.classes.values()
                      if any(dotted(b).split(".")[-1] == "DistributedDataParallel" for b in c.bases)}
        for m in project.modules.values():
            m.ddp_subclasses = subclasses
        self.g = Guards(project)
        self.cache: dict = {}
        # names holding the DDP wrapper per module; (module, name) pairs whose module never saw the wrap line
        self.ddp_wrapped, self.inherited = wrapped_names(self)
        # print reaches the console on rank 0 alone: builtins.print replaced (setup_for_distributed), or the other
        # ranks' stdout sent to /dev/null (`if dist.get_rank() != 0: sys.stdout = open(os.devnull, "w")`)
        self.stdout_silenced, self.stderr_silenced = (any(
            isinstance(a, ast.Assign) and any(dotted(t) == stream for t in a.targets) and
            (self.g.kind(m, a) == "not0" or rank0_writer(project, m, a.value))
            for m in project.modules.values() for a in m.nodes) for stream in ("sys.stdout", "sys.stderr"))
        # (a progress bar writes to stderr: the Music Translation Network sends the other ranks' to files)
        self.print_override = self.stdout_silenced or any(
            isinstance(a, ast.Assign) and any(dotted(t) in ("builtins.print", "__builtin__.print") for t in a.targets)
            for m in project.modules.values() for a in m.nodes)

    # --- shared facts
    is_ddp_call = staticmethod(is_ddp_call)

    def wrap_site(self, m: Module, name: str) -> str:
        """Where `name` got the wrapper, for a message: 'line N', or 'file:N' of the wrap (or of the constructor call
        that handed it over) when that happened in another file."""
        return self.inherited.get((m.rel, name)) or f"line {self.ddp_wrapped[m.rel][name]}"

    def seed_kind(self, m: Module, c: ast.Call, direct: bool = False) -> str | None:
        """'torch' (seeds torch's CPU RNG: the model init), 'cuda', 'other' (random/numpy), or None; `direct`:
        without looking into project helpers. Kept per call: the seed rules ask about every call of the run."""
        cache = self.cache.setdefault("seed_kind", {})
        key = (m.rel, id(c), direct)
        if key not in cache or cache[key][0] is not c:  # (the call kept beside its answer: an id can be reused)
            cache[key] = (c, self._seed_kind(m, c, direct))
        return cache[key][1]

    def _seed_kind(self, m: Module, c: ast.Call, direct: bool) -> str | None:
        d = dotted(c.func)
        if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, (ast.Call, ast.Subscript)):
            return None  # torch.Generator().manual_seed(...)
        if d in CUDA_SEEDS:
            return "cuda"
        if d in TORCH_SEEDS:
            if d != "manual_seed" or m.imports.get("manual_seed", ("", "", 0))[0] == "torch":
                return "torch"
            if direct or not self.p.resolve(m, c):
                return None
            # else the project's own `def manual_seed(seed):` (MSST's utils/settings.py): judged as a helper
        if d in OTHER_SEEDS:
            return "other"
        name = callee(c)
        if re.match(r"(get|shared|random|make|new|gen)", name) and "seed" in name.lower() and not isinstance(
                m.parent.get(id(c)), ast.Expr):  # (not ContrastiveCrop's `cfg = get_cfg(args)`, which seeds)
            return None  # a seed asked for, not set (detectron2's `seed = comm.shared_random_seed()`, fast-reid)
        if (SEED_HELPER.search(name) or handed_a_seed(c) and isinstance(m.parent.get(id(c)), ast.Expr)) and "." \
                not in d.replace("self.", "") and not self.p.resolve(m, c):  # (or handed the seed: BasicTS's
            return "torch"  # an unseen helper named like a seeder (init_seeds, fix_random_seeds)
        if SEED_HELPER.search(name) and isinstance(c.func, ast.Attribute) and root(c.func.value) in m.imports \
                and not self.p.resolve(m, c) and self.p.module_for(m, root(c.func.value)) is None \
                and m.imports[root(c.func.value)][0].split(".")[0] not in ("torch", "numpy", "random"):
            return "torch"  # utils.fix_random_seeds(...) from a module outside the audited folder
        if not direct:
            for tm, tf in self.p.resolve(m, c):  # a project helper that seeds torch (fix_random_seeds(args.seed))
                if self.p.function_does(tm, tf, lambda mm, cc: self.seed_kind(mm, cc, True) == "torch"
                                        and not self.off_by_default(mm, cc), depth=3):  # not under --deterministic
                    return "torch"
        return None

    def model_class(self, m: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
        """The project nn.Module class a name holds: `model = BarlowTwins(args).cuda(gpu)` (DDP(model) keeps it).
        Other project classes (an AverageMeter of reduced values) are no model."""
        found = self.any_class(m, name)
        if found and any(dotted(b).split(".")[-1] == "Module" for b in found[1].bases):
            return found
        return None

    def any_class(self, m: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
        return self.p.instance_class(m, name)

    def model_names(self, m: Module) -> set[str]:
        if not hasattr(self, "_models_cache"):
            self._models_cache = {}
        if m.rel not in self._models_cache:
            names = set(self.ddp_wrapped.get(m.rel, {}))
            for a in m.nodes:
                if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and (
                        "batchnorm" in callee(a.value).lower() or self.model_class(m, dotted(a.targets[0]))):
                    names |= {dotted(t) for t in a.targets}
            self._models_cache[m.rel] = names
        return self._models_cache[m.rel]

    def forward_reduced(self, m: Module, c: ast.Call) -> bool:
        """`loss = model(x)` or `model.forward(x)` where the model's class computes its loss from a reduced value
        (Barlow Twins all-reduces the cross-correlation before the loss): all forward returns is reduced there."""
        f = c.func
        if isinstance(f, ast.Attribute) and f.attr in ("forward", "module"):
            f = f.value  # model.forward(x), model.module(x)
        found = self.model_class(m, dotted(f)) if isinstance(f, (ast.Name, ast.Attribute)) else None
        fwd = found[0].functions.get(f"{found[1].name}.forward") if found else None
        rets = [r.value for r in ast.walk(fwd) if isinstance(r, ast.Return) and r.value is not None] if fwd else []
        if not rets:
            return False
        known = self.cache.setdefault("forward_reduced", {})  # (once per forward: TransFG's nested ViT blocks
        if id(fwd) in known:  # asked it again at every call of every block, 57 s before)
            return known[id(fwd)]
        busy = self.cache.setdefault("forward_reduced_busy", set())
        if id(fwd) in busy:
            return False  # a forward that calls a model of its own kind (GFSLT-VLP's): no reduction found on the way
        busy.add(id(fwd))
        try:
            red = self.reduced_names(found[0], fwd)
        finally:
            busy.discard(id(fwd))
        known[id(fwd)] = all(any(root(n) in red for n in ast.walk(r) if isinstance(n, (ast.Name, ast.Attribute)))
                             for r in rets)
        return known[id(fwd)]

    # --- samplers and evaluation (ch03, ch08)
    def sampler_classes(self) -> set[str]:
        """DistributedSampler and the project's classes built on it."""
        if "samplers" not in self.cache:
            out = {"DistributedSampler", "DistributedBucketSampler", "OrderedDistributedSampler"}  # (timm's pads)
            for m in self.p.modules.values():
                for c in m.classes.values():
                    # (or named so: seamseg's DistributedARBatchSampler, on its own ARBatchSampler)
                    if any("DistributedSampler" in dotted(b) for b in c.bases) or re.search(
                            r"Distributed\w*Sampler", c.name):
                        out.add(c.name)
            self.cache["samplers"] = out
        return self.cache["samplers"]

    def runs_only_distributed(self) -> bool:
        """The process group is set up under a switch, and a script builds a DistributedSampler on every path and
        without num_replicas (GFSLT-VLP's train_vlp.py): it needs the group, so a run without the switch stops
        there. Such a project has no single-process run for a collective or a set_epoch outside the switch to
        break."""
        if "only_distributed" not in self.cache:
            inits = [(mm, c) for mm in self.p.modules.values() for c in mm.calls if callee(c) == "init_process_group"]
            self.cache["only_distributed"] = bool(inits) and all(  # the group itself under the switch
                switched(self.p, mm, c) is not None for mm, c in inits) and any(
                callee(c) == "DistributedSampler" and len(c.args) < 2 and kw(c, "num_replicas") is None
                and mm.entry and switched(self.p, mm, c) is None and not isinstance(mm.parent.get(id(c)), ast.IfExp)
                and self.off_by_default(mm, c) is None for mm in self.p.modules.values() for c in mm.calls) or any(
                refuses_one_process(s, mm.entry) for mm in self.p.modules.values() for s in mm.nodes) or any(
                callee(c) == "add_argument" and const_value(kw(c, "default")) is True and any(
                    DIST_SWITCH.search(o := (const_str(x) or "").lstrip("-")) and not self._set_false(o)
                    for x in c.args) for mm in self.p.modules.values() for c in mm.calls)
            # (POEM's `--distributed default=True`, which no code sets False: ALBEF's init_distributed_mode does)
        return self.cache["only_distributed"]

    def _set_false(self, option: str) -> bool:
        return any(isinstance(a, ast.Assign) and const_value(a.value) is False and any(
            isinstance(t, ast.Attribute) and t.attr == option.replace("-", "_") for t in a.targets)
            for mm in self.p.modules.values() for a in mm.nodes)

    def eval_loop_reduces(self) -> list[tuple[Module, ast.Call]]:
        """Where some evaluation loop of the project reduces over ranks (evaluation.eval_loop_reduces)."""
        if "eval_reduces" not in self.cache:
            self.cache["eval_reduces"] = eval_loop_reduces(self)
        return self.cache["eval_reduces"]

    def all_names(self) -> set[str]:
        """Every attribute and name leaf in the project (`no_sync`, `SyncBatchNorm` used anywhere)."""
        if "names" not in self.cache:
            self.cache["names"] = {dotted(n).split(".")[-1] for mm in self.p.modules.values()
                                   for n in mm.nodes if isinstance(n, (ast.Name, ast.Attribute))}
        return self.cache["names"]

    # --- entry scripts (ch02)
    def entry_scope(self, m: Module) -> set:
        """(module, function) keys of what a script runs: the project functions its module-level code (the main
        guard included) calls, and what they call, following functions handed over as arguments
        (`mp.spawn(main_worker, ...)`, `Process(target=run)`). A helper the script defines but never runs (a
        launcher's own init function) is not in it. A console-script entry (no main guard; the module spawns the
        ranks: `mp.spawn(self.ddp_run, ...)` in a trainer's fit) runs what its spawn calls start."""
        top = [n for s in m.tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
               for n in ast.walk(s) if isinstance(n, ast.Call)]
        top += [c for c in m.calls if callee(c) in SPAWNS and isinstance(c.func, ast.Attribute)]
        keys: set = set()
        todo = [(m, c) for c in top]
        while todo:
            mm, c = todo.pop()
            given = [*c.args, *[k.value for k in c.keywords]]  # (and inside a tuple: CLD-SGM's `Process(
            given += [e for a in given if isinstance(a, (ast.Tuple, ast.List)) for e in a.elts]  # target=setup,
            handed = [a for a in given if isinstance(a, (ast.Name, ast.Attribute))]  # args=(config, main))`)
            targets = self.p.resolve(mm, c) + [t for a in handed for t in self._handed(mm, c, a)]
            for tm, tf in targets:
                if (tm.rel, id(tf)) in keys:
                    continue
                keys.add((tm.rel, id(tf)))
                todo += [(tm, cc) for cc in walk(tf) if isinstance(cc, ast.Call)]
        return keys

    def _handed(self, m: Module, c: ast.Call, a: ast.AST) -> list[tuple[Module, ast.AST]]:
        """The project functions a function value handed to `c` names: `main_worker`, `self.ddp_run` (its class's)."""
        if isinstance(a, ast.Attribute) and dotted(a.value) in ("self", "cls"):  # (`mp.spawn(cls._exec_wrapper)`)
            fn = m.enclosing(c)
            cls = m.class_of(fn) if fn is not None else None
            return self.p.methods(m, cls, a.attr) if cls else []
        return self.p.resolve(m, ast.Call(func=a, args=[], keywords=[])) or (
            chosen_by_name(self.p, m, c, a.id) if isinstance(a, ast.Name) else [])

    def entry_site(self, m: Module, node: ast.AST, depth: int = 3) -> tuple[Module, ast.Call] | None:
        """The call in an entry script that runs `node`'s helper (`train_ds, test_ds = dataloader.load_data(...)`
        for a sampler made in data/dataloader.py), through up to `depth` callers: where the script's author meets
        what the helper does. None when `node` lies in a script, or no script reaches it."""
        todo, seen = [(m, m.enclosing(node), 0)], set()
        while todo:
            mod, fn, d = todo.pop(0)
            if mod.entry or fn is None or id(fn) in seen or d >= depth:
                continue
            seen.add(id(fn))
            for cm, call in sorted(self.p.callers(mod, fn), key=lambda x: (x[0].rel, x[1].lineno)):
                if cm.entry:
                    return cm, call
                todo.append((cm, cm.enclosing(call), d + 1))
        return None

    def setup_line(self, m: Module) -> ast.AST:
        """Where the entry sets up the process group: its init_process_group, a call of a helper that does,
        the DDP wrap, or the main guard."""
        inits = [c for c in m.calls if callee(c) == "init_process_group"]
        if inits:
            return min(inits, key=lambda c: c.lineno)
        helper = [c for c in m.calls if any(self.p.function_does(tm, tf, lambda mm, cc: callee(cc) ==
                                                                 "init_process_group")
                                            for tm, tf in self.p.resolve(m, c))]
        if helper:
            return min(helper, key=lambda c: c.lineno)
        wraps = [c for c in m.calls if self.is_ddp_call(m, c)]
        return min(wraps, key=lambda c: c.lineno) if wraps else (m.has_main_guard() or m.tree.body[0])

    # --- training, saving, collectives
    def trains(self, m: Module, node: ast.AST, depth: int = 1) -> bool:
        """Whether the code around `node` (or every caller of a helper) runs backward or an optimizer step."""
        fn = m.enclosing(node)
        scope = [fn] if fn is not None else [s for s in m.tree.body
                                             if not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
        def steps(n):  # backward, an optimizer step, or a loss-scaler helper that does both (timm's NativeScaler)
            return isinstance(n, ast.Call) and (callee(n) in ("backward", "step") and (
                callee(n) == "backward" or "optim" in dotted(n.func)) or "scaler" in callee(n).lower() and bool(
                n.args) or any(k.arg == "update_grad" for k in n.keywords))
        if any(steps(n) for sc in scope for n in ast.walk(sc)):
            return True
        # the step in a helper this function calls (`batch_loss = self._run_batch(...)`, then print(batch_loss)); at
        # module level, the helper a script's own epoch loop calls (`mae = one_epoch(loader)`)
        if fn is None:
            loop = m.enclosing(node, (ast.For, ast.While))
            return loop is not None and any(isinstance(c, ast.Call) and any(
                self.p.function_does(tm, tf, lambda mm, cc: steps(cc), depth=2)
                for tm, tf in self.p.resolve(m, c) or self.one_method(c)) for c in walk(loop))
        if self.p.function_does(m, fn, lambda mm, cc: steps(cc), depth=2) or self._hook_of_a_step_loop(m, fn, steps):
            return True
        if any(isinstance(c, ast.Call) and not self.p.resolve(m, c) and self.methods_named(c) and all(
                self.p.function_does(tm, tf, lambda mm, cc: steps(cc), depth=1) for tm, tf in self.methods_named(c))
               for c in walk(fn)):  # (KAIR's model.optimize_parameters(), R-ESM's loss_scale_and_backward())
            return True  # (one_method: the project's one method of that name, the object untyped)
        # a closure the training loop defines and calls (MSN's `def log_stats(): logger.info(...)` next to its
        # `def train_step(): ... loss.backward()`): the loop around it is what trains
        outer, sites = m.enclosing(fn), self.p.callers(m, fn) if depth > 0 and not m.class_of(fn) and any(
            LOSSISH.search(a.arg) for a in fn.args.args) else []  # (handed the loss: not an evaluate(loader, model))
        return isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.trains(m, fn) or bool(sites) and all(
            cm is not m and self.trains(cm, cc, depth - 1) for cm, cc in sites)  # (a logging helper: PepFlow's)

    def one_method(self, call: ast.Call) -> list[tuple[Module, ast.AST]]:
        """`model.optimize_parameters(step)`, `logs = model.get_current_log()` on an object the audit cannot type
        (a model from a factory these files lack, KAIR's and IR-SDE's define_Model/create_model): the project's one
        method of that name, when one class alone defines it and the name is no library object's (`step`,
        `update`, `item`: no underscore)."""
        found = self.methods_named(call)
        return found if len(found) == 1 else []

    def methods_named(self, call: ast.Call) -> list[tuple[Module, ast.AST]]:
        """Every project method (a stub aside: a base class's `pass`) named as the untyped call is, for one_method;
        or for a question all of them answer alike (R-ESM's Scheduler and Scheduler_fsdp both backward in
        `loss_scale_and_backward`)."""
        if not (isinstance(call.func, ast.Attribute) and "_" in call.func.attr.strip("_")):
            return []
        index = self.cache.get("methods_by_name")
        if index is None:
            index = self.cache["methods_by_name"] = {}
            for mm in self.p.modules.values():
                for k, fn in mm.functions.items():
                    if "." in k and mm.class_of(fn):
                        index.setdefault(k.rsplit(".", 1)[1], []).append((mm, fn))
        return [(mm, fn) for mm, fn in index.get(call.func.attr, []) if not is_stub(fn)]

    def _hook_of_a_step_loop(self, m: Module, fn: ast.AST, steps) -> bool:
        """A hook that a training loop calls next to its step (`for self.iter in ...: self.train_one_iter();
        self.after_iter()`, the step in the first and the loss log in the second): the loop around a call of `fn`
        steps, itself or through the other hooks it calls."""
        cache = self.cache.setdefault("step_hooks", {})
        if id(fn) not in cache:
            cache[id(fn)] = False
            if self.evaluates(m, fn):
                return False  # the evaluation the epoch loop runs after training: its loss is no training loss
            for cm, call in self.p.callers(m, fn):
                loop = cm.enclosing(call, (ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef))
                if isinstance(loop, (ast.For, ast.While)) and any(steps(n) or isinstance(n, ast.Call) and any(
                        self.p.function_does(tm, tf, lambda mm, cc: steps(cc), depth=2)
                        for tm, tf in self.p.resolve(cm, n)) for n in walk(loop)) and not any(
                        isinstance(n, ast.Call) and n.lineno < call.lineno and any(
                            self.evaluates(tm, tf) for tm, tf in self.p.resolve(cm, n)) and not any(
                            steps(x) and x.lineno > n.lineno for x in walk(loop)) for n in walk(loop)):
                    # (a hook after an evaluation that ends the loop's work, WeNet's log_per_epoch after
                    # executor.cv, may log what that evaluation returned; a forward named `inference` that the
                    # loop's backward follows is training)
                    cache[id(fn)] = True
                    break
                if isinstance(loop, (ast.FunctionDef, ast.AsyncFunctionDef)) and cm.class_of(loop) and \
                        cm.class_of(loop) == m.class_of(fn) and self._hook_of_a_step_loop(cm, loop, steps):
                    cache[id(fn)] = True  # a method the hook calls on its own object (DaGAN's Logger.log_epoch,
                    break  # next to the step, calling self.log_scores(), which prints the fed losses)
        return cache[id(fn)]

    @staticmethod
    def evaluates(m: Module, fn: ast.AST) -> bool:
        """An evaluation: named so, or a loop under torch.no_grad()/inference_mode (WeNet's `cv`)."""
        return any(EVAL_WORD.fullmatch(w) for w in fn.name.split("_")) or any(
            "no_grad" in dotted(d) or "inference_mode" in dotted(d) for d in fn.decorator_list) or any(
            isinstance(s, ast.With) and any(re.search(r"no_grad|inference_mode", dotted(i.context_expr))
                                            for i in s.items)
            and any(isinstance(x, (ast.For, ast.While)) for x in ast.walk(s)) for s in walk(fn))

    def callees(self, m: Module, c: ast.Call) -> list[tuple[Module, ast.AST]]:
        """The project functions `c` may run, and a closure an enclosing function defines (VoCo's and I-JEPA's
        `def save_checkpoint(epoch):` inside main)."""
        found = self.p.resolve(m, c)
        if found or not isinstance(c.func, ast.Name):
            return found
        nested = self.cache.setdefault("nested_defs", {})
        if m.rel not in nested:  # (once per module: the closures by name)
            nested[m.rel] = {}
            for d in m.nodes:
                if isinstance(d, ast.FunctionDef) and m.enclosing(d) is not None:
                    nested[m.rel].setdefault(d.name, []).append(d)
        return [(m, d) for d in nested[m.rel].get(c.func.id, []) if m.enclosing(d) in _enclosers(m, c)]

    def is_save(self, m: Module, c: ast.Call) -> bool:
        """A checkpoint save: torch.save of model/optimizer state into a file, or a project helper named like a
        save that writes one (save_checkpoint(...)); an unseen helper named like one (`save_model(args, model,
        opt)` from a module outside the folder). A dataset caching a tensor, or torch.save into a BytesIO (an
        in-memory copy, e.g. to load an EMA), is no checkpoint."""
        if dotted(c.func) in ("torch.save", "th.save"):
            text = ast.unparse(c).lower()
            return _to_file(c) and bool(re.search(r"state|model|optim|ckpt|checkpoint|snapshot|epoch|package|net",
                                                  text))
        targets = self.callees(m, c)
        if not targets and callee(c) == "save_pretrained" and isinstance(c.func, ast.Attribute):
            # a Hugging Face model's own save, of the model unwrapped from DDP (DistributedTrainingGPT2's
            # `model_to_save = model.module if hasattr(model, 'module') else model`, then
            # `model_to_save.save_pretrained(dir)`): every rank writes the files unless told which is the main one
            held = dotted(c.func.value)
            unwrapped = held.endswith(".module") or any(isinstance(a, ast.Assign) and held in map(
                dotted, a.targets) and any(dotted(x).endswith(".module") for x in ast.walk(a.value)) for a in m.nodes)
            fn = m.enclosing(c)  # (not in a function that raises first: ReLoRA's retired save_model_fsdp)
            dead = fn is not None and isinstance(next((b for b in fn.body if not isinstance(b, ast.Expr)), None),
                                                 ast.Raise)
            return unwrapped and kw(c, "is_main_process") is None and not dead
        if not targets:
            defined = self.cache.setdefault("defined", {}).get(m.rel)
            if defined is None:
                defined = self.cache["defined"][m.rel] = {
                    n.name for n in m.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            return bool(UNSEEN_SAVER.match(callee(c))) and callee(c) not in defined and (
                isinstance(c.func, ast.Name) or root(c.func.value) in m.imports)
        named = {callee(c), m.imports.get(callee(c), ("", None, 0))[1]}  # (`save_checkpoint as ..._impl`, icefall)
        return any((n := _saver_name(tm, tf, c, named)) and re.search(r"save|checkpoint|serialize", n)
                   and not n.startswith("load") and not re.match(r"(get|build|make|create)_", n)  # a factory of a
                   # saver object (T4C TLab's `saver = get_saver(...)`; its methods' saves are judged where called)
                   and self.p.function_does(tm, tf, lambda mm, cc: dotted(cc.func) in ("torch.save", "th.save")
                                            and _to_file(cc), 1)
                   for tm, tf in targets)

    def guarded_inside(self, m: Module, c: ast.Call, depth: int = 3) -> bool:
        """A save helper that guards itself, however deep (`save_model(...)` -> `save_on_master(...)` -> `if
        is_main_process(): torch.save(...)`): calling it on every rank writes once. Every save the helper reaches
        must sit under a rank-0 guard, or go through a helper that guards itself."""
        if dotted(c.func) in ("torch.save", "th.save") or depth == 0:
            return False
        saves = [(tm, cc) for tm, tf in self.callees(m, c) for cc in walk(tf) if isinstance(cc, ast.Call)
                 and (dotted(cc.func) in ("torch.save", "th.save") or self.is_save(tm, cc))
                 and not untaken_none_arm(self.p, tm, cc)]  # (RETFound's save_model: its loss_scaler None arm)
        return bool(saves) and all(self.g.kind(tm, cc) == "rank0" or self.guarded_inside(tm, cc, depth - 1)
                                   for tm, cc in saves)

    @staticmethod
    def same_scope(m: Module, c: ast.AST, owner: str, line: int) -> bool:
        if owner.startswith("self."):
            return True
        fn = m.enclosing(c)
        # (at the top level, only the top level's own code: the script's `model` is not the one a function it calls
        # rebinds to its wrapper, X-ray denoising's train_model_ddp(model, ...))
        top = [n for s in m.tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for n in ast.walk(s)] if fn is None else walk(fn)
        if any(isinstance(a, ast.Assign) and a.lineno == line for a in top):
            return True
        # a function reading the script's global wrapper (`def estimate_loss(): ... model(X, Y)`), binding none
        wrap = next((a for a in m.tree.body if isinstance(a, (ast.Assign, ast.If)) and
                     any(isinstance(x, ast.Assign) and x.lineno == line for x in ast.walk(a))), None)
        binds = {x.arg for x in walk(fn) if isinstance(x, ast.arg)} | {
            t.id for x in walk(fn) if isinstance(x, (ast.Assign, ast.For, ast.With)) for t in ast.walk(x)
            if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)} if fn is not None else set()
        outer = m.enclosing(fn) if fn is not None else None  # (or its outer function's: dialogue-generation's
        wrap = wrap or (outer if outer is not None and any(  # save_state closure reads main's wrapped model)
            isinstance(a, ast.Assign) and a.lineno == line for a in ast.walk(outer)) else None)
        return wrap is not None and fn is not None and "." not in owner and owner not in binds


    def collective(self, m: Module, c: ast.Call, by: str | None = None) -> bool:
        """A collective, or a helper that runs one; `by` ('rank0'): one that rank 0 reaches (a helper's
        barrier under `if args.local_rank not in [-1, 0]:` is never reached when rank 0 alone calls it). A class
        called runs its __init__ alone (StyleGAN-T's FeatureStats.load builds one; only its append_torch broadcasts)."""
        if callee(c) in COLLECTIVES and ("dist" in dotted(c.func) or dotted(c.func) in COLLECTIVES
                                          or "distributed" in dotted(c.func)):
            return not (isinstance(c.func, ast.Attribute) and root(c.func.value) in ("MPI", "comm", "self"))
        # each step judged against the call that led to it (ACNet's rank-0 general_test -> ding_test ->
        # `Engine(local_rank=0, for_val_only=True)`, whose __init__ barriers only `if ... and not for_val_only:`)
        todo, seen = [(tm, tf, c, 0, m.enclosing(c)) for tm, tf in self.p.resolve(m, c, exact=True)], set()
        while todo:
            mod, fn, via, d, caller = todo.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            for cc in calls_of(fn):
                if switched_off_by_the_call(mod, fn, cc, via, caller):
                    continue
                if callee(cc) in COLLECTIVES and "dist" in dotted(cc.func) and not (
                        by == "rank0" and self.g.kind(mod, cc) == "not0") and not dead_branch(mod, cc):
                    return True
                if d < 2:
                    todo += [(tm, tf, cc, d + 1, fn) for tm, tf in self.p.resolve(mod, cc, True)]
        return False


def _enclosers(m: Module, node: ast.AST) -> list[ast.AST]:
    """The functions around `node`, innermost first."""
    out, fn = [], m.enclosing(node)
    while fn is not None:
        out.append(fn)
        fn = m.enclosing(fn)
    return out


def _saver_name(tm: Module, tf: ast.AST, c: ast.Call, named: set) -> str:
    """The lower-case name a save helper goes by at `c`: its own, or for a callable saver object's __call__, its
    class's (`save_best_model = SaveBestModel()`, then `save_best_model(model, ...)`: the Faster R-CNN pipeline's;
    not the class's construction); '' when `c` does not name it."""
    if tf.name == "__call__":
        return (tm.class_of(tf) or "").lower() if callee(c) != tm.class_of(tf) else ""
    return tf.name.lower() if tf.name in named else ""
