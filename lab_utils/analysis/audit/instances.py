"""Instances of project classes, for project.Project: which class a name holds (`model = Trainer(...)`, a
parameter every caller hands an instance of, `self.x` set in __init__), so that `model.save(n)` resolves to the
class's method. A part of Project, kept apart for its size; its methods use Project's resolve, methods and callers."""

from __future__ import annotations

import ast

from .module import Module
from .syntax import callee, dotted, walk


class Instances:
    """Mixed into project.Project."""

    def parameter_instance(self, m: Module, node: ast.AST, name: str) -> tuple[Module, ast.ClassDef] | None:
        """The project class whose instance a parameter receives from every call of its function, found by the
        function's name (VAC_CSLR's `seq_train(loader, ..., recoder)`, handed `self.recoder = utils.Recorder(...)`
        by main.py): `recoder.print_log(...)` runs Recorder's method. Cached per function and parameter."""
        fn = m.enclosing(node)
        params = [a.arg for a in fn.args.args] if fn is not None else []
        if name not in params or m.class_of(fn) is not None:
            return None
        key = (m.rel, fn.name, name)
        cache = self.__dict__.setdefault("_parameter_cache", {})
        if key not in cache:
            cache[key] = None
            i, found = params.index(name), set()
            for cm in self.modules.values():
                for c in cm.calls:
                    if callee(c) != fn.name:
                        continue
                    arg = next((k.value for k in c.keywords if k.arg == name), c.args[i] if i < len(c.args) else None)
                    got = self.instance_class(cm, dotted(arg)) if isinstance(arg, (ast.Name, ast.Attribute)) else None
                    found.add((got[0].rel, got[1].name) if got is not None else None)
                    cache[key] = got if len(found) == 1 and got is not None else cache[key]
            if len(found) != 1:
                cache[key] = None
        return cache[key]

    @staticmethod
    def own_class(m: Module, node: ast.AST) -> str | None:
        fn = m.enclosing(node)
        return m.class_of(fn) if fn is not None else None

    def instance_class(self, m: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
        """The project class whose instance a name holds: `model = Trainer(**args)`, `meter =
        misc.MetricLogger()` (through `.to()`/`.cuda()`); the first assignment that builds one. Cached."""
        key = (m.rel, name)
        if key not in self._instance_cache:
            self._instance_cache[key] = None  # (a cycle of base classes ends here)
            found = self._instance_class(m, name)
            if found is None and name.startswith("self."):  # set in a base class's __init__ in another file
                found = next((r for cls in m.classes for bm, b in self.bases_of(m, cls) if bm is not m
                              for r in [self.instance_class(bm, name)] if r is not None), None)
            if found is None and name.startswith("self."):
                found = self._handed_instance(m, name)
            self._instance_cache[key] = found
        return self._instance_cache[key]

    def _handed_instance(self, m: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
        """`self.ckp = ckp` in a class's __init__, where every call that builds the class hands it an instance
        of one project class (revisitSR's `Trainer(..., checkpoint)` after `checkpoint = utility.checkpoint(cfg)`):
        that class."""
        for key, init in m.functions.items():
            if not key.endswith(".__init__"):
                continue
            params = [a.arg for a in init.args.args][1:]
            pairs = [(t, a.value) for a in walk(init) if isinstance(a, ast.Assign) for t in a.targets] + [
                p for a in walk(init) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Tuple)
                for t in a.targets if isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(a.value.elts)
                for p in zip(t.elts, a.value.elts, strict=True)]  # (`self.model, self.ckp = model, ckp`)
            held = [v.id for t, v in pairs if isinstance(v, ast.Name) and v.id in params and dotted(t) == name]
            if not held:
                continue
            found = set()
            for cm, c in self.callers(m, init):
                given = dict(zip(params, c.args, strict=False)) | {k.arg: k.value for k in c.keywords if k.arg}
                v = given.get(held[0])
                found.add(self.instance_class(cm, v.id) if isinstance(v, ast.Name) else None)
            if len(found) == 1 and None not in found:
                return found.pop()
        return None

    def _instance_class(self, m: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
        for a in m.built(name):
            at = next((i for t in a.targets if isinstance(t, ast.Tuple) for i, e in enumerate(t.elts)
                       if dotted(e) == name), None) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) \
                else None
            if at is not None:  # `logging, writer = utils.common_init(rank, ...)`, which builds both (LSGM)
                for tm, tf in self.resolve(m, a.value):
                    r = next((r.value for r in walk(tf) if isinstance(r, ast.Return) and isinstance(
                        r.value, ast.Tuple) and len(r.value.elts) > at), None)
                    if r is not None and isinstance(r.elts[at], ast.Name):
                        return self.instance_class(tm, r.elts[at].id)
                continue
            if isinstance(a, ast.withitem) and a.optional_vars is not None and dotted(a.optional_vars) == name:
                v = a.context_expr  # `with Logger(log_dir) as logger:` (DaGAN; __enter__ hands back the instance)
            elif isinstance(a, ast.Assign) and any(dotted(t) == name for t in a.targets):
                v = a.value
            else:
                continue
            while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in (
                    "to", "cuda", "train", "eval", "float", "half") and isinstance(v.func.value, ast.Call):
                v = v.func.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute):
                b = v.func.value  # misc.MetricLogger(...) with `import util.misc`; utils.logger.ProgressMeter(...)
                sub = isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name) and b.value.id in m.imports
                target = (self.package_member(m, b.id, v.func.attr) if isinstance(b, ast.Name) and b.id in m.imports
                          else self._submodule(m, b.value.id, b.attr) if sub else None)  # (4M: no utils/__init__.py)
                if target is not None and v.func.attr in target.classes:
                    return target, target.classes[v.func.attr]
                continue
            if not isinstance(v, ast.Call) or not isinstance(v.func, ast.Name):
                continue
            if v.func.id in m.classes or v.func.id == "cls" and self.own_class(m, a):
                return m, m.classes[v.func.id if v.func.id in m.classes else self.own_class(m, a)]
            target = self.module_for(m, v.func.id)
            cls = m.imports.get(v.func.id, ("", None, 0))[1] or v.func.id
            if target is not None and cls in target.classes:
                return target, target.classes[cls]
        return None
