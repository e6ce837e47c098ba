"""Objects a project factory builds: `trainer = build_trainer(args, ...)`, whose every return builds a project class
(`return YoloTrainer(...)` in one arm, `return YoloxTrainer(...)` in another: RT-ODLab), so `trainer.train(model)`
may run either class's train(). Project.resolve asks it when the name holds no one class's instance."""

from __future__ import annotations

import ast

from .syntax import walk


def factory_classes(p, m, name: str) -> list:
    """[(module, ClassDef)] of the project classes a factory call bound to `name` in `m` may build: every return of
    the factory (a project function, not a class) is a call of a project class; [] otherwise. `p`: the Project."""
    busy = p.__dict__.setdefault("_factory_busy", set())
    if (m.rel, name) in busy:
        return []  # (`x = x.step()`: asking what x's method returns asks what x holds)
    busy.add((m.rel, name))
    try:
        return _factory_classes(p, m, name)
    finally:
        busy.discard((m.rel, name))


def _factory_classes(p, m, name: str) -> list:
    for a in m.built(name):
        v = a.value if isinstance(a, ast.Assign) else None
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Call) and isinstance(v.func.func, ast.Name) and \
                v.func.func.id == "getattr" and v.func.args and isinstance(v.func.args[0], ast.Name) and \
                v.func.args[0].id in m.imports:  # `runner = getattr(runners, config.get("runner"))(config)`
            imp = m.imports[v.func.args[0].id]  # (HIRL): any class of that package
            pkg = "/".join(x for x in (imp[0] or "").split(".") + [imp[1] or ""] if x)
            return [(mm, cd) for mm in p.modules.values() if pkg and mm.rel.startswith(pkg + "/")
                    for cd in mm.classes.values()]
        if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and isinstance(a.value.func, (
                ast.Name, ast.Attribute)) and any(isinstance(t, ast.Name) and t.id == name for t in a.targets)):
            continue
        if isinstance(a.value.func, ast.Attribute) and not (isinstance(a.value.func.value, ast.Name)
                                                             and a.value.func.value.id in m.imports):
            continue  # (a factory of the project, `build_trainer(...)` or `engine.build_trainer(...)`: no method)
        out = []
        for tm, tf in p.resolve(m, a.value):
            if not isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)) or tm.class_of(tf) is not None:
                return []
            rets = [r.value for r in walk(tf) if isinstance(r, ast.Return) and r.value is not None]
            for r in rets:
                made = p.resolve(tm, r, exact=True) if isinstance(r, ast.Call) else []
                classes = {(id(cm), cm.class_of(f)) for cm, f in made if cm.class_of(f)}
                if len(classes) != 1:
                    return []
                cm, f = made[0]
                out.append((cm, cm.classes[cm.class_of(f)]))
        return out
    return []
