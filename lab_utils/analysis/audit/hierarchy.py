"""Which class's method a run executes: a base class's method that every subclass the project builds replaces
never runs (torch_distillation's Distiller.distill, which SanhDistiller, the only distiller the script builds,
redefines). The rules ask this before reporting a defect inside a method."""

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
