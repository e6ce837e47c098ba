"""One parsed file of the audited project (`Module`): its tree, parent links, functions, classes, imports, whether
it is a script, and the names that hold a rank; and `AuditError`, for a path that cannot be audited. project.py
ties the modules together."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

from .syntax import ENTRY_CALLS, callee, dotted
from .taint import module_taint


class AuditError(ValueError):
    """A path cannot be audited (missing, not Python); the message names it."""


class _AnnotatedAsPlain(ast.NodeTransformer):
    """`model: torch.nn.Module = UNet(...)` in a function binds `model` as `model = UNet(...)` does, and the rules
    read bindings from ast.Assign: a typed script (Prithvi-WxC's fine-tuning) hid its BatchNorm model. Each such
    statement becomes the plain assignment at the same place. A class body's fields (`lr: float = 1e-3` of a
    settings dataclass) stay annotated: options.py reads them as defaults."""

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        node.body = [s if isinstance(s, ast.AnnAssign) else self.visit(s) for s in node.body]
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return node  # `x: int` binds nothing
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    def visit_Call(self, node: ast.Call) -> ast.Call:
        """`DistributedDataParallel(module=model, ...)` reads as `DistributedDataParallel(model, ...)`, the form the
        rules take the wrapped model from (FaceX-Zoo's wrap hid its BatchNorm backbone)."""
        self.generic_visit(node)
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in ("DistributedDataParallel", "DDP") and not node.args and any(
                k.arg == "module" for k in node.keywords):
            node.args = [next(k.value for k in node.keywords if k.arg == "module")]
            node.keywords = [k for k in node.keywords if k.arg != "module"]
        return node


class Module:
    """One parsed file: its tree, parent links, functions, imports, and the names that hold a rank."""

    def __init__(self, path: Path, rel: str, source: str):
        try:
            with warnings.catch_warnings():  # the audited file's own `'\d'` escapes are not the user's audit news
                warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
                self.tree = _AnnotatedAsPlain().visit(ast.parse(source, filename=str(path)))
        except SyntaxError as e:
            raise AuditError(f"{path}:{e.lineno}: not Python ({e.msg})") from None
        # Every node, in ast.walk's order, listed once: the rules walk whole modules thousands of times (before
        # this list, the corpus test spent 80% of its time in ast.walk), and a parsed tree never changes.
        self.nodes: list[ast.AST] = list(ast.walk(self.tree))
        self.path, self.rel = path, rel
        self.parent: dict[int, ast.AST] = {}
        for n in self.nodes:
            for c in ast.iter_child_nodes(n):
                self.parent[id(c)] = n
        self.calls = [n for n in self.nodes if isinstance(n, ast.Call)]
        self.functions: dict[str, ast.AST] = {}          # 'f' and 'Class.method'
        self.classes: dict[str, ast.ClassDef] = {}
        for n in self.tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[n.name] = n
            elif isinstance(n, ast.ClassDef):
                self.classes[n.name] = n
                for m in n.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.functions[f"{n.name}.{m.name}"] = m
        self.imports: dict[str, tuple[str, str | None, int]] = {}   # local name -> (module, attr, level)
        self.stars: list[tuple[str, int]] = []                       # `from mod import *`: (module, level)
        for n in self.nodes:
            if isinstance(n, ast.Import):
                for a in n.names:
                    self.imports.setdefault(a.asname or a.name.split(".")[0], (
                        a.name if a.asname else a.name.split(".")[0], None, 0))
            elif isinstance(n, ast.ImportFrom):
                for a in n.names:
                    if a.name == "*":  # `from utils import *`: Project._expand_stars names what it brings
                        self.stars.append((n.module or "", n.level))
                    else:  # the first of two imports of one name (if/elif arms: MaskGIT's trainers) stays
                        self.imports.setdefault(a.asname or a.name, (n.module or "", a.name, n.level))
        self.entry = self._is_entry()
        self.rank_tainted = self._taint()

    def _is_entry(self) -> bool:
        """A script: an `if __name__ == "__main__":` block that does something, or module-level code that sets
        up the process group, wraps, launches or trains (a helper's `logging.basicConfig(...)` is no script)."""
        for n in self.tree.body:
            if isinstance(n, ast.If) and "__name__" in {dotted(m) for m in ast.walk(n.test)}:
                if not all(isinstance(b, ast.Pass) for b in n.body):
                    return True
            elif isinstance(n, (ast.For, ast.While)):
                return True
            elif not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
                                    ast.ImportFrom)) and any(
                    isinstance(c, ast.Call) and (callee(c) in ENTRY_CALLS or "DistributedDataParallel" in (
                        self.imports.get(callee(c), ("", "", 0))[1] or "")) for c in ast.walk(n)):
                return True
            elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name) \
                    and self._sets_up_ranks(n.value.func.id):
                return True  # a bare `ddp_main()` at the bottom, whose body sets up the group (MERL's main.py)
        # a console-script entry (`def main(): fire.Fire(train_from_folder)`, named in setup.py) whose module
        # spawns the ranks: the launcher's module is the script, though no `__main__` block says so
        # ... unless what the workers run is a function handed in (VQ-VAE-2's distributed/launch.py: `launch(fn,
        # ...)` spawns a worker that ends in `fn(*args)`): a generic launcher, the script is its caller
        return any(callee(c) == "spawn" and re.search(r"(^|\.)(mp|multiprocessing)$", dotted(c.func.value))
                   and not self._runs_a_parameter(c)
                   for c in ast.walk(self.tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute))

    def _sets_up_ranks(self, name: str) -> bool:
        fn = next((d for d in self.tree.body if isinstance(d, ast.FunctionDef) and d.name == name), None)
        return fn is not None and any(isinstance(c, ast.Call) and callee(c) in (
            "init_process_group", "spawn", "DistributedDataParallel", "DDP") for c in ast.walk(fn))

    def _runs_a_parameter(self, spawn: ast.Call) -> bool:
        # (a spawn inside `def launch_job(cfg, init_method, func)` handing `func` on: TimeSformer's misc.py)
        outer = next((d for d in self.tree.body if isinstance(d, ast.FunctionDef) and d.lineno <= spawn.lineno <=
                      (d.end_lineno or d.lineno)), None)
        handed = {a.arg for a in outer.args.args if re.fullmatch(r"(\w+_)?(func|fn|function|job)", a.arg)} \
            if outer is not None else set()
        if any(isinstance(x, ast.Name) and x.id in handed for k in spawn.keywords if k.arg == "args"
               for x in ast.walk(k.value)):
            return True
        target = self.tree.body and next((d for d in self.tree.body if isinstance(d, ast.FunctionDef) and spawn.args
                                          and isinstance(spawn.args[0], ast.Name) and d.name == spawn.args[0].id), None)
        if target is None:
            return False
        params = {a.arg for a in target.args.args}
        return any(isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id in params
                   for x in ast.walk(target))

    def _taint(self, seed: frozenset = frozenset(), opaque: frozenset | None = None) -> set[str]:
        return module_taint(self, seed, self.__dict__.get("_opaque", frozenset()) if opaque is None else opaque)

    def enclosing(self, node: ast.AST, kinds=(ast.FunctionDef, ast.AsyncFunctionDef)):
        n = self.parent.get(id(node))
        while n is not None and not isinstance(n, kinds):
            n = self.parent.get(id(n))
        return n

    def called_attributes(self) -> set[str]:
        """The object's attributes the module calls (`self.compute_loss(pred, targets)`, and the leaf
        `compute_loss`): functions, not values, wherever they are handed or shown (a loss function is no logged
        loss). A bare name is judged in its own scope: a module's `def loss(x, crit)` is not run_epoch's `loss`."""
        if not hasattr(self, "_called_attributes"):
            called = {dotted(c.func) for c in self.calls if isinstance(c.func, ast.Attribute)
                      and dotted(c.func).startswith("self.")}
            self._called_attributes = called | {d.split(".")[-1] for d in called}
        return self._called_attributes

    def read_lines(self, name: str) -> list[int]:
        """The lines that read `name` (a dotted name), from an index of the module's reads built on the first ask:
        the guards ask it for each pair of bindings of each rank-0 object (YANMTT: 18M node visits before)."""
        if not hasattr(self, "_read_lines"):
            self._read_lines: dict[str, list[int]] = {}
            for n in self.nodes:
                if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                    self._read_lines.setdefault(dotted(n), []).append(n.lineno)
        return self._read_lines.get(name, [])

    def single_assignments(self, name: str) -> list[ast.Assign]:
        """The one-target assignments that bind `name` (a dotted name), indexed on the first ask."""
        if not hasattr(self, "_single_assignments"):
            self._single_assignments: dict[str, list[ast.Assign]] = {}
            for b in self.nodes:
                if isinstance(b, ast.Assign) and len(b.targets) == 1:
                    self._single_assignments.setdefault(dotted(b.targets[0]), []).append(b)
        return self._single_assignments.get(name, [])

    def built(self, name: str) -> list[ast.AST]:
        """The assignments from a call and the `with` items that bind `name` (a tuple's element too), in the
        module's node order, indexed on the first ask: instance_class asks it of every name (EfficientTeacher's
        audit walked each module again for each, 11.7 s)."""
        if not hasattr(self, "_built"):
            self._built: dict[str, list[ast.AST]] = {}
            for a in self.nodes:
                if isinstance(a, ast.withitem) and a.optional_vars is not None:
                    self._built.setdefault(dotted(a.optional_vars), []).append(a)
                elif isinstance(a, ast.Assign) and isinstance(a.value, ast.Call):
                    for e in (x for t in a.targets for x in (t.elts if isinstance(t, ast.Tuple) else [t])):
                        self._built.setdefault(dotted(e), []).append(a)
        return self._built.get(name, [])

    def class_of(self, fn: ast.AST) -> str | None:
        p = self.parent.get(id(fn))
        return p.name if isinstance(p, ast.ClassDef) else None

    def has_main_guard(self) -> ast.If | None:
        return next((n for n in self.tree.body if isinstance(n, ast.If)
                     and "__name__" in {dotted(m) for m in ast.walk(n.test)}), None)
