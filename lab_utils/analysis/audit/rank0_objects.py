"""Objects only rank 0 holds or writes through (a SummaryWriter built under a rank-0 guard, `tqdm(..., disable=rank
!= 0)`, a writer class whose every method tests the rank, and such objects handed down to helpers): calls on them run
on rank 0 alone. A part of ranks.Guards, kept apart for its size; its methods use the guard's classify and kind."""

from __future__ import annotations

import ast

from .project import Module
from .rank0_flags import created_on_rank0, enabled_on_rank0
from .switched_off import cleared_off_rank0, idle_object, none_or_bare_iterable
from .syntax import dotted, kw, walk


class Rank0Objects:
    """Mixed into ranks.Guards: needs self.p (the project), self.classify, self.kind and sets self.objects."""

    def rank0_object(self, m: Module, name: str) -> bool:
        """`name` holds an object only rank 0 has (None elsewhere): one of the module's, or an attribute of an
        instance of a project class that keeps one (`model.logger` where XMemTrainer keeps `self.logger`)."""
        objects = getattr(self, "objects", {})
        if name in objects.get(m.rel, ()):
            return True
        head, _, attr = name.rpartition(".")
        found = self.p.instance_class(m, head) if head and head != "self" and "." not in attr else None
        return found is not None and f"self.{attr}" in objects.get(found[0].rel, ())

    def _rank0_objects(self, m: Module) -> set[str]:
        """Objects only rank 0 holds: `writer = SummaryWriter(...) if rank == 0 else None`, or built under a rank-0
        guard (`if rank == 0: logger = Logger(...)`). Calls on them, and tests of them (`if writer:`), run on rank 0
        alone; elsewhere the name is None (or never bound)."""
        out = cleared_off_rank0(self, m, None) | created_on_rank0(self, m)
        for w in (n for n in m.nodes if isinstance(n, (ast.With, ast.AsyncWith))):
            for item in w.items:  # `with tqdm(it, disable=not verbose) as tepoch:`
                v = item.context_expr
                if isinstance(item.optional_vars, ast.Name) and isinstance(v, ast.Call) and self._off_but_rank0(m, v):
                    out.add(item.optional_vars.id)
        for a in m.nodes:
            if not (isinstance(a, ast.Assign) and len(a.targets) == 1):
                continue
            v, name = a.value, dotted(a.targets[0])
            if isinstance(v, ast.IfExp) and none_or_bare_iterable(v) and self.classify(m, v.test) == "rank0":
                out.add(name)
            elif (isinstance(v, ast.Call) or isinstance(v, ast.IfExp) and isinstance(v.body, ast.Call) and isinstance(
                    v.orelse, ast.Constant) and v.orelse.value is None) and self.kind(m, a) == "rank0" and not any(
                    b is not a and not (isinstance(b.value, ast.Constant) and b.value.value is None) and not (
                        isinstance(b.value, ast.Call) and (self.kind(m, b) == "rank0" or idle_object(
                            self.p, m, b.value)))
                    for b in m.single_assignments(name)
                    if m.enclosing(b) is m.enclosing(a) and not _used_between(m, name, a, b)):
                # (another function's `writer = csv.writer(f)`, or one bound after the object's uses, is another name)
                out.add(name)  # (another arm building it under the same guard, VALL-E's two SummaryWriters, too)
            elif isinstance(v, ast.Call) and self._builds_rank0_writer(m, v):
                out.add(name)
            elif isinstance(v, ast.Call) and self._off_but_rank0(m, v):
                out.add(name)  # `pbar = tqdm(loader, disable=rank != 0)`: only rank 0's bar shows what it is given
            elif isinstance(v, ast.Call) and enabled_on_rank0(self, m, v):
                out.add(name)
        return out - {""}

    def _off_but_rank0(self, m: Module, c: ast.Call) -> bool:
        """`disable=` true on every rank but 0, alone or in an `or` (Transformer-M's `disable=(args.silent or
        local_rank != 0)`: off on the other ranks whatever --silent says)."""
        v = kw(c, "disable")
        return v is not None and any(self.classify(m, x) == "not0" for x in (
            v.values if isinstance(v, ast.BoolOp) and isinstance(v.op, ast.Or) else [v]))

    def _builds_rank0_writer(self, m: Module, c: ast.Call, depth: int = 2) -> bool:
        """`logger = DistSummaryWriter(work_dir)`, or a factory returning one (`logger = get_logger(work_dir,
        cfg)`): a project class whose every own method does its work under a rank-0 test (`def add_scalar(self,
        *a): if can_log(): super().add_scalar(*a)`). Every rank holds the object, but only rank 0's writes."""
        for tm, tf in self.p.resolve(m, c):
            cls = tm.class_of(tf)
            if cls is not None:
                if self._rank0_writer_class(tm, tm.classes[cls]):
                    return True
                continue
            if depth == 0 or not isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            made = {dotted(t): a.value for a in walk(tf) if isinstance(a, ast.Assign)
                    and isinstance(a.value, ast.Call) for t in a.targets}
            rets = [r.value for r in walk(tf) if isinstance(r, ast.Return) and r.value is not None]
            if rets and all(isinstance(r, ast.Call) and self._builds_rank0_writer(tm, r, depth - 1) or
                            dotted(r) in made and self._builds_rank0_writer(tm, made[dotted(r)], depth - 1)
                            for r in rets):
                return True
        return False

    def _rank0_writer_class(self, m: Module, cls: ast.ClassDef) -> bool:
        cache = self.__dict__.setdefault("_writer_classes", {})
        if id(cls) not in cache:
            methods = [d for d in cls.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and not d.name.startswith("_")]
            def rank0_body(fn):
                body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                return len(body) == 1 and isinstance(body[0], ast.If) and not body[0].orelse and \
                    self.classify(m, body[0].test) == "rank0"
            cache[id(cls)] = bool(methods) and all(rank0_body(fn) for fn in methods)
        return cache[id(cls)]

    def _hand_down_objects(self):
        """A rank-0 object handed down: `train_epoch(..., batch_logger, tb_writer)` where every project call passes
        the caller's rank-0 object or None (or leaves the parameter at its default): inside, `if tb_writer is not
        None:` runs on rank 0 alone, as it would in the caller. Two rounds, for a writer handed down twice."""
        for _ in range(2):
            seen: dict[tuple[str, int, str], list[bool]] = {}
            where: dict[tuple[str, int, str], str] = {}
            for m in self.p.modules.values():
                for c in m.calls:
                    passed = [*((i, a) for i, a in enumerate(c.args)), *((k.arg, k.value) for k in c.keywords)]
                    # a value handed over only where rank 0 alone makes the call (`XMemTrainer(config,
                    # save_path=..., logger=logger)` under `if local_rank == 0:`, the other arm leaving both None)
                    at_rank0 = self.kind(m, c) == "rank0"
                    if not at_rank0 and not any(dotted(a) in self.objects[m.rel] for _, a in passed):
                        continue
                    for tm, tf in self.p.resolve(m, c, exact=True):
                        params = [x.arg for x in [*tf.args.posonlyargs, *tf.args.args]]
                        if tm.class_of(tf) and not any(dotted(d) == "staticmethod" for d in tf.decorator_list):
                            params = params[1:]  # self
                        for slot, a in passed:
                            name = params[slot] if isinstance(slot, int) and slot < len(params) else slot
                            if not isinstance(name, str):
                                continue
                            key = (tm.rel, id(tf), name)
                            where[key] = tm.rel
                            # (a constant handed at a rank-0 call is rank 0's only where the others keep None, the
                            # parameter's default: XMem's save_path='out'; CTM's rank-0 `self.save(save_full=False)`,
                            # beside the others' `self.save()` with save_full=True, is a value)
                            seen.setdefault(key, []).append(dotted(a) in self.objects[m.rel] or at_rank0 and not (
                                isinstance(a, ast.Constant) and (a.value is None or not _defaults_none(tf, name))))
            for key, rank0 in seen.items():
                sites = self._sites(key)
                if all(rank0) and all(self._passes_rank0_or_none(key, cm, c) for cm, c in sites) and not all(
                        self.kind(cm, c) == "rank0" for cm, c in sites):
                    # (a function only rank 0 ever calls, AVID's save_checkpoint after CheckpointManager.save's
                    # `if self.rank != 0: return`, gets values, not rank 0's objects: no rank holds None there)
                    self.objects[where[key]].add(key[2])
            for m in self.p.modules.values():  # `self.logger = logger` keeps the handed-down object
                for a in m.nodes:
                    if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.value, ast.Name) and \
                            a.value.id in self.objects[m.rel] and dotted(a.targets[0]):
                        self.objects[m.rel].add(dotted(a.targets[0]))

    def _sites(self, key: tuple[str, int, str]) -> list[tuple[Module, ast.Call]]:
        rel, fid, _ = key
        fn = next((f for f in self.p.modules[rel].functions.values() if id(f) == fid), None)
        # (a nested def a factory returns, IC-GAN's train closure, is no module function: its callers are unknown)
        return self.p.callers(self.p.modules[rel], fn) if fn is not None else []

    def _passes_rank0_or_none(self, key: tuple[str, int, str], cm: Module, c: ast.Call) -> bool:
        """At this call the parameter gets a rank-0 object, None, or nothing (its default)."""
        rel, fid, name = key
        tm = self.p.modules[rel]
        tf = next((f for f in tm.functions.values() if id(f) == fid), None)
        if tf is None:
            return False
        params = [x.arg for x in [*tf.args.posonlyargs, *tf.args.args]]
        if tm.class_of(tf) and not any(dotted(d) == "staticmethod" for d in tf.decorator_list):
            params = params[1:]
        given = [k.value for k in c.keywords if k.arg == name]
        if name in params and params.index(name) < len(c.args):
            given.append(c.args[params.index(name)])
        if any(isinstance(a, ast.Starred) for a in c.args) or any(k.arg is None for k in c.keywords):
            return False  # *args / **kwargs: what lands in the parameter is unknown
        at_rank0 = self.kind(cm, c) == "rank0"
        return all(dotted(a) in self.objects[cm.rel] or isinstance(a, ast.Constant) and a.value is None or at_rank0
                   for a in given)


def _used_between(m: Module, name: str, a: ast.AST, b: ast.AST) -> bool:
    """`name` is read after `a` binds it and before `b` rebinds it (PointNeXt's rank-0 SummaryWriter, used for the
    epoch's scalars, then `writer = csv.writer(f)` for the results table): `b` starts another object."""
    return b.lineno > a.lineno and any(a.lineno < line < b.lineno for line in m.read_lines(name))


def _defaults_none(fn: ast.AST, name: str) -> bool:
    """`name` is a parameter of `fn` whose default is None (what the callers that leave it out hold)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True)) + [
        (p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    return any(p.arg == name and isinstance(d, ast.Constant) and d.value is None for p, d in pairs)

