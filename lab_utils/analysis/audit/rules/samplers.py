"""Chapter 03 (samplers): set_epoch missing, late or under the wrong switch; shuffle twice (chapter 08's padding
sampler in evaluation is eval_padding.py)."""

from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..loaders import (
    called_in_a_loop,
    epoch_loop_caller,
    handed_to_an_unseen_engine,
    has_epoch_loop,
    late_for_persistent,
    loader_places,
    loader_sets_epoch,
    loop_over_own_loader,
    one_epoch_run,
    persistent_loaders,
    rebound_before_use,
    rebuilt_after,
    reiterates,
    reshuffled_each_epoch,
    set_once,
    single_pass,
    timm_multi_epochs_loader,
)
from ..none_arms import untaken_none_arm
from ..project import Module
from ..registry import Hit, rule
from ..scripts import arm_off
from ..switches import distributed_switch, switched
from ..syntax import (
    EVAL_WORD,
    EVALISH,
    branches,
    callee,
    const_str,
    const_value,
    dotted,
    kw,
    walk,
)


def _made(f: Facts, m: Module) -> list[ast.Call]:
    """The DistributedSampler(-like) objects this module builds (not a subclass's super().__init__)."""
    classes = f.sampler_classes()
    made = [c for c in m.calls if callee(c) in classes and not isinstance(m.parent.get(id(c)), ast.ClassDef)]
    return [c for c in made if not (m.enclosing(c) is not None and m.enclosing(c).name == "__init__"
                                    and "super" in dotted(c.func))]


def sampler_label(m: Module, c: ast.Call) -> str:
    """What a sampler is for, in words: its dataset argument and the name it is assigned to."""
    assigned = m.parent.get(id(c))
    while isinstance(assigned, ast.IfExp):
        assigned = m.parent.get(id(assigned))
    data = c.args[0] if c.args else kw(c, "dataset")  # (`DistributedSampler(dataset=val_dataset)`, CXR-CLIP)
    return (dotted(data) if data is not None else "") + " " + (
        " ".join(dotted(t) for t in assigned.targets) if isinstance(assigned, ast.Assign) else "")


def _order_matters(m: Module, c: ast.Call) -> bool:
    """Whether set_epoch changes anything for this sampler: not with shuffle=False (its order is fixed anyway), and
    not for an evaluation set (the metric does not depend on the order)."""
    return const_value(kw(c, "shuffle")) is not False and not EVALISH.search(sampler_label(m, c))


def _advances_itself(f: Facts, name: str) -> bool:
    """A project sampler class that moves its own epoch on each reshuffle (TFace's MultiDistributedSampler:
    `self.current_epoch[name] += 1` before seeding its generator), or draws each pass from a generator it keeps
    and never re-seeds there (Joey NMT's DistributedSubsetSampler: `torch.randperm(n, generator=self.generator)`
    in __iter__, the state moving on): every pass gets a new order without set_epoch."""
    it = [fn for mm in f.p.modules.values() if name in mm.classes for k, fn in mm.functions.items()
          if k == f"{name}.__iter__"]
    return any(not any(isinstance(c, ast.Call) and callee(c) in ("manual_seed", "seed") for c in walk(fn)) and any(
        isinstance(c, ast.Call) and dotted(kw(c, "generator") or ast.Constant(0)).startswith("self.")
        for c in walk(fn)) for fn in it) or any(isinstance(a, ast.AugAssign) and isinstance(a.op, ast.Add) and (
        re.search(r"epoch", dotted(a.target.value if isinstance(a.target, ast.Subscript) else a.target))) and dotted(
        a.target.value if isinstance(a.target, ast.Subscript) else a.target).startswith("self.")
        for mm in f.p.modules.values() if name in mm.classes for a in ast.walk(mm.classes[name]))


def _epochless(f: Facts, m: Module, c: ast.Call) -> bool:
    """The sampler built is a project class of its own, on torch's plain Sampler, with no set_epoch and no epoch
    anywhere in its code (genforce's DistributedSampler, reseeded from its iteration count by `__reset__`): its
    order never depended on an epoch, so there is no set_epoch to miss. Or a loader class sets it (Protenix)."""
    if loader_sets_epoch(f.p, m, c):
        return True
    for cm, fn in f.p.resolve(m, c, exact=True):
        cd = cm.classes.get(cm.class_of(fn) or "")
        if cd is None or any(b in f.sampler_classes() or "DistributedSampler" in b
                             for b in map(dotted, cd.bases)):
            return False
        return not any(isinstance(n, ast.Attribute) and "epoch" in n.attr or isinstance(n, ast.FunctionDef)
                       and "epoch" in n.name for n in ast.walk(cd))
    return False


def _sampler_context(f: Facts, m: Module):
    """(samplers built here whose epoch order matters, set_epoch calls of the scripts that run with m), or None
    when there is nothing to judge: no sampler, or a loader library audited without any script."""
    made = [c for c in _made(f, m) if _order_matters(m, c) and not _advances_itself(f, callee(c))
            and not _epochless(f, m, c) and not arm_off(f, m, c)  # (OpenOCR's `elif` after `if 'sampler' in
            # config[mode]:`, which its YAML takes)
            # ... nor one built each epoch with the epoch in its seed (MatterSim): its order moves on by itself
            and not any(re.search(r"epoch", dotted(n), re.I) for n in ast.walk(kw(c, "seed") or ast.Constant(0))
                        if isinstance(n, (ast.Name, ast.Attribute)))]
    if not made or not any(mm.entry for mm in f.p.modules.values()) or any(
            isinstance(a, (ast.Assign, ast.AugAssign)) and dotted(getattr(a, "target", None) or a.targets[0]).endswith(
                "sampler.epoch") or isinstance(a, ast.Attribute) and a.attr == "set_epoch" and not isinstance(
                mm.parent.get(id(a)), ast.Call) for mm in f.p.modules.values() for a in mm.nodes):
        return None  # (BSQ-ViT's InfiniteDataLoader: `self.data_loader.sampler.epoch += 1` at each pass, set_epoch's
        # own assignment; VLN-HAMT's `pre_epoch = sampler.set_epoch`, called by its MetaLoader at each pass)
    # only the scripts that use this sampler's code count: a sibling script's set_epoch is not this one's. When no
    # audited script imports this module (the builder between them is not in these files: `build_dataloader` from
    # a data_builder module that is absent), any script's set_epoch may be this sampler's.
    related = f.p.related(m)
    if not any(mm.entry for mm in related):
        related = list(f.p.modules.values())
    # ... and a module no script imports (a trainer loaded by name, Palette's init_obj): its set_epoch counts too
    entries = [mm for mm in f.p.modules.values() if mm.entry]
    loaded = [mm for mm in f.p.modules.values() if mm not in related and not mm.entry
              and not any(mm in f.p.related(e) for e in entries)]
    return made, [(mm, c) for mm in [*related, *loaded] for c in mm.calls if callee(c) == "set_epoch"
                  and not untaken_none_arm(f.p, mm, c)]


@rule("set-epoch-missing", "03_samplers", "a shuffling DistributedSampler whose set_epoch is never called (or only "
      "under a switch the sampler ignores): every epoch repeats epoch 0's order", needs_ddp=False)
def set_epoch_missing(f: Facts, m: Module):
    ctx = _sampler_context(f, m)
    if ctx is None:
        return
    made, set_epochs = ctx
    if one_epoch_run(f) or "DistSamplerSeedHook" in f.all_names() or all(
            single_pass(f.p, m, c) or rebound_before_use(m, c) or handed_to_an_unseen_engine(f.p, m, c)
            or reshuffled_each_epoch(m, c) for c in made):
        return  # (no epoch boundary: TorchSSL's `epoch: 1`, FADA's one pass; mmcv's hook sets the epoch: PYSKL;
        # the sampler replaced before any loader takes it: ESD's `train_sampler = SubsetRandomSampler(train_idx)`)
    stale = [(mm, c) for mm, c in set_epochs if rebuilt_after(mm, c) or set_once(f.p, mm, c)]
    # (a dataset's own set_epoch, MeMOTR's `dataset_train.set_epoch(epoch)`, moves no sampler)
    set_epochs = [(mm, c) for mm, c in set_epochs if (mm, c) not in stale and not (
        isinstance(c.func, ast.Attribute) and re.search(r"dataset", dotted(c.func.value), re.I)
        and not re.search(r"sampler|loader", dotted(c.func.value), re.I))]
    if not set_epochs:
        what = ("every epoch repeats epoch 0's order, and the run leaves the single run at the first epoch boundary "
                "— call sampler.set_epoch(epoch) at the top of each epoch")
        if stale:  # MeMOTR: `sampler_train.set_epoch(epoch)`, then `sampler_train = build_sampler(...)` anew
            sm, sc = stale[0]
            what = (f"the set_epoch at {sm.rel}:{sc.lineno} goes to the sampler of the epoch before, which the loop "
                    "then replaces with a new one at epoch 0: every epoch repeats epoch 0's order — call set_epoch "
                    "on the sampler the loader gets, after building it")
            if set_once(f.p, sm, sc):  # SEMamba's `sampler.set_epoch(cfg[...]['training_epochs'])` in its builder
                what = (f"the set_epoch at {sm.rel}:{sc.lineno} runs once, where the loader is built, not at each "
                        "epoch: every epoch repeats one order — call sampler.set_epoch(epoch) at the top of each "
                        "epoch")
        site = entry = f.entry_site(m, made[0])
        builder = m.enclosing(made[0])
        calls = [c for _, c in f.p.callers(m, builder)] if builder is not None else []
        calls = [c for c in calls if _reaches(m, builder, made[0], c)]
        if calls and all(_asks_for_evaluation(c) for c in calls):
            return  # every call asks the builder for an evaluation split (BiSeNet's `get_data_loader(cfg,
            # mode='val')`): that loader goes over its shard once per evaluation, order immaterial
        if site is None or not has_epoch_loop(site[0]):
            site = epoch_loop_caller(f, m, made[0])
        if site is not None and has_epoch_loop(site[0]):
            # One defect, one finding: shown in the script whose epoch loop never calls set_epoch (the fix goes
            # there), with the helper's sampler as its related place.
            never = "" if stale else " whose set_epoch nothing in the project calls"
            yield Hit(site[1], f"{ast.unparse(site[1].func)}(...) makes a shuffling DistributedSampler "
                               f"({m.rel}:{made[0].lineno}){never}: {what}",
                      module=site[0], related=((m, made[0]), *stale[:1], *[
                          x for x in loader_places(f.p, m, made[0]) if x[1] is not site[1]][:2]))
            # (and the first place its loader is iterated: BEVCar's `train_iterloader = iter(train_dataloader)`,
            # CLD-SGM's `for _, (train_x, _) in enumerate(train_queue):` under `while step < num_total_iter:`)
        else:  # (the script's call of the builder, whose epoch loop is around a train-one-epoch helper: MagFace)
            # an epoch handed to something that is not the sampler (Demucs denoiser's `data_loader.epoch = epoch`
            # in its epoch loop): the place the user meant to set it
            meant = [(mm, a) for mm in f.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign)
                     and any(isinstance(t, ast.Attribute) and t.attr == "epoch" and dotted(t.value) != "self"
                             for t in a.targets) and not isinstance(a.value, ast.Constant)][:1]
            told = f" (line {meant[0][1].lineno} of {meant[0][0].rel} sets `{ast.unparse(meant[0][1].targets[0])}`, " \
                "which no sampler reads)" if meant else ""
            # (and where its loader is iterated, epoch after epoch: IDDM's `tqdm(self.dataloader)` in a method the
            # base trainer's epoch loop calls, the HTR trainer's epoch loop)
            places = [*(((entry[0], entry[1]),) if entry is not None else ()), *stale[:1], *meant,
                      *loader_places(f.p, m, made[0]), *_helper_calls(f, m, made[0])[:2]]
            yield Hit(made[0], f"DistributedSampler without any sampler.set_epoch(epoch) call in the project{told}: "
                      f"{what}", related=tuple(x for i, x in enumerate(places) if x not in places[:i]))
        return
    forgotten = _sampler_left_out(m, made, set_epochs)
    if forgotten is not None:
        c, name, given = forgotten
        yield Hit(c, (f"`{name}` is a shuffling DistributedSampler whose set_epoch is never called, though the "
                      f"project calls it for {', '.join(f'`{g}`' for g in given)}: its loader repeats epoch 0's order "
                      f"every epoch, unlike the single run — call {name}.set_epoch(epoch) at the top of each epoch"))
        return
    switches = [distributed_switch(mm, c) for mm, c in set_epochs]
    if all(s is not None and not _tests_the_sampler_type(s) and not f.constant_true(s) for s in switches) and \
            not f.runs_only_distributed() \
            and any(
            switched(f.p, m, c) is None and m.enclosing(c, (ast.IfExp,)) is None for c in made) and not any(
            isinstance(m.parent.get(id(x)), ast.IfExp) for x in made):
        mm, c = set_epochs[0]
        # (the switch's `if` and the sampler, where a reader looks: CrossViT's `if args.distributed:` line)
        guard = mm.parent.get(id(switches[0]))
        yield Hit(c, f"set_epoch runs only when `{ast.unparse(switches[0])}`, but the DistributedSampler (line "
                  f"{made[0].lineno}) is built either way: without it every epoch repeats epoch 0's order — "
                  "call set_epoch wherever the sampler exists", module=mm,
                  related=(*(((mm, guard),) if guard is not None else ()), (m, made[0])))


def _helper_calls(f: Facts, m: Module, sampler: ast.Call) -> list:
    """Where the function that makes the sampler is called (a sampler helper, SDFusion's data_sampler(...))."""
    builder = m.enclosing(sampler)  # (not a call that asks it for an evaluation split: `shuffle=False`)
    return [(cm, c) for cm, c in f.p.callers(m, builder) if not _asks_for_evaluation(c)
            and const_value(kw(c, "shuffle")) is not False] if builder else []


def _reaches(m: Module, fn: ast.AST, node: ast.AST, call: ast.Call) -> bool:
    """Whether `call` of `fn` can reach `node`, judging only tests of a parameter against a constant (`if mode ==
    'train':` ... `else:` in BiSeNet's get_data_loader): the value the call hands that parameter (or its
    default) must take the branch `node` is in."""
    names = [a.arg for a in fn.args.args]
    defaults = dict(zip(names[len(names) - len(fn.args.defaults):], fn.args.defaults, strict=True))
    child, n = node, m.parent.get(id(node))
    while n is not None and n is not fn:
        t = n.test if isinstance(n, ast.If) else None
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)) and \
                isinstance(t.left, ast.Name) and t.left.id in names and isinstance(t.comparators[0], ast.Constant):
            i = names.index(t.left.id)
            given = kw(call, t.left.id) or (call.args[i] if i < len(call.args) else defaults.get(t.left.id))
            if isinstance(given, ast.Constant):
                holds = (given.value == t.comparators[0].value) == isinstance(t.ops[0], ast.Eq)
                if holds != any(child is b for b in n.body):
                    return False
        child, n = n, m.parent.get(id(n))
    return True


def _asks_for_evaluation(c: ast.Call) -> bool:
    """A builder call handed a constant that names an evaluation split (`mode='val'`, `'test'`)."""
    return any(EVAL_WORD.fullmatch(const_str(a) or "") for a in [*c.args, *(k.value for k in c.keywords)])


def _tests_the_sampler_type(test: ast.AST) -> bool:
    """`if isinstance(dataloader.sampler, DistributedSampler):` (DS2): true whenever the sampler is one, so the
    set_epoch under it runs for every DistributedSampler; no switch the sampler ignores."""
    return any(isinstance(n, ast.Call) and callee(n) == "isinstance" and len(n.args) == 2
               and "Sampler" in dotted(n.args[1]) for n in ast.walk(test))


def _sampler_left_out(m: Module, made: list[ast.Call], set_epochs) -> tuple[ast.Call, str, list[str]] | None:
    """(sampler, its name, the names set_epoch is called on) when every set_epoch call names one of this module's
    samplers (`self.datasampler_hr_train.set_epoch(...)`) and a shuffling one (RobustVideoMatting's
    `self.datasampler_lr_train`) gets none, its name used only as a loader's `sampler=`: nothing else can reach
    it. A call through anything else (`loader.sampler.set_epoch`, a helper's parameter) may be any sampler's."""
    names = {}
    for c in made:
        up = m.parent.get(id(c))
        if isinstance(up, ast.Assign) and len(up.targets) == 1 and isinstance(up.targets[0], (ast.Name, ast.Attribute)):
            names[dotted(up.targets[0])] = c
    given = [dotted(c.func.value) if isinstance(c.func, ast.Attribute) else "" for _, c in set_epochs]
    if not given or not all(g in names for g in given) or any(mm is not m for mm, _ in set_epochs):
        return None
    for name, c in names.items():
        uses = [n for n in m.nodes if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) == name
                and isinstance(n.ctx, ast.Load)]
        if name not in given and uses and all(
                isinstance(m.parent.get(id(n)), ast.keyword) and m.parent.get(id(n)).arg == "sampler" for n in uses):
            return c, name, sorted(set(given))
    return None


@rule("set-epoch-late", "03_samplers", "set_epoch after the loader's iterator exists (a persistent iterator): the "
      "epoch's order was already fixed, so epoch 1 repeats epoch 0's", needs_ddp=False)
def set_epoch_late(f: Facts, m: Module):
    ctx = _sampler_context(f, m)
    if ctx is None:
        return
    for mm, c in ctx[1]:
        stmt = c
        while not isinstance(mm.parent.get(id(stmt)), (ast.FunctionDef, ast.Module, ast.For, ast.While, ast.If,
                                                        ast.With, ast.Try, ast.ExceptHandler)):
            stmt = mm.parent.get(id(stmt))
            if stmt is None:
                break
        block_owner = mm.parent.get(id(stmt)) if stmt is not None else None
        block = next((b for b in (getattr(block_owner, "body", []), getattr(block_owner, "orelse", []))
                      if any(s is stmt for s in b)), [])
        before = block[:next((i for i, s in enumerate(block) if s is stmt), 0)]
        made_iter = [s for s in before if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                     and callee(s.value) in ("iter", "cycle")]
        if made_iter:
            yield mm, c, (f"set_epoch after `{ast.unparse(made_iter[-1])}` (line {made_iter[-1].lineno}): the "
                          "iterator already fixed the epoch's order, so this epoch repeats the previous one's; call "
                          "set_epoch first, then iter(loader)")
            continue
        if mm.enclosing(c, (ast.For, ast.While)) is None:
            persistent = persistent_loaders(f, mm) if called_in_a_loop(f, mm, c) else []
            if persistent:  # (Efficient Teacher's before_epoch(), called each epoch from train()'s loop)
                yield mm, c, late_for_persistent(persistent[0])
            continue
        loop = loop_over_own_loader(mm, c)
        if loop is not None:
            yield mm, c, (f"set_epoch inside `for ... in {ast.unparse(loop.iter)}` (line {loop.lineno}): that "
                          "loop's iterator, made before this call, already drew the epoch's order with the previous "
                          "epoch, so epoch 1 repeats epoch 0's — call set_epoch before the loop over the loader")
            continue
        persistent = persistent_loaders(f, mm)
        if persistent:
            yield mm, c, late_for_persistent(persistent[0])
            continue
        timm = timm_multi_epochs_loader(f, mm)
        if timm is not None:  # (found where the fix goes: the option that picks it)
            yield Hit(timm[1], late_for_persistent("timm's MultiEpochsDataLoader").replace(
                "set_epoch here", f"set_epoch at {mm.rel}:{c.lineno}", 1).replace(
                "or re-make the iterator each epoch", "or build a plain DataLoader (use_multi_epochs_loader=False)"),
                module=timm[0], related=((mm, c),))
            continue
        fn = mm.enclosing(c)
        if fn is None:
            continue
        iters = [s for s in walk(fn) if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                 and callee(s.value) in ("iter", "cycle", "sample_data", "infinite_loader")
                 and mm.enclosing(s, (ast.For, ast.While)) is None and not reiterates(f.p, mm, s.value)]
        nexts = any(isinstance(n, ast.Call) and callee(n) == "next" and n.args and mm.enclosing(n, (
            ast.For, ast.While)) is not None and any(dotted(n.args[0]) == dotted(t) for s in iters for t in s.targets)
                    for n in walk(fn))  # (drawn from in a loop: LapDepth's one `next(data_iter)` takes a fixed sample)
        names = {dotted(t) for s in iters for t in s.targets}
        remade = any(isinstance(s, ast.Assign) and isinstance(s.value, ast.Call) and callee(s.value) in (
            "iter", "cycle") and s.lineno > c.lineno and any(dotted(t) in names for t in s.targets)
            for s in walk(fn))  # (CoMatch: `except StopIteration: set_epoch(...); it = iter(loader)`)
        if iters and nexts and not remade:
            yield mm, c, (f"set_epoch inside the loop, but the loader's iterator is made once (line "
                          f"{iters[0].lineno}) and never re-made: the new epoch's order never reaches it, so epoch 1 "
                          "repeats epoch 0's order — re-make the iterator after set_epoch")


@rule("sampler-with-shuffle", "03_samplers", "DataLoader(sampler=DistributedSampler, shuffle=True): torch "
      "raises ValueError before the first step", needs_ddp=False)
def sampler_with_shuffle(f: Facts, m: Module):
    classes = f.sampler_classes()
    if not _made(f, m) or not any(mm.entry for mm in f.p.modules.values()):
        return
    for c in m.calls:
        if callee(c) != "DataLoader":
            continue
        sampler = kw(c, "sampler")
        if sampler is not None and const_value(kw(c, "shuffle")) is True and (
                isinstance(sampler, ast.Call) and callee(sampler) in classes or any(
                    isinstance(a, ast.Assign) and dotted(a.targets[0]) == dotted(sampler) and any(
                        isinstance(v, ast.Call) and callee(v) in classes for v in branches(a.value))
                    and m.enclosing(a) is m.enclosing(c) for a in m.nodes)):  # (the same function's name:
            # not RobustNet's other builder, whose `val_sampler = DistributedSampler(...)` this one commented out)
            yield c, ("DataLoader(sampler=DistributedSampler(...), shuffle=True): torch raises 'sampler option is "
                      "mutually exclusive with shuffle'; shuffle in the sampler")
