"""Which functions a run executes: a base class's method that every subclass the project builds replaces never
runs (torch_distillation's Distiller.distill, which SanhDistiller, the only distiller the script builds,
redefines), nor does a function that nothing names (never_named, never_called). The rules ask this before
reporting a defect inside a function."""

from __future__ import annotations

import ast

from .project import Module, Project
from .syntax import callee, dotted


def replaced_where_built(p: Project, m: Module, fn: ast.AST) -> bool:
    """`fn` is a method of a class the project never builds itself, and every subclass it builds (by name, in
    any module) defines a method of the same name: the run executes the subclass's, not this one. False when
    the project builds the class itself, builds none of its subclasses, or a subclass calls super().<name>."""
    cls = m.class_of(fn) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if cls is None:
        return False
    built = p.__dict__.get("_built_names")
    if built is None:  # (asked for every finding: the project's called names, once)
        built = p.__dict__["_built_names"] = {callee(c) for mm in p.modules.values() for c in mm.calls}
    if cls in built:
        return False
    subs = [(mm, cd) for mm in p.modules.values() for cd in mm.classes.values()
            if any(dotted(b).split(".")[-1] == cls for b in cd.bases) and cd.name in built]
    return bool(subs) and all(any(isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == fn.name
                                  and not _calls_super(d, fn.name) for d in cd.body) for _, cd in subs)


def _calls_super(d: ast.AST, name: str) -> bool:
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == name
               and isinstance(c.func.value, ast.Call) and callee(c.func.value) == "super" for c in ast.walk(d))


PLAIN_DECORATORS = ("no_grad", "inference_mode", "torch.jit", "lru_cache", "cache", "wraps")


def plain_function(fn: ast.AST) -> bool:
    """A function whose decorators do not register it anywhere (`@torch.no_grad()` only): if nothing names it,
    nothing runs it. A registered one (`@MODELS.register_module()`, `@app.command()`) runs by its registry."""
    return all(any(k in ast.unparse(d) for k in PLAIN_DECORATORS) for d in getattr(fn, "decorator_list", []))


def never_called(p: Project, m: Module, node: ast.AST) -> bool:
    """`node` sits in a module-level function of a module the project imports, and nothing in the project calls or
    names that function, nor does a decorator register it (IELT's ScaleLr, whose one call in setup.py is commented
    out): the run never executes it."""
    fn = m.enclosing(node)
    while fn is not None and m.enclosing(fn) is not None:  # (a closure: the function around it decides)
        fn = m.enclosing(fn)
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.class_of(fn) and \
        plain_function(fn) and not p.callers(m, fn) and _imported_here(p, m) and never_named(p, m, fn)


def _imported_here(p: Project, m: Module) -> bool:
    """Some other module of these files imports `m`: its importers are here to name what they use. A module
    nothing here imports is called from files these copies lack (ColBERT's training.py, Point-MAE's runner)."""
    return any(m.rel in p.imports_of(o) for o in p.modules.values() if o is not m)


def never_named(p: Project, m: Module, fn: ast.AST) -> bool:
    """`fn` is named nowhere: not in its own module outside its body (a call, `mp.spawn(fn)`, `fire.Fire(fn)`),
    and no other module imports it by name (a star import brings every name): dead code in these files."""
    name = getattr(fn, "name", "")
    inside = {id(n) for n in ast.walk(fn)}
    if any(isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in inside and dotted(n).split(".")[-1] == name
           for n in m.nodes):
        return False
    return not any(attr in (name, None) and p.module_for(mm, local) is m and _uses(p, mm, name)
                   for mm in p.modules.values() if mm is not m for local, (_, attr, _) in mm.imports.items())


def _uses(p: Project, mm: Module, name: str) -> bool:
    """A module that imports `name` names it (IELT's setup.py star-imports ScaleLr and only a comment names it:
    no use), or hands it on to modules that import it from there."""
    return any(isinstance(n, (ast.Name, ast.Attribute)) and dotted(n).split(".")[-1] == name for n in mm.nodes) \
        or any(attr in (name, None) and p.module_for(o, local) is mm for o in p.modules.values()
               if o is not mm for local, (_, attr, _) in o.imports.items())
