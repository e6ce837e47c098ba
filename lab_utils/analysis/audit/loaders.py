"""Where a sampler's loader goes: the names the loader built on a sampler is kept under (`self.train_loader =
DataLoader(..., sampler=self.train_sampler)`, or `self.dataloader = get_dataset(...)` for a builder that returns
it), and the places the training code then iterates it in an epoch loop. The sampler rules name those places: the
defect is made where the sampler is built and happens where its loader is iterated, epoch after epoch."""

from __future__ import annotations

import ast

from .project import Module
from .syntax import callee, dotted


def _names(targets) -> set[str]:
    return {dotted(t).split(".")[-1] for t in targets if isinstance(t, (ast.Name, ast.Attribute))}


def _held_as(m: Module, node: ast.AST) -> set[str]:
    a = m.parent.get(id(node))
    return _names(a.targets) if isinstance(a, ast.Assign) else set()


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(x, ast.Name) and x.id in names or isinstance(x, ast.Attribute) and x.attr in names
               for x in ast.walk(node))


def loader_places(p, m: Module, sampler: ast.Call) -> list[tuple[Module, ast.AST]]:
    """(the call that hands the loader to the training code, when a builder returns it; the first place an epoch
    loop iterates the loader; that epoch loop), as far as they are found."""
    held = _held_as(m, sampler) or {"sampler"}
    loaders = [c for c in m.calls if callee(c).endswith("DataLoader") and any(
        k.arg == "sampler" and (k.value is sampler or _mentions(k.value, held)) for k in c.keywords)]
    names, handed = set(), []
    for c in loaders:
        names |= _held_as(m, c)
        fn = m.enclosing(c)
        returned = fn is not None and any(isinstance(r, ast.Return) and r.value is not None and (
            r.value is c or _mentions(r.value, _held_as(m, c))) for r in ast.walk(fn))
        if returned:  # `return DataLoader(...)` / `return loader`: the callers keep it under their own names
            for cm, call in p.callers(m, fn):
                names |= _held_as(cm, call)
                handed.append((cm, call))
    if not names:
        return handed[:1]
    for mm in p.modules.values():
        for loop in (n for n in mm.nodes if isinstance(n, ast.For)):
            inner = [x for x in ast.walk(loop) if x is not loop and (
                isinstance(x, ast.For) and _mentions(x.iter, names) or isinstance(x, ast.Assign) and isinstance(
                    x.value, ast.Call) and _mentions(x.value, names))]
            if inner:  # an epoch loop around the place that iterates (or wraps, `tqdm(self.dataset.train_loader)`)
                return [*handed[:1], (mm, inner[0]), (mm, loop)]
    uses = [(mm, x) for mm in p.modules.values() for x in mm.nodes if isinstance(x, ast.Assign) and isinstance(
        x.value, ast.Call) and callee(x.value) in ("tqdm", "enumerate", "iter") and _mentions(x.value, names)]
    return [*handed[:1], *uses[:1]]


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
