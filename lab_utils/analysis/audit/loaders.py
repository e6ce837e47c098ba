"""Where a sampler's loader goes: the names the loader built on a sampler is kept under (`self.train_loader =
DataLoader(..., sampler=self.train_sampler)`, or `self.dataloader = get_dataset(...)` for a builder that returns
it), and the places the training code then iterates it in an epoch loop. The sampler rules name those places: the
defect is made where the sampler is built and happens where its loader is iterated, epoch after epoch. Also:
whether a loader is gone over once in the whole run, which builder calls never take the sampler's arm, and
which project loaders make their iterator once (set_epoch comes too late for them), and where the epoch loop
that set_epoch belongs in gets its loader."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from .project import Module
from .syntax import EVALISH, callee, dotted, kw, walk

if TYPE_CHECKING:
    from .facts import Facts


def _names(targets) -> set[str]:
    return {dotted(t).split(".")[-1] for t in targets if isinstance(t, (ast.Name, ast.Attribute))}


def _held_as(m: Module, node: ast.AST) -> set[str]:
    a = m.parent.get(id(node))
    return _names(a.targets) if isinstance(a, ast.Assign) else set()


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(x, ast.Name) and x.id in names or isinstance(x, ast.Attribute) and x.attr in names
               for x in ast.walk(node))


def loader_names(p, m: Module, sampler: ast.Call) -> set[str]:
    """The names the loaders built on `sampler` are held under (see _loader_names)."""
    return _loader_names(p, m, sampler)[0]


def _loader_names(p, m: Module, sampler: ast.Call) -> tuple[set[str], list]:
    """(the names the loaders built on `sampler` are held under, here or by the callers of a builder that returns
    one; those callers' calls)."""
    held = _held_as(m, sampler) or {"sampler"}
    loaders = [c for c in m.calls if callee(c).endswith("DataLoader") and any(
        k.arg == "sampler" and (any(x is sampler for x in ast.walk(k.value)) or _mentions(k.value, held))
        for k in c.keywords)]  # (or built in the keyword's arm: `sampler=DistributedSampler(d) if dist else None`)
    names, handed = set(), []
    for c in loaders:
        names |= _held_as(m, c)
        fn = m.enclosing(c)
        rets = [r.value for r in ast.walk(fn or m.tree) if fn is not None and isinstance(r, ast.Return)
                and r.value is not None and (r.value is c or _mentions(r.value, _held_as(m, c)))]
        if rets:  # `return DataLoader(...)` / `return loader`: the callers keep it under their own names
            at = next((i for i, e in enumerate(rets[0].elts) if e is c or _mentions(e, _held_as(m, c))),
                      None) if isinstance(rets[0], ast.Tuple) else None
            for cm, call in p.callers(m, fn):
                a = cm.parent.get(id(call))  # `train_loader, _ = compile_data(...)` (BEVCar): the loader's slot
                names |= _names([a.targets[0].elts[at]]) if at is not None and isinstance(a, ast.Assign) and \
                    isinstance(a.targets[0], ast.Tuple) and len(a.targets[0].elts) > at else _held_as(cm, call)
                handed.append((cm, call))
        a = m.parent.get(id(c))
        held_self = [t.attr for t in getattr(a, "targets", []) if isinstance(t, ast.Attribute) and dotted(t.value) ==
                     "self"] if fn is not None and fn.name == "__init__" else []
        modes = _modes_of(m, c)  # (built under `if mode == 'train':`: the callers asking for that mode)
        for cm, call in p.callers(m, fn) if held_self else []:  # `DepthDataLoader(config, "train").data`, whose
            up = cm.parent.get(id(call))  # __init__ holds `self.data = DataLoader(..., sampler=...)` (Depth-Anything)
            given = {a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            if isinstance(up, ast.Attribute) and up.attr in held_self and not (modes and given and not modes & given):
                names |= _held_as(cm, up)
                handed.append((cm, call))
    return names, handed


def _modes_of(m: Module, node: ast.AST) -> set[str]:
    """The strings the ifs around `node` compare a name with (`if mode == 'train':`)."""
    out, n = set(), m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and isinstance(n.test.ops[0], ast.Eq) and \
                isinstance(n.test.comparators[0], ast.Constant) and isinstance(n.test.comparators[0].value, str):
            out.add(n.test.comparators[0].value)
        n = m.parent.get(id(n))
    return out


def loader_places(p, m: Module, sampler: ast.Call) -> list[tuple[Module, ast.AST]]:
    """(the call that hands the loader to the training code, when a builder returns it; the first place an epoch
    loop iterates the loader; that epoch loop), as far as they are found."""
    names, handed = _loader_names(p, m, sampler)
    if not names and handed:
        return handed[:1]
    found = []
    for mm in p.modules.values():
        for loop in (n for n in mm.nodes if isinstance(n, (ast.For, ast.While))):  # (CLD-SGM: `while step < n:`)
            inner = [x for x in walk(loop) if x is not loop and (
                isinstance(x, ast.For) and _mentions(x.iter, names) or isinstance(x, ast.Assign) and isinstance(
                    x.value, (ast.Call, ast.IfExp)) and _mentions(x.value, names))]  # (`pbar = tqdm(...) if ...
            if inner:  # else enumerate(...)`) an epoch loop around the place that iterates (or wraps,
                found.append([*handed[:1], (mm, inner[0]), (mm, loop)])
    if found:  # the loop over epochs first (Depth-Anything's `for epoch in range(...)`, not the prefetch pass
        # before it, `for i, batch in tqdm(enumerate(self.train_loader))`, whose inner loop also mentions it)
        return next((x for x in found if _counts_epochs_loop(x[-1][1])), found[0])
    def training_loader(x: ast.For) -> bool:
        return any(isinstance(n, (ast.Name, ast.Attribute)) and re.fullmatch(
            r"train_?(data)?_?(loader|dl)", dotted(n).split(".")[-1]) for n in ast.walk(x.iter))
    unseen = not names and not handed  # (the loader goes on through a module these files lack: VidSitu's data)
    for mm in p.modules.values():  # a method that iterates the loader once, called from another's epoch loop
        for x in (n for n in mm.nodes if isinstance(n, ast.For) and (
                _mentions(n.iter, names) or unseen and training_loader(n))):  # (VidSitu's train_epoch over
            fn = mm.enclosing(x)  # self.data.train_dl, called in fit's `for epoch in mb:`)
            outer = [(cm, loop) for cm, call in (p.callers(mm, fn) if fn is not None else [])
                     if (loop := cm.enclosing(call, (ast.For, ast.While))) is not None]
            if outer:
                return [*handed[:1], (mm, x), outer[0]]
    uses = [(mm, x) for mm in p.modules.values() for x in mm.nodes if isinstance(x, ast.Assign) and isinstance(
        x.value, ast.Call) and callee(x.value) in ("tqdm", "enumerate", "iter") and _mentions(x.value, names)]
    if not uses and not handed:  # the loader goes on through a module these files lack (mdistiller's get_dataset):
        # the loop over the project's training loader, `for idx, data in enumerate(self.train_loader):`
        uses = [(mm, x) for mm in p.modules.values() for x in mm.nodes if isinstance(x, ast.For) and training_loader(x)]
    return [*handed[:1], *uses[:1]]


def _counts_epochs_loop(loop: ast.AST) -> bool:
    return isinstance(loop, ast.For) and any(isinstance(n, ast.Name) and "epoch" in n.id.lower()
                                             for n in ast.walk(loop.target))


def one_epoch_run(f) -> bool:
    """Every epoch loop of the project's scripts (`for epoch in range(args.epochs)`) runs once in the default run:
    no epoch boundary, so no epoch repeats another's order."""
    counts = []
    for mm in f.p.modules.values():
        for n in mm.nodes:
            if isinstance(n, ast.For) and isinstance(n.target, ast.Name) and "epoch" in n.target.id.lower() and \
                    isinstance(n.iter, ast.Call) and callee(n.iter) == "range" and 1 <= len(n.iter.args) <= 2:
                bounds = [f.default_value(mm, a) for a in n.iter.args]
                counts.append(bounds[-1] - (bounds[0] if len(bounds) == 2 else 0)
                              if all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) else None)
    return bool(counts) and all(c == 1 for c in counts)


def rebuilt_after(m: Module, c: ast.Call) -> bool:
    """`c` (`s.set_epoch(epoch)`) sits in a loop whose body later binds `s` to a new object, with no set_epoch on it
    after that: the call reaches the sampler of the iteration before, never the one the loader gets."""
    if not isinstance(c.func, ast.Attribute):
        return False
    name, loop = dotted(c.func.value), m.parent.get(id(c))
    while loop is not None and not isinstance(loop, (ast.For, ast.While, ast.FunctionDef, ast.Module)):
        loop = m.parent.get(id(loop))
    if not isinstance(loop, (ast.For, ast.While)):
        return False
    binds = [a.lineno for a in walk(loop) if isinstance(a, ast.Assign) and a.lineno > c.lineno
             and isinstance(a.value, ast.Call) and any(dotted(t) == name for t in a.targets)]
    return bool(binds) and not any(isinstance(x, ast.Call) and callee(x) == "set_epoch" and isinstance(
        x.func, ast.Attribute) and dotted(x.func.value) == name and x.lineno > min(binds) for x in walk(loop))


def set_once(p, m: Module, c: ast.Call) -> bool:
    """`c` (`sampler.set_epoch(x)`) runs once per build of the loader, not per epoch: it sits in no loop of its
    function, its epoch is not something the function is handed (a parameter, `self.epoch`), and no call of the
    function sits in a loop (SEMamba's create_dataloader:
    `sampler.set_epoch(cfg['training_cfg']['training_epochs'])`)."""
    fn = m.enclosing(c)
    arg = c.args[0] if c.args else kw(c, "epoch")
    if fn is None or arg is None or _in_a_loop(m, c, fn) or m.enclosing(c, (ast.Lambda,)) is not None:
        return False  # (a lambda an event runs each epoch: ConvAI's `lambda engine: sampler.set_epoch(...)`)
    params = {a.arg for a in fn.args.args}
    if any(isinstance(x, ast.Name) and x.id in params and not re.search(r"cfg|conf|args|opt", x.id)
           for x in ast.walk(arg)) or dotted(arg).startswith("self."):
        return False  # (a config handed in is not the epoch: `cfg['training_cfg']['training_epochs']`)
    return not any(_in_a_loop(cm, call, cm.enclosing(call)) for cm, call in p.callers(m, fn))


def _in_a_loop(m: Module, node: ast.AST, fn: ast.AST | None) -> bool:
    n = m.parent.get(id(node))
    while n is not None and n is not fn and not isinstance(n, ast.Module):
        if isinstance(n, (ast.For, ast.While, ast.comprehension)):
            return True
        n = m.parent.get(id(n))
    return False


def reshuffled_each_epoch(m: Module, sampler: ast.Call) -> bool:
    """The sampler is built anew in a loop, over a dataset that loop rebuilds with shuffling asked for (Coconut's
    `dataset_train = get_cot_latent_dataset(..., shuffle=True)`, then `DistributedSampler(dataset_train,
    shuffle=True)`, each epoch): its fixed permutation runs over a dataset whose order changes every epoch."""
    data = sampler.args[0] if sampler.args else None
    n = m.parent.get(id(sampler))
    while n is not None and not isinstance(n, (ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)):
        n = m.parent.get(id(n))
    if not isinstance(data, ast.Name) or not isinstance(n, (ast.For, ast.While)):
        return False
    return any(isinstance(a, ast.Assign) and a.lineno < sampler.lineno and any(
        isinstance(t, ast.Name) and t.id == data.id for t in a.targets) and isinstance(a.value, ast.Call) and any(
        k.arg and "shuffle" in k.arg and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in a.value.keywords) for a in ast.walk(n))


def loader_sets_epoch(p, m: Module, sampler: ast.Call) -> bool:
    """The sampler goes to a project DataLoader class that sets its epoch itself (Protenix's DistributedDataLoader:
    `self.sampler.set_epoch(self.counter)` in __iter__, the counter moved on at each pass)."""
    a = m.parent.get(id(sampler))
    names = {dotted(t) for t in a.targets} if isinstance(a, ast.Assign) else set()
    for c in m.calls:
        if not any(k.arg == "sampler" and (k.value is sampler or dotted(k.value) in names) for k in c.keywords):
            continue
        for tm, tf in p.resolve(m, c, exact=True):
            cls = tm.classes.get(tm.class_of(tf) or "")
            if cls is not None and any(isinstance(x, ast.Call) and callee(x) == "set_epoch" and dotted(
                    x.func.value) == "self.sampler" for x in ast.walk(cls)):
                return True
    return False


def discarded(p, m: Module, sampler: ast.Call) -> bool:
    """Every caller of the builder drops the loader the sampler goes to: `return train_queue, valid_queue, n`, and
    VAEBM's only call `train_queue, _, _ = datasets.get_loaders(args)`: the padded loader is never iterated."""
    fn, up = m.enclosing(sampler), m.parent.get(id(sampler))
    named = {dotted(t) for t in up.targets} if isinstance(up, ast.Assign) else set()
    loaders = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
        k.arg == "sampler" and (k.value is sampler or dotted(k.value) in named) for k in a.value.keywords)
        for t in a.targets}
    rets = [r.value for r in walk(fn) if isinstance(r, ast.Return)] if fn is not None and loaders else []
    slots = {i for r in rets if isinstance(r, ast.Tuple) for i, e in enumerate(r.elts) if dotted(e) in loaders}
    if not (slots and len(slots) == 1 and all(isinstance(r, ast.Tuple) for r in rets)):
        return False
    return _dropped_by_callers(p, m, fn, next(iter(slots)))


def _dropped_by_callers(p, m: Module, fn: ast.AST, i: int, depth: int = 2) -> bool:
    """Every call of `fn` unpacks slot `i` of its tuple into `_`, or returns it to callers that do (VAEBM's
    `get_loaders` returning `get_loaders_eval(...)`)."""
    def dropped(cm, c):
        a = cm.parent.get(id(c))
        if isinstance(a, ast.Return) and depth and cm.enclosing(c) is not None:
            return _dropped_by_callers(p, cm, cm.enclosing(c), i, depth - 1)
        t = a.targets[0] if isinstance(a, ast.Assign) else None
        return isinstance(t, ast.Tuple) and len(t.elts) > i and isinstance(t.elts[i], ast.Name) and t.elts[
            i].id.startswith("_")
    sites = p.callers(m, fn)
    return bool(sites) and all(dropped(cm, c) for cm, c in sites)


def reiterates(p, m: Module, c: ast.Call) -> bool:
    """`train_loader = sample_data(train_loader)` where the project's sample_data is a generator that runs `for
    batch in loader: yield batch` inside `while True:` (StyleGAN2-style, StyleMapGAN): each pass makes a new
    iterator of the loader, which reads the sampler's epoch then (unlike itertools.cycle, which replays)."""
    for _, tf in p.resolve(m, c):
        params = {a.arg for a in getattr(getattr(tf, "args", None), "args", [])}
        if any(isinstance(w, ast.While) and any(isinstance(x, ast.For) and isinstance(x.iter, ast.Name) and
                                                x.iter.id in params for x in ast.walk(w))
               for w in ast.walk(tf)) and any(isinstance(y, (ast.Yield, ast.YieldFrom)) for y in ast.walk(tf)):
            return True
    return False


def single_pass(p, m: Module, sampler: ast.Call) -> bool:
    """The loaders on `sampler` are gone over once in the whole run: every loop over them (`for i, (src, tgt) in
    enumerate(zip(src_loader, tgt_loader))`, FADA's iteration-based training) sits in no other loop, nor in a
    function any caller (up to three up) calls from a loop; nothing makes an iterator of them by hand. One pass
    is one epoch: no epoch boundary, so no order to repeat."""
    names, _ = _loader_names(p, m, sampler)
    if not names:
        return False
    sites = [(mm, x) for mm in p.modules.values() for x in mm.nodes if isinstance(x, ast.For) and _mentions(
        x.iter, names) or isinstance(x, ast.Call) and callee(x) in ("iter", "cycle") and _mentions(x, names)]
    return bool(sites) and all(isinstance(x, ast.For) and not _run_repeatedly(p, mm, x, 3) for mm, x in sites)


def _run_repeatedly(p, m: Module, node: ast.AST, depth: int) -> bool:
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, (ast.For, ast.While, ast.comprehension)):
            return True
        n = m.parent.get(id(n))
    if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    callers = p.callers(m, n)
    return not callers or depth == 0 or any(_run_repeatedly(p, cm, c, depth - 1) for cm, c in callers)


def not_built_for(m: Module, c: ast.Call, call: ast.Call) -> bool:
    """The helper builds the sampler `c` only under `if shuffle:` on a parameter that `call` leaves at its false
    default or passes as a false constant (Demucs denoiser's `distrib.loader(dataset, batch_size=1)`: shuffle=False
    takes the other arm, a strided Subset with no padding)."""
    fn = m.enclosing(c)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or callee(call) != fn.name or any(
            k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    names = [a.arg for a in fn.args.args]
    defaults = dict(zip(names[len(names) - len(fn.args.defaults):], fn.args.defaults, strict=True))
    defaults |= {a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None}
    positional = [n for n in names if n not in ("self", "cls")]
    def given(name: str):
        at = positional.index(name) if name in positional else len(call.args)
        g = kw(call, name) or (call.args[at] if at < len(call.args) else defaults.get(name))
        return g.value if isinstance(g, ast.Constant) else ...

    def fails(t: ast.AST) -> bool:  # (eP-ALM's `if distributed and mode == 'train':`, called distributed=False)
        if isinstance(t, ast.Name) and (t.id in names or t.id in defaults):  # (keyword-only: Demucs' shuffle)
            return given(t.id) is not ... and not given(t.id)
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)) and \
                isinstance(t.left, ast.Name) and (t.left.id in names or t.left.id in defaults) and isinstance(
                    t.comparators[0], ast.Constant):
            g = given(t.left.id)
            return g is not ... and (g == t.comparators[0].value) != isinstance(t.ops[0], ast.Eq)
        return False
    child, n = c, m.parent.get(id(c))
    while n is not None and n is not fn:
        if isinstance(n, ast.If) and any(child is b for b in n.body) and any(fails(t) for t in (
                n.test.values if isinstance(n.test, ast.BoolOp) and isinstance(n.test.op, ast.And) else [n.test])):
            return True
        if isinstance(n, ast.If) and any(child is b for b in n.orelse) and isinstance(n.test, ast.Name) and (
                n.test.id in names or n.test.id in defaults) and given(n.test.id) is not ... and given(n.test.id):
            return True  # the else arm of `if is_train:`, called is_train=True (hysts' create_dataloader)
        child, n = n, m.parent.get(id(n))
    return False


def loop_over_own_loader(m: Module, c: ast.Call) -> ast.For | None:
    """The `for` around a set_epoch call that iterates the very loader whose sampler it sets (OTAvatar's `for it,
    data in enumerate(train_dataset): train_dataset.sampler.set_epoch(epoch)`, MX-Font's `for batch in
    cyclize(loader): ... loader.sampler.set_epoch(epoch)`): the loop made the loader's iterator, which drew the
    epoch's indices, before its body runs."""
    receiver = dotted(c.func.value) if isinstance(c.func, ast.Attribute) else ""
    if not receiver:
        return None
    if receiver.endswith(".sampler") and receiver != "self.sampler":  # (`self.sampler` names a sampler: AMT)
        loaders = {receiver[: -len(".sampler")]}
    else:  # a sampler name: the loaders this module builds from it
        loaders = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                   and callee(a.value) == "DataLoader" and dotted(kw(a.value, "sampler") or ast.Constant(0)) == receiver
                   for t in a.targets}
    loaders.discard("")
    loop = m.enclosing(c, (ast.For, ast.FunctionDef, ast.AsyncFunctionDef))
    while isinstance(loop, ast.For):
        if loaders & {dotted(n) for n in ast.walk(loop.iter) if isinstance(n, (ast.Name, ast.Attribute))}:
            return loop
        loop = m.enclosing(loop, (ast.For, ast.FunctionDef, ast.AsyncFunctionDef))
    return None


def persistent_loaders(f: Facts, m: Module) -> list[str]:
    """Project DataLoader subclasses that make their iterator once, in __init__ (`self.iterator =
    super().__iter__()`, YOLOv5's InfiniteDataLoader), and that the code running with `m` uses."""
    out = []
    related = f.p.related(m)
    for mm in related:
        for name, cls in mm.classes.items():
            init = mm.functions.get(f"{name}.__init__")
            if init is None or not any(dotted(b).endswith("DataLoader") for b in cls.bases) or not any(
                    isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and (
                        callee(a.value) == "iter" or callee(a.value) == "__iter__") for a in walk(init)):
                continue
            if any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and callee(a.value) in (
                    "iter", "__iter__") for k, fn in mm.functions.items() if k.startswith(f"{name}.")
                    and k != f"{name}.__init__" for a in walk(fn)):
                continue  # re-made when it runs out (ResRep's `except StopIteration: self.dataset_iterator =
                # super().__iter__()`): the next pass's iterator starts after the epoch's set_epoch
            # a loader class the default run never picks (`if use_multi_epochs_loader: loader_class = ...`,
            # off unless --use-multi-epochs-loader) leaves the default run's order right
            used = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                       and not f.off_by_default(u, n) for u in related for n in u.nodes)
            if used:
                out.append(name)
    return out


def timm_multi_epochs_loader(f: Facts, m: Module) -> tuple[Module, ast.AST] | None:
    """timm's MultiEpochsDataLoader, built by the code running with `m` (CvT's `create_loader(...,
    use_multi_epochs_loader=True)`): its __init__ makes its iterator once, over a repeating batch sampler, as
    YOLOv5's InfiniteDataLoader does. (module, the keyword's value or the class's call): where the fix goes."""
    for mm in f.p.related(m):
        for c in mm.calls:
            if not mm.imports.get(callee(c), ("",))[0].startswith("timm") or f.off_by_default(mm, c):
                continue
            on = kw(c, "use_multi_epochs_loader")
            if callee(c) == "MultiEpochsDataLoader" or callee(c) == "create_loader" and isinstance(
                    on, ast.Constant) and on.value is True:
                return mm, on if callee(c) == "create_loader" else c
    return None


def late_for_persistent(name: str) -> str:
    return (f"set_epoch here, but the loader is {name}, whose iterator is made once in its __init__ and never "
            "re-made: its workers prefetch the next epoch's indices before this call, so the new epoch's order is "
            "drawn with the old epoch (epoch 1 repeats epoch 0's) — set the epoch before the iterator draws it, or "
            "re-make the iterator each epoch")


def called_in_a_loop(f: Facts, m: Module, c: ast.Call) -> bool:
    """The function around `c` is called from inside a loop (an epoch hook: `for epoch in ...: self.before_epoch()`)."""
    fn = m.enclosing(c)
    return fn is not None and any(cm.enclosing(s, (ast.For, ast.While)) is not None for cm, s in f.p.callers(m, fn))


def used_only_when_off(f: Facts, m: Module, sampler: ast.Call) -> bool:
    """Every place the loader built on `sampler` is handed on or iterated runs only under an option off by default
    (GLNet's test loader, evaluated under `if evaluation:`, --evaluation store_true): the default run never
    evaluates with it."""
    names, _ = _loader_names(f.p, m, sampler)
    handed = [(mm, x) for mm in f.p.modules.values() for x in mm.calls if any(
        isinstance(a, (ast.Name, ast.Attribute)) and dotted(a).split(".")[-1] in names
        for a in [*x.args, *[k.value for k in x.keywords]])]
    iterated = [(mm, x) for mm in f.p.modules.values() for x in mm.nodes
                if isinstance(x, ast.For) and _mentions(x.iter, names)]
    sites = handed + iterated
    return bool(names and sites) and all(f.off_in_default_run(mm, x) for mm, x in sites)


def rebound_before_use(m: Module, c: ast.Call) -> bool:
    """`train_sampler = DistributedSampler(...)` in an `if args.distributed:`, then `train_sampler =
    SubsetRandomSampler(train_idx)` at the function's own level before anything reads it: no loader gets it."""
    a, fn = m.parent.get(id(c)), m.enclosing(c)
    if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and fn):
        return False
    name = a.targets[0].id
    later = [b.lineno for b in fn.body if isinstance(b, ast.Assign) and b.lineno > c.lineno and any(
        isinstance(t, ast.Name) and t.id == name for t in b.targets)]
    return bool(later) and not any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                                   and c.lineno < n.lineno < min(later) for n in walk(fn))


def handed_to_an_unseen_engine(p, m: Module, sampler: ast.Call) -> bool:
    """The loader on `sampler` goes into a project class built on another library's training engine (UPT's
    `CustomisedDLE(DistributedLearningEngine)` from pocket.core), and no project loop iterates it: the epochs
    run in the library, whose set_epoch these files cannot show."""
    names, _ = _loader_names(p, m, sampler)
    if not names or loader_places(p, m, sampler)[1:]:
        return False
    for c in m.calls:
        if not any(_mentions(a, names) for a in [*c.args, *(k.value for k in c.keywords)]):
            continue
        cls = m.classes.get(callee(c)) or next((mm.classes[callee(c)] for mm in p.modules.values()
                                                if callee(c) in mm.classes), None)
        for b in cls.bases if cls is not None else []:
            imp = m.imports.get(dotted(b).split(".")[0]) or next(
                (mm.imports.get(dotted(b).split(".")[0]) for mm in p.modules.values()
                 if dotted(b).split(".")[0] in mm.imports), None)
            if imp and imp[2] == 0 and imp[0].split(".")[0] not in ("torch", "lightning", "pytorch_lightning") and \
                    not any(mm.rel.split("/")[0] == imp[0].split(".")[0] for mm in p.modules.values()):
                return True
    return False


def epoch_loop_caller(f: Facts, m: Module, node: ast.AST, depth: int = 3):
    """(module, call): the nearest call, up the callers of the builder that makes `node`, made in a function that
    runs an epoch loop (Timer's `self._get_data(flag='train')` in Exp_Forecast.train, two helpers above the
    sampler): where the loader comes into the loop that set_epoch belongs in. A function whose loop counts epochs
    comes first, its batches looped in a helper (TAPE's run_train, `for epoch_id in range(...):
    run_train_epoch(...)`), before one with loops over a single evaluation (its run_eval), though both ask the
    same builder for a loader."""
    frontier = [(m, m.enclosing(node))]
    for _ in range(depth):
        nxt, epochs, looped = [], [], []
        for mm, fn in frontier:
            for cm, c in (f.p.callers(mm, fn) if fn is not None else []):
                g = cm.enclosing(c)
                if g is not None and _counts_epochs(g) and not EVALISH.search(callee(c)):
                    epochs.append((cm, c))  # (not its evaluation's call: svoice's evaluate(..., self.tt_loader))
                if g is not None and any(isinstance(n, (ast.For, ast.While)) and any(
                        isinstance(x, (ast.For, ast.While)) and x is not n for x in ast.walk(n)) for n in ast.walk(g)):
                    looped.append((cm, c))
                nxt.append((cm, g))
        if epochs or looped:
            return (epochs or looped)[0]
        frontier = nxt
    return None


def _counts_epochs(fn: ast.AST) -> bool:
    """A `for epoch in ...` loop in the function."""
    return any(isinstance(n, ast.For) and any(isinstance(t, ast.Name) and re.search(r"epoch", t.id, re.I)
                                              for t in ast.walk(n.target)) for n in walk(fn))


def has_epoch_loop(m: Module) -> bool:
    """The module runs an epoch loop itself (a loop around a loop): set_epoch would go there. A script that hands
    the loader to a trainer in another file has its epoch loop, and the fix, elsewhere."""
    return any(isinstance(n, (ast.For, ast.While)) and any(
        isinstance(x, (ast.For, ast.While)) and x is not n for x in ast.walk(n)) for n in m.nodes)


def trimmed_to_ranks(m: Module, sampler: ast.Call) -> bool:
    """The sampler's dataset was cut to a multiple of the world size before it was built (RoseTTAFold2's
    `n = (n // world_size) * world_size`, then `Dataset(keys[:n], ...)`): nothing is padded, so no sample is
    counted twice (the cut samples are another defect, not this one)."""
    ds = sampler.args[0] if sampler.args else kw(sampler, "dataset")
    scope = m.enclosing(sampler) or m.tree
    made = [a.value for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(ds, ast.Name) and any(
        isinstance(t, ast.Name) and t.id == ds.id for t in a.targets)]
    bounds = {dotted(x.slice.upper) for v in made for x in ast.walk(v) if isinstance(x, ast.Subscript)
              and isinstance(x.slice, ast.Slice) and x.slice.upper is not None} - {""}
    return bool(bounds) and any(isinstance(a, ast.Assign) and any(dotted(t) in bounds for t in a.targets) and any(
        isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mult) and isinstance(b.left, ast.BinOp) and isinstance(
            b.left.op, ast.FloorDiv) and re.search(r"world|replica|num_gpus|ngpu", ast.unparse(b), re.I)
        for b in ast.walk(a.value)) for a in walk(scope))


def trains_over(m: Module, c: ast.Call) -> bool:
    """A loop over the sampler's loader runs backward (TiPNN's training sampler in train_and_validate)."""
    up = m.parent.get(id(c))
    held = {dotted(t) for t in getattr(up, "targets", [])}
    loaders = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
        dotted(k.value) in held for k in a.value.keywords if k.arg == "sampler") for t in a.targets}
    return bool(held and loaders) and any(isinstance(n, ast.For) and {dotted(x) for x in ast.walk(n.iter)} & loaders
                                          and any(callee(b) == "backward" for b in ast.walk(n) if isinstance(
                                              b, ast.Call)) for n in ast.walk(m.enclosing(c) or m.tree))


def handed_sampler_class(f: Facts, m: Module, c: ast.Call) -> str | None:
    """`sampler(validation_dataset)` where `sampler` is a parameter every caller fills with a sampler class
    (PointConvFormer's getdataLoaders(cfg, torch.utils.data.distributed.DistributedSampler), RandomSampler in the
    one-process arm): the class the DDP run's caller hands in, by name; None otherwise."""
    fn = m.enclosing(c)
    if not isinstance(c.func, ast.Name) or not isinstance(fn, ast.FunctionDef):
        return None
    params = [a.arg for a in fn.args.args]
    if c.func.id not in params:
        # ... or a name the function binds to one (MGN's `sampler_class = DistributedSampler`, or `partial(
        # BoundedDistributedSampler, ...)`, then `test_sampler = sampler_class(test_dataset, ...)`)
        bound = [a.value.args[0] if isinstance(a.value, ast.Call) and callee(a.value) == "partial" and a.value.args
                 else a.value for a in walk(fn) if isinstance(a, ast.Assign) and len(a.targets) == 1
                 and isinstance(a.targets[0], ast.Name) and a.targets[0].id == c.func.id and a.lineno < c.lineno]
        return next((dotted(v).split(".")[-1] for v in bound if dotted(v).split(".")[-1] in f.sampler_classes()),
                    None)
    i = params.index(c.func.id)
    handed = [cc.args[i] if len(cc.args) > i else kw(cc, c.func.id) for _, cc in f.p.callers(m, fn)]
    names = [dotted(h).split(".")[-1] for h in handed if h is not None]
    return next((n for n in names if n in f.sampler_classes()), None)
