"""Chapter 02 (seeds): no seed, a seed spawned workers never see, rank 0 seeded unlike the single run, a peek iter()."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ..facts import Facts
from ..files import script_commands
from ..hierarchy import never_named, plain_function
from ..init_copies import copy_before_wrap
from ..options import option_text
from ..project import Module
from ..registry import Hit, rule
from ..scripts import evaluation_script
from ..seed_gates import failed_by_default, gated, helper_gated, single_run_value
from ..seed_order import built_at, seeded_after_the_build
from ..seed_values import inline_rank_name, rank_seed_under_switch, seed_value, with_name
from ..shard_orders import sampler_drawing_globally, shuffled_before_the_sampler
from ..switches import is_switch_test
from ..syntax import (
    ITERABLE_NOT_LOADER,
    LOADERISH,
    RANKISH,
    SPAWNS,
    callee,
    const_str,
    dotted,
    involves_rank,
    is_switch_value,
    kw,
    walk,
)


def _entry_calls(f: Facts, m: Module):
    """(the calls an entry script runs: its own, and those of every project function it reaches; what they seed),
    or None when it never sets up DDP (a CLI, a plotting tool): no DDP run to compare."""
    cache = f.cache.setdefault("entry_calls", {})
    if m.rel not in cache:
        scope = f.entry_scope(m)
        # what runs at import time: the script's own top level and that of every project module it imports (a
        # helper module that calls torch.manual_seed(0) at its top seeds every process that imports it)
        # (not an imported module's own main guard, which does not run on import: face-parsing's loss.py seeds
        # torch in its `if __name__ == '__main__':` self-test)
        top = [(mm, n) for mm in [m, *(f.p.modules[r] for r in sorted(f.p.imports_of(m)))] for s in mm.tree.body
               if not isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
               and not (mm is not m and s is mm.has_main_guard()) for n in ast.walk(s) if isinstance(n, ast.Call)]
        calls = top + list(f.p.calls_in(scope))
        ddp = any(callee(c) in ("init_process_group", "spawn") or f.is_ddp_call(mm, c) for mm, c in calls)
        # a seed only under a store_true option (`if opt.deterministic: torch.manual_seed(27)`, CTKD) is no seed in
        # the default run, nor one under a test its option's default fails (`if args.seed > 0:`, -1: MaskGIT)
        seeded = {f.seed_kind(mm, c) for mm, c in calls if f.seed_kind(mm, c) and not gated(f, mm, c) and (
            f.seed_kind(mm, c, True) and not f.p.resolve(mm, c) or not helper_gated(f, mm, c)) and not \
            _in_a_worker_init(f, mm, c)}  # (a project's set_seed is judged by its body: torchdistill's returns
        # early for the None a --seed without default gives)
        cache[m.rel] = (calls, seeded) if ddp else None
    return cache[m.rel]


def _in_a_worker_init(f: Facts, m: Module, c: ast.Call) -> bool:
    """The seed runs in a DataLoader worker: its function is handed as `worker_init_fn=` (PFNs' data_loading.py
    seeds each worker with worker_id + rank * 100): the main process, where the model is built, stays unseeded."""
    fn = m.enclosing(c)
    if fn is None:
        return False
    if "worker_init" not in f.cache:
        # handed by keyword, or kept for it (`self.worker_init_fn = partial(worker_init_fn, epoch=...)`)
        mods = list(f.p.modules.values())
        given = [k.value for mm in mods for x in mm.calls for k in x.keywords if k.arg == "worker_init_fn"] + [
            a.value for mm in mods for a in mm.nodes if isinstance(a, ast.Assign)
            and any(dotted(t).split(".")[-1] == "worker_init_fn" for t in a.targets)]
        f.cache["worker_init"] = {n.id if isinstance(n, ast.Name) else n.attr for v in given for n in ast.walk(v)
                                  if isinstance(n, (ast.Name, ast.Attribute))}
    return fn.name in f.cache["worker_init"] or fn.name in ("worker_init_fn", "seed_worker")


@rule("no-seed", "02_seeds", "an entry script that sets up DDP and never seeds torch (itself or through a helper): "
      "rank 0's init, which DDP broadcasts, differs from the single run's", scope="entry")
def no_seed(f: Facts, m: Module):
    entry = _entry_calls(f, m)
    if entry is None or evaluation_script(f, m):
        return  # no DDP, or nothing trained: loaded weights are evaluated, the init is never used
    kinds = entry[1]
    late = seeded_after_the_build(f, entry[0]) if "torch" in kinds else None
    if late is not None:
        (sm, seed), (bm, built) = late
        yield Hit(seed, f"torch is seeded here, after the model is built (line {built.lineno}) and before nothing "
                  "that inits it: rank 0's initial weights (which DDP broadcasts) are unseeded and differ from any "
                  "single run's — seed before building the model", module=sm, related=((bm, built),))
        return
    if "torch" not in kinds and any(True for _ in seed_before_spawn(f, m)):
        return  # the parent seeds, then spawns workers that never do: seed-before-spawn's finding (OpenCompatible)
    if "torch" not in kinds and not f.yaml_seeds_torch():  # random and numpy seeded alone leave the model's init
        # (torch's CPU RNG) unseeded; a hyperpyyaml config's `!apply:...seed_everything` seeds it on load
        gated, at = next(((flag, (mm, c)) for mm, c in entry[0] if f.seed_kind(mm, c) == "torch"
                          for flag in [f.off_by_default(mm, c)] if flag), (None, None))
        failed, at = next(((t, (mm, c)) for mm, c in entry[0] if f.seed_kind(mm, c, True) == "torch"
                           for t in [failed_by_default(f, mm, c)] if t), (None, at))
        if failed and not gated and _before_a_spawn(f, *at):
            return  # an optional seed in the parent before mp.spawn: seed-before-spawn's finding, given or not
        what = f"torch is seeded only under {option_text(gated)}, which is off by default" if gated else \
            f"torch is seeded only when `{failed}`, which the option's default fails" if failed else \
            "only torch.cuda is seeded" if "cuda" in kinds else "only random and numpy are seeded" if \
            "other" in kinds else "nothing seeds torch"
        if not gated and not failed and (_unlinked_runner_seeds(f, entry[0]) or _run_goes_on_unseen(f, m, entry[0])
                                         or _seeding_function_handed_on(f, m)):
            return
        # the wrap that broadcasts rank 0's unseeded init is where the consequence happens: named as related
        wraps = [(mm, c) for mm, c in entry[0] if f.is_ddp_call(mm, c)] or [
            (mm, c) for mm, c in entry[0] if _broadcasts_parameters(mm, c)][:1]  # (modded-nanogpt's own broadcast)
        # (and the script's call of a seeding helper the default run gets nothing from: torchdistill's set_seed)
        helpers = [(mm, c) for mm, c in entry[0] if mm is m and f.seed_kind(mm, c) == "torch"
                   and f.p.resolve(mm, c) and helper_gated(f, mm, c)]
        # (the seeding helper's own call rather than `main(args)` around it)
        wraps = wraps[:1] + built_at(f, wraps[:1]) + sorted(helpers, key=lambda x: not f.seed_kind(*x, True))[:1] \
            + list(f.p.script_calls(*wraps[0])[:1] if wraps else [])  # (LIA's `trainer = Trainer(args, ...)`)
        if not gated and not failed:  # the seeds it does set, which leave torch's CPU RNG alone (GNS's cuda seed),
            wraps += [(mm, c) for mm, c in entry[0] if f.seed_kind(mm, c) in ("cuda", "other")][:1]  # and the spawn
        wraps += [(mm, c) for mm, c in entry[0] if callee(c) == "spawn" and mm is m][:1]  # (ODTK builds the model)
        where_m, where = _spawned_setup(f, m) or (None, _setup_in_flow(f, m))
        # (and the `if` that picks this setup among others: CTM's `if args.use_MPI: setup_dist(...) else:
        # setup_dist_without_MPI(...)`, where a reader points)
        arm = (where_m or m).parent.get(id((where_m or m).parent.get(id(where)))) if where is not None else None
        wraps += [(where_m or m, arm)] if isinstance(arm, ast.If) else []
        test = _test_of(*at, failed) if at else None
        if gated and at:  # (the `if args.use_seed:` the default run skips, where the user turns the seed on)
            test = (at[0], (f.flag_gate(*at) or (None, at[1]))[1])
        calls = _calls_of(f, at)
        if failed and at and calls and at[0].enclosing(test[1]) is at[0].enclosing(at[1]) is not None and \
                "seed" in at[0].enclosing(at[1]).name.lower():  # (a test inside the seeding helper, not SlotCon's
            test = calls[0]  # main(): shown where the user hands it the seed, OpenNMT's `set_random_seed(opt.seed)`)
        unused = _unused_seed(m) if not kinds and at is None else None
        if unused is not None:  # nothing seeds, though the script reads a seed (DA-CLIP's `seed =
            # opt["train"]["manual_seed"]`, its set_random_seed(seed) commented out): shown where the seed is read
            test, where_m, where = (where_m or m, where), m, unused
            what = f"`{ast.unparse(unused.targets[0])}` is read here, but nothing seeds torch with it"
        elif test is not None and test[1] is not at[1]:  # a seed skipped: shown at its test (DFormer's `if
            # args.use_seed:`, EDA's `if args.fix_random_seed:`), the setup among the related places
            where_m, where, test = test[0], test[1], (where_m or m, where)
        yield Hit(where, f"{what} (in this script or the helpers it calls): rank 0's initial weights "
                  "(which DDP broadcasts) and every draw differ from any single run, so the two runs cannot be "
                  "compared — torch.manual_seed(seed) before building the model",
                  module=where_m,
                  related=tuple(wraps) + ((test,) if test else ()) + calls)  # (and the seed the default
        # run skips: the test that skips it, and the call of the helper it sits in)


def _unused_seed(m: Module) -> ast.AST | None:
    """The script's own binding of a seed (`seed = opt["train"]["manual_seed"]`, `self.seed = 50 + rank`) when
    nothing seeds at all: the value read and never used, where the fix goes."""
    return next((a for a in m.nodes if isinstance(a, ast.Assign) and len(a.targets) == 1 and re.fullmatch(
        r"(\w+_)?seed", dotted(a.targets[0]).split(".")[-1] or "") and not isinstance(a.value, ast.Constant)), None)


def _run_goes_on_unseen(f: Facts, m: Module, calls: list) -> bool:
    """The script reaches no DDP wrap itself and hands the run to a function it imports from a module of the
    project's own package that these files lack (V-JEPA's app/main.py: `from app.scaffold import main as app_main`,
    which picks app/vjepa/train.py by name), while a project module the copies hold wraps in DDP and seeds torch:
    the run goes on where the audit cannot follow it, so whether it is seeded is not known here."""
    if not f.p.on_disk or any(f.is_ddp_call(mm, c) for mm, c in calls):
        return False
    for mm, c in calls:
        if mm is not m or not isinstance(c.func, ast.Name) or c.func.id not in m.imports:
            continue
        mod, _attr, level = m.imports[c.func.id]
        if level or not mod or not (Path(f.p.root) / mod.split(".")[0]).is_dir() or f.p.module_for(m, c.func.id):
            continue
        if any(any(f.is_ddp_call(om, x) for x in om.calls) and any(f.seed_kind(om, x) == "torch" for x in om.calls)
               for om in f.p.modules.values()):
            return True
    return False


def _seeding_function_handed_on(f: Facts, m: Module) -> bool:
    """The script names a project function without calling it (`train_func = train`, put in a run list, then
    `launch_task(cfg, init_method, func=run[1])`, which spawns workers that call `func`: TAdaConv), and that
    function seeds torch and wraps the model in DDP: the run goes on there, seeded, through a value the audit does
    not follow into the launcher's parameter."""
    named = [n for n in m.nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and not (
        isinstance(m.parent.get(id(n)), ast.Call) and m.parent.get(id(n)).func is n)]
    for n in named:
        for tm, tf in f.p.resolve(m, ast.Call(func=n, args=[], keywords=[])):
            if not isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = list(f.p.calls_in(f.p.reach(tm, tf)))
            if any(f.seed_kind(xm, x) == "torch" and not gated(f, xm, x) and not failed_by_default(f, xm, x) and (
                    f.seed_kind(xm, x, True) and not f.p.resolve(xm, x) or not helper_gated(f, xm, x))
                   for xm, x in calls) and any(f.is_ddp_call(xm, x) for xm, x in calls):
                return True  # (seeded in the default run: not nlp-recipes' `if seed is not None:` in fit)
    return False


def _unlinked_runner_seeds(f: Facts, calls: list) -> bool:
    """`pipeline = get_pipeline(config)` from a module these files lack, then `pipeline.run()`: the run goes on in a
    project class the audit cannot link (OpenOOD's TrainOEPipeline), and a project method of that name seeds torch
    (`torch.manual_seed(self.config.seed)` at the top of run()): whether torch is seeded is not known here."""
    for mm, c in calls:
        # (or the object called itself, `trainer = get_obj_from_str(cfg.train.main)(cfg)`, then `trainer(0)` or
        # mp.spawn(trainer): a project class's __call__, Versatile Diffusion's exec_container)
        held = c.func.value if isinstance(c.func, ast.Attribute) else c.func
        if not isinstance(held, ast.Name) or f.p.resolve(mm, c):
            continue
        meth = c.func.attr if isinstance(c.func, ast.Attribute) else "__call__"
        made = [a.value for a in mm.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
            isinstance(t, ast.Name) and t.id == held.id for t in a.targets)]
        if not made or any(f.p.resolve(mm, v) for v in made):
            continue
        # (or built from a project class of that name whose __init__, or its base's, seeds: FGT's `trainer =
        # pkg.Network(opt, rank)` from `pkg = import_module('networks.' + name)`, Trainer.__init__ -> setSeed())
        if any(f.seed_kind(xm, x) == "torch" for v in made for om in f.p.modules.values() if callee(v) in om.classes
               for im, init in f.p.methods(om, callee(v), "__init__") for xm, x in f.p.calls_in(f.p.reach(im, init))):
            return True
        # ... or taken from a registry (contrastors' `trainer_cls = TRAINER_REGISTRY[model_type]`): any project class
        # with the method called whose __init__ (its base's) seeds
        looked_up = {dotted(t) for a in mm.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Subscript)
                     for t in a.targets}
        if any(callee(v) in looked_up for v in made) and any(
                f.p.methods(om, name, meth) and any(f.seed_kind(xm, x) == "torch" for im, init in f.p.methods(
                    om, name, "__init__") for xm, x in f.p.calls_in(f.p.reach(im, init)))
                for om in f.p.modules.values() for name in om.classes):
            return True
        for om in f.p.modules.values():
            for cd in om.classes.values():
                fn = next((d for d in cd.body if isinstance(d, ast.FunctionDef) and d.name == meth), None)
                if fn is not None and any(f.seed_kind(xm, x) == "torch" for xm, x in f.p.calls_in(
                        f.p.reach(om, fn))):
                    return True
    return False


def _calls_of(f: Facts, at) -> tuple:
    """The project's first call of the helper around a seed the default run skips (fast-reid's `seed_all_rng()`),
    where the user passes the seed."""
    fn = at[0].enclosing(at[1]) if at else None
    return tuple(f.p.callers(at[0], fn)[:1]) if fn is not None else ()


def _before_a_spawn(f: Facts, m: Module, c: ast.AST, depth: int = 2) -> bool:
    """`c` runs before an mp.spawn in its function, or in a helper called so (AdCo's Config_Environment(args))."""
    scope = m.enclosing(c) or m.tree
    return any(isinstance(x, ast.Call) and callee(x) in SPAWNS and x.lineno > c.lineno and not f.off_by_default(m, x)
               and not _launched_without(f, m, x) for x in walk(scope)) or \
        bool(depth and m.enclosing(c)) and any(_before_a_spawn(f, cm, cc, depth - 1)
                                               for cm, cc in f.p.callers(m, m.enclosing(c)))


def _launched_without(f: Facts, m: Module, spawn: ast.Call) -> bool:
    """The spawn sits under `if args.multiprocessing_distributed:`, and every shell command of the project that
    runs this script leaves that option out (a MoCo fork's torch.distributed.launch scripts): those runs call the
    worker in the launched process itself."""
    commands = script_commands(f.p.root, m.rel) if f.p.on_disk else []
    up = m.parent.get(id(spawn))
    while commands and up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(up, ast.If) and isinstance(up.test, ast.Attribute) and any(spawn is x for s in up.body
                                                                                  for x in ast.walk(s)):
            # (a command-line option only: one a config file sets, OpenScene's `multiprocessing_distributed: True`
            # in its YAML, is on whatever the command passes)
            cli = any(callee(c) == "add_argument" and any((const_str(a) or "").lstrip("-").replace("-", "_") ==
                                                         up.test.attr for a in c.args)
                      for mm in f.p.modules.values() for c in mm.calls)
            return cli and not f.yaml_places(up.test.attr) and not any(up.test.attr in flags for flags in commands)
        up = m.parent.get(id(up))
    return False


def _test_of(m: Module, c: ast.AST, failed: str | None) -> tuple[Module, ast.AST]:
    """(m, the `if` around `c` whose test reads `failed`), or (m, c) when there is none."""
    n = m.parent.get(id(c))
    while failed and n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and ast.unparse(n.test) == failed:
            return m, n
        n = m.parent.get(id(n))
    return m, c


def _setup_in_flow(f: Facts, m: Module) -> ast.AST:
    """Where the script's flow sets up the process group, next to where the model is then built and the seed
    belongs: the setup line, or, when that line sits in a setup helper of the script (`def ddp_setup(rank, ws):
    os.environ[...]; init_process_group(...)`, no loop and no wrap of its own), the helper's call in the flow
    (`ddp_setup(rank, world_size)` in main)."""
    node = f.setup_line(m)
    fn = m.enclosing(node) if isinstance(node, ast.Call) and callee(node) == "init_process_group" else None
    if fn is None or fn.name == "__init__" or any(isinstance(n, (ast.For, ast.While)) or isinstance(
            n, ast.Call) and f.is_ddp_call(m, n) for n in walk(fn)):
        return node  # (a constructor: sssegmentation's Trainer.__init__ sets up the group, start() builds the model)
    if not re.search(r"setup|init|dist|ddp", fn.name, re.I) and (m.class_of(fn) or
            sum(isinstance(n, ast.stmt) for n in walk(fn)) > 12 or _builds_after(fn, node)):
        return node  # the script's own main() (GCA-Matting's, which calls the trainer; DAMO-YOLO's short one,
        # which builds its Trainer after the setup): the seed goes there
    sites = [c for cm, c in f.p.callers(m, fn) if cm is m]
    return min(sites, key=lambda c: c.lineno) if sites else node


def _spawned_setup(f: Facts, m: Module) -> tuple[Module, ast.Call] | None:
    """(module, init_process_group) of the worker function the script spawns in another file, when that worker
    sets up the group itself (PerAct's `mp.spawn(run_seed_fn.run_seed, ...)`, whose run_seed calls
    init_process_group): the worker's flow is where the model is built and the seed belongs."""
    for sm, c in [(m, c) for c in m.calls] + _launcher_calls(f, m):
        if callee(c) in SPAWNS and c.args and isinstance(c.args[0], (ast.Name, ast.Attribute)):
            for tm, tf in f.p.resolve(sm, ast.Call(func=c.args[0], args=[], keywords=[]), exact=True):
                inits = [x for x in walk(tf) if isinstance(x, ast.Call) and callee(x) == "init_process_group"]
                if tm is not m and inits:
                    return tm, inits[0]
    return None


def _launcher_calls(f: Facts, m: Module) -> list[tuple[Module, ast.Call]]:
    """The calls of a launch helper in another file that the script calls (EdgeYOLO's `train(cfg)`, which is
    edgeyolo's launch(), whose `mp.start_processes(train_single, ...)` starts the worker)."""
    return [(tm, x) for c in m.calls for tm, tf in f.p.resolve(m, c, exact=True) if tm is not m
            for x in walk(tf) if isinstance(x, ast.Call) and callee(x) in SPAWNS]


def _builds_after(fn: ast.AST, init: ast.AST) -> bool:
    """`fn` goes on after its init_process_group with calls that are no set-up (a config, a trainer, the model):
    a short main(), not a set-up helper whose call the flow makes."""
    return any(isinstance(c, ast.Call) and c.lineno > init.lineno and callee(c) not in (
        "set_device", "barrier", "synchronize", "print", "info", "debug", "warning", "get_rank", "get_world_size",
        "is_initialized", "setup_for_distributed") for c in walk(fn))


@rule("seed-before-spawn", "02_seeds", "seeded in the parent before mp.spawn: the workers never seed torch's CPU "
      "RNG, so the DDP init is unseeded while the single run's is seeded", scope="entry")
def seed_before_spawn(f: Facts, m: Module):
    entry = _entry_calls(f, m)
    # (a seed only under `if args.seed is not None:` counts here: given or not, the workers never see it)
    if entry is None or not entry[1] & {"torch", "other"} and not any(
            f.seed_kind(mm, c) in ("torch", "other") and failed_by_default(f, mm, c) for mm, c in entry[0]):
        return  # no seed at all is no-seed's finding
    for c in m.calls:
        fn = (c.args[0] if c.args else kw(c, "fn")) if callee(c) in SPAWNS else _spawned_through(f, m, c)
        if fn is None or f.off_by_default(m, c) or _launched_without(f, m, c):
            continue  # (a spawn under an option off by default, MoCo's --multiprocessing-distributed, which a fork's
            # torch.distributed.launch script never passes: main_worker runs in the seeded process itself)
        target = f.p.resolve(m, ast.Call(func=fn, args=[], keywords=[]))
        if not target and isinstance(fn, ast.Attribute) and dotted(fn.value) == "self" and m.class_of(
                m.enclosing(c)):  # `mp.spawn(self.train_model, ...)`: the class's own method (RoseTTAFold2)
            target = f.p.methods(m, m.class_of(m.enclosing(c)), fn.attr)
        if not target:
            continue
        tm, tf = target[0]
        inside = {f.seed_kind(mm, cc) for mm, cc in f.p.calls_in(f.p.reach(tm, tf))} - {None}
        parent = m.enclosing(c) or m.tree
        before = [cc for cc in ast.walk(parent) if isinstance(cc, ast.Call) and f.seed_kind(m, cc) == "torch"
                  and cc.lineno < c.lineno and not (_runs_on_import(m, cc) and not _runs_on_import(m, c))]
        if not before and isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # (the spawn in a method the script calls after seeding: RoseTTAFold2's `torch.manual_seed(args.seed)`
            # in __main__, then `train.run_model_training(...)`, whose mp.spawn starts train_model)
            before = [cc for sm, site in f.p.callers(m, parent) if sm is m for cc in ast.walk(
                m.enclosing(site) or m.tree) if isinstance(cc, ast.Call) and f.seed_kind(m, cc) == "torch"
                      and cc.lineno < site.lineno and not _runs_on_import(m, cc)]  # (spawn re-imports the module:
            # a seed at its top level runs in every worker too, NLSPN's)
        if "torch" not in inside and before:
            yield Hit(c, f"{dotted(before[0].func)}(...) (line {before[0].lineno}) seeds "
                     f"the parent only: the processes mp.spawn starts run {tf.name}() in a fresh interpreter "
                     f"and {'only seed torch.cuda' if 'cuda' in inside else 'never seed torch'}, so the DDP "
                     "run's init (built on the CPU) is unseeded while the single run's is seeded — seed inside "
                     f"{tf.name}()")


def _runs_on_import(m: Module, c: ast.AST) -> bool:
    """A statement at the script's top level outside its `if __name__ == '__main__':` block (MVSFormer's
    `torch.manual_seed(SEED)` under its imports): a spawned worker re-runs the main module as `__mp_main__`, so it
    runs in every worker too (when the spawn itself is guarded, as it must be for the workers to start)."""
    if m.enclosing(c) is not None:
        return False
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and "__name__" in ast.unparse(n.test):
            return False
        n = m.parent.get(id(n))
    return True


def _spawned_through(f: Facts, m: Module, c: ast.Call) -> ast.AST | None:
    """`run_distributed(run_training, config, args)` where the project helper runs `mp.spawn(fn, ...)` on its
    parameter (WaveGrad): the function the workers run, as the call hands it."""
    for _, tf in f.p.resolve(m, c):
        params = [a.arg for a in tf.args.args]
        for s in walk(tf):
            if not (isinstance(s, ast.Call) and callee(s) in SPAWNS):
                continue
            # (or handed to the spawned worker in `args=(fn, ...)`, which calls it: GETMusic's launch(), whose
            # `mp.spawn(distributed_worker, args=(fn, world_size, ...))` ends in `fn(local_rank, *args)`)
            handed = [s.args[0]] if s.args else []
            handed += [e for e in getattr(kw(s, "args"), "elts", [])[:1]]
            for h in handed:
                if isinstance(h, ast.Name) and h.id in params and params.index(h.id) < len(c.args):
                    return c.args[params.index(h.id)]
    return None


def _handed_in(m: Module, c: ast.Call, arg: ast.AST) -> bool:
    """The seed is the enclosing helper's own parameter (`def init_seeds(seed): torch.manual_seed(seed)`): it holds
    a rank only through what a caller passes, and the caller's `init_seeds(base_seed + local_rank)` is judged where
    it is made (one defect, one finding)."""
    fn = m.enclosing(c)
    return isinstance(arg, ast.Name) and fn is not None and not RANKISH.search(arg.id) and arg.id in {
        a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}


def _distributed_arm(f: Facts, m: Module, c: ast.Call) -> ast.If | None:
    """The `if` whose body holds `c` and whose test says whether the run is distributed (`local_rank != -1`,
    `args.distributed`): the single run never evaluates `c`; it takes the other arm."""
    child, n = c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and any(child is s for s in n.body) and (
                is_switch_value(n.test) or is_switch_test(n.test)):
            return n
        child, n = n, m.parent.get(id(n))
    return None


def _other_arm_seed(f: Facts, m: Module, c: ast.Call, arm: ast.If) -> ast.AST | None:
    """The seed the single run's arm gives the same generator: `init_seeds(base_seed)` in the else."""
    kind = f.seed_kind(m, c)
    return next((inline_rank_name(m, x.args[0]) for s in arm.orelse for x in ast.walk(s) if isinstance(x, ast.Call)
                 and x.args and f.seed_kind(m, x) == kind), None)


WALL_CLOCK = re.compile(r"^(time\.)?(time|time_ns)$|(^|\.)(now|utcnow)$")


def _wall_clock(m: Module, c: ast.Call) -> ast.Call | None:
    """The wall-clock call in the seed `c` is given, directly or through an unconditional assignment in the same
    function (MSST's DDP setup: `seed = (seed + int(time.time())) % 55535 + 10000; manual_seed(seed)`); a clock
    that is only a fallback (`args.seed if args.seed is not None else time.time()`) is not judged."""
    if not c.args:
        return None
    fn = m.enclosing(c) or m.tree
    exprs = [c.args[0]]
    if isinstance(c.args[0], ast.Name):
        exprs += [a.value for a in getattr(fn, "body", []) if isinstance(a, ast.Assign) and a.lineno < c.lineno
                  and any(isinstance(t, ast.Name) and t.id == c.args[0].id for t in a.targets)]
    for e in exprs:
        if any(isinstance(x, (ast.IfExp, ast.BoolOp)) for x in ast.walk(e)):
            continue
        clock = next((n for n in ast.walk(e) if isinstance(n, ast.Call) and WALL_CLOCK.search(dotted(n.func))), None)
        if clock is not None:
            return clock
    return None


def _seed_argument(f: Facts, m: Module, c: ast.Call) -> ast.AST | None:
    """The argument of `c` that becomes the seed. A torch seed's first argument; for a project helper, the
    argument bound to the parameter the helper seeds with (`initialize_environment_ddp(rank, world_size,
    args.seed)` seeds `seed`, not `rank`); None when the helper computes its seed itself (judged there)."""
    targets = f.p.resolve(m, c) if f.seed_kind(m, c, direct=True) is None else []
    if not targets:
        return c.args[0] if c.args else None
    tm, tf = targets[0]
    params = [a.arg for a in getattr(tf, "args", ast.arguments()).args]
    positional = params[1:] if params[:1] in (["self"], ["cls"]) else params
    for inner in (n for n in walk(tf) if isinstance(n, ast.Call) and n.args and f.seed_kind(tm, n)):
        name = inner.args[0].id if isinstance(inner.args[0], ast.Name) else None
        if name not in positional or any(isinstance(a, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in a.targets) for a in walk(tf)):
            continue
        given = kw(c, name)
        if given is None and positional.index(name) < len(c.args):
            given = c.args[positional.index(name)]
        return given
    return None


@rule("seed-per-rank", "02_seeds", "rank 0's seed differs from the single run's (`seed + 1 + RANK`, RANK = -1 "
      "alone), or a per-rank init is copied (EMA) before the wrap: rank 0's init is not the single run's",
      needs_ddp=False)
def seed_per_rank(f: Facts, m: Module):
    # one seed, one finding: `random.seed(s); np.random.seed(s); torch.manual_seed(s)` is reported at torch's
    # (the model init's), the other generators only when torch is not seeded with the same value there
    torch_seeded = {(id(m.enclosing(c)), ast.unparse(c.args[0])) for c in m.calls
                    if c.args and f.seed_kind(m, c) == "torch"}
    for c in m.calls:
        if f.seed_kind(m, c) not in ("torch", "other") or not (c.args or c.keywords):
            continue  # (a helper's seed by keyword counts: RapFlow-TTS's `seed_init(seed=seed)`)
        if f.seed_kind(m, c) == "other" and c.args and (id(m.enclosing(c)), ast.unparse(c.args[0])) in torch_seeded:
            continue
        if _in_a_worker_init(f, m, c):
            continue  # a DataLoader worker's seed, per rank by design (ProbFace's `num_workers * rank + worker_id +
            # seed`): the model is built in the main process, whose seed this is not
        clock = _wall_clock(m, c)
        if clock is not None and f.seed_kind(m, c, direct=True) != "other":
            yield Hit(c, f"{ast.unparse(c)} seeds with the wall clock (line {clock.lineno}: `{ast.unparse(clock)}`): "
                      "each rank, started in its own second, draws another seed, and none is the single run's "
                      "seed, so rank 0's init, which DDP broadcasts, and every rank's draws differ from the single "
                      "run's — seed with the configured seed alone (seed + rank only where ranks must differ)")
            continue
        arg = _seed_argument(f, m, c)
        if arg is None or failed_by_default(f, m, c):
            continue  # (a seed only where the default fails the test, genforce's `if config.seed is not None:`,
            # seeds nothing in the default run: no-seed's finding)
        switched_seed, seed_name = rank_seed_under_switch(m, arg), dotted(arg)
        arg = inline_rank_name(m, arg)
        if not involves_rank(arg, m.rank_tainted, skip_conditional=True) or _handed_in(m, c, arg):
            continue
        if switched_seed is not None:
            ranked, base, test = switched_seed
            if seed_value(m, with_name(ranked.value, seed_name, base.value), lambda name: 0) != seed_value(
                    m, base.value, lambda name, c=c: single_run_value(m, name, c, p=f.p) or 0, world=1):
                yield Hit(c, f"{ast.unparse(c)} seeds with {ast.unparse(ranked.value)} under `{ast.unparse(test)}` "
                          f"(line {ranked.lineno}), where the single run seeds {ast.unparse(base.value)} (line "
                          f"{base.lineno}): rank 0's seed is not the single run's, so its init, which DDP broadcasts, "
                          f"and its draws differ — seed with {ast.unparse(base.value)} + rank", related=((m, ranked),))
            continue  # (equal: DRAGON's `args.seed + (2 ** args.local_rank - 1)` under `if args.local_rank != -1:`)
        at0 = seed_value(m, arg, lambda name: 0)
        single = seed_value(m, arg, lambda name, c=c: single_run_value(m, name, c, p=f.p) or 0, world=1)
        arm = _distributed_arm(f, m, c)
        if arm is not None:  # `if local_rank != -1: init_seeds(base + local_rank) else: init_seeds(base)` (OSTrack)
            other = _other_arm_seed(f, m, c, arm)
            single = None if other is None else seed_value(
                m, other, lambda name, c=c: single_run_value(m, name, c, p=f.p) or 0, world=1)
        if at0 is not None and single is not None and at0 != single:
            if at0 == seed_value(m, arg, lambda name: 0, world=1):
                yield Hit(c, f"{ast.unparse(c)} seeds rank 0 with {ast.unparse(arg)} = "
                         f"seed{at0 - 1000:+g}, but the single run (rank variable {single - at0 + 0:+g} from rank 0's "
                         f"value) seeds seed{single - 1000:+g}: rank 0's init and draws are not the single run's; "
                         "make rank 0's seed equal the single run's (e.g. seed + max(rank, 0))")
            else:
                yield Hit(c, f"{ast.unparse(c)} seeds rank 0 with {ast.unparse(arg)}, which moves with the world "
                         "size: at 2 ranks rank 0's seed is not the single run's (unless the base seed is 0), so "
                         "rank 0's init, which DDP broadcasts, is not the single run's; make rank 0's seed the "
                         "single run's (e.g. seed + rank)")
            continue
        # (a seed at a script's top level, VMamba's `__main__` block, before `main(config, args)`, which builds the
        # EMA and wraps: that function's body is where the copy and the wrap are)
        scopes = [m.enclosing(c) or m.tree] + ([tf for x in m.calls if x.lineno > c.lineno and m.enclosing(x) is None
                                                for tm, tf in f.p.resolve(m, x) if tm is m] if m.enclosing(c) is None
                                               else [])
        for fn in scopes:
            hit = copy_before_wrap(f, m, c, fn, 0 if fn is not scopes[0] else c.lineno)
            if hit is not None:
                yield hit
                break


@rule("peek-iterator", "02_seeds", "next(iter(loader)) makes an extra iterator that draws a seed from the global "
      "RNG: every later draw is shifted from the single run's")
def peek_iterator(f: Facts, m: Module):
    loaders = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
               and callee(a.value) == "DataLoader" for t in a.targets}
    for c in m.calls:
        if not (callee(c) == "next" and c.args and isinstance(c.args[0], ast.Call) and callee(c.args[0]) == "iter"
                and c.args[0].args):
            continue
        src = c.args[0].args[0]
        if isinstance(src, ast.Call) and callee(src) in ITERABLE_NOT_LOADER:
            continue  # next(iter(d.items())), next(iter(model.parameters())): no loader, no RNG draw
        if isinstance(src, ast.Call) and callee(src) != "DataLoader" or not (
                dotted(src) in loaders or LOADERISH.search(dotted(src).split(".")[-1] or "")
                or isinstance(src, ast.Call)):
            continue
        fn = m.enclosing(c)
        if fn is not None and m.enclosing(fn) is None and m.class_of(fn) is None and plain_function(fn) and \
                not f.p.callers(m, fn) and never_named(f.p, m, fn):
            continue  # a module function named nowhere (semantic-segmentation's throughput()): dead code here
        if f.off_in_default_run(m, c):
            continue  # (TinyViT's throughput(), called only `if config.THROUGHPUT_MODE:`, False by default)
        yield c, (f"{ast.unparse(c)} creates an extra iterator over the loader, which draws a seed from the global "
                  "RNG (even with num_workers=0) and shifts every later draw; give the DataLoader "
                  "generator=torch.Generator().manual_seed(...), or read loader.batch_size")


def _parameter_given_no_rank(f: Facts, m: Module, c: ast.Call, seed: ast.AST) -> bool:
    """`seed` is a parameter of the function around the sampler, and every caller hands it a value with no rank
    (NWM's evaluate(..., seed) called with `args.global_seed`, though train() has a per-rank `seed` of its own:
    the module-wide taint mixes the two)."""
    fn = m.enclosing(c)
    params = [a.arg for a in fn.args.args] if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if not (isinstance(seed, ast.Name) and seed.id in params):
        return False
    i, sites = params.index(seed.id) - (params[0] in ("self", "cls")), f.p.callers(m, fn)
    given = [(cm, a) for cm, s in sites for a in (s.args[i:i + 1] + [k.value for k in s.keywords if k.arg == seed.id])]
    return bool(sites) and len(given) == len(sites) and not any(involves_rank(a, cm.rank_tainted) for cm, a in given)


@rule("sampler-seed-per-rank", "03_samplers", "a DistributedSampler seeded per rank: each rank shuffles another "
      "permutation, so the shards overlap and some samples are never seen in the epoch")
def sampler_seed_per_rank(f: Facts, m: Module):
    for c in m.calls:
        seed = kw(c, "seed")
        if callee(c) in f.sampler_classes() and seed is not None and involves_rank(seed, m.rank_tainted) and \
                not _parameter_given_no_rank(f, m, c, seed):
            yield c, (f"{callee(c)}(..., seed={ast.unparse(seed)}): the sampler cuts one permutation into world_size "
                      "shards, and that needs the same seed on every rank; a seed that differs per rank gives each "
                      "rank a slice of another permutation, so shards overlap and samples are lost — pass the "
                      "same seed on every rank (the rank picks the shard)")
    yield from shuffled_before_the_sampler(f, m)  # (or the list under it, or the permutation, differs per rank)
    for x, message, where in sampler_drawing_globally(f, m):
        yield Hit(x, message, module=where)


def _broadcasts_parameters(m: Module, c: ast.Call) -> bool:
    """`for param in model.parameters(): dist.broadcast(param.detach(), 0)`: a script without a DDP wrap that
    copies rank 0's init to the others itself (modded-nanogpt), where an unseeded init takes effect."""
    loop = m.enclosing(c, (ast.For,))
    return callee(c) == "broadcast" and loop is not None and isinstance(loop.iter, ast.Call) and callee(
        loop.iter) in ("parameters", "named_parameters", "state_dict")
