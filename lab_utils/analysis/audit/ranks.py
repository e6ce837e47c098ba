"""Which code runs on which rank: rank-0 guards (`if rank == 0`, `if RANK in {-1, 0}`, `is_main_process()`, an
early return of the others, guards inside helpers and through callers) and distributed switches (`if ddp:`,
`if args.distributed:`, `if world_size > 1:`), which are true on every rank of a distributed run."""

from __future__ import annotations

import ast
import re

from .files import launch_flags
from .hierarchy import off_the_run
from .project import Module, Project
from .rank0_flags import one_process_test, raised_on_rank0, tuple_flags
from .rank0_objects import Rank0Objects
from .switched_off import cleared_off_rank0, switched_off_elsewhere
from .switches import conjuncts, is_switch_test, launch_switch_function, one_process_arm, set_by_launch, unlaunched
from .syntax import (
    RANK0_NAME,
    RANKISH,
    callee,
    const_value,
    dotted,
    involves_rank,
    is_switch_value,
    kw,
    leaves_block,
    negated,
    others_may_leave,
    walk,
)
from .taint import resolved_past_super


class Guards(Rank0Objects):
    """Which code only rank 0 runs: `if rank == 0`, `if RANK in {-1, 0}`, `if is_main_process()`, the `else` of
    `if rank != 0`, code after `if rank > 0: return`; and the leaky guard `not mp_distributed or rank % n == 0`,
    true on every rank when torchrun starts the job."""

    def __init__(self, project: Project):
        self.p = project
        self.flags: dict[str, set[str]] = {}      # module rel -> names assigned from a rank-0 test
        self.leaky_fns, self.rank0_fns = set(), set()  # names of functions returning a leaky / a rank-0 test
        for m in project.modules.values():
            for f in m.functions.values():
                rets = [r.value for r in ast.walk(f) if isinstance(r, ast.Return) and r.value is not None]
                # `return True` when no group exists (GANgealing's primary(): one process is the main one)
                tests = [r for r in rets if not (isinstance(r, ast.Constant) and r.value is True)]
                if tests and all(self.classify(m, r, shallow=True) == "rank0" for r in tests):
                    self.rank0_fns.add(f.name)
                elif rets and any(self.classify(m, r, shallow=True) == "leaky" for r in rets):
                    self.leaky_fns.add(f.name)
        # names holding a rank test's answer (unpacked from a helper's tuple too) and copies of them: a flag says
        # what its test says (`should_log = self.should_write`), not what a bare rank number would (`if local_rank:`)
        self.flag_kinds: dict[str, dict[str, str]] = {}
        for m in project.modules.values():
            kinds: dict[str, str] = {}
            self.flag_kinds[m.rel] = kinds
            for _ in range(2):
                for a in m.nodes:
                    k = self.classify(m, a.value) if isinstance(a, ast.Assign) else None
                    if k is not None:
                        kinds.update({dotted(t): k for t in a.targets if dotted(t)})
            kinds.update(switched_off_elsewhere(self, m, kinds))
            kinds.update({n: "rank0" for n in [*cleared_off_rank0(self, m, False), *tuple_flags(self, m),
                                               *raised_on_rank0(self, m)] if n not in kinds})
            self.flags[m.rel] = {n for n, k in kinds.items() if k == "rank0"}
        # a base class's `self.verbose` flag holds in its subclasses (VL-T5), and a flag set on an object a helper
        # is handed (`def init_dist(opt): ... opt.log = True`) where its importers test it (`if opt.log:`, HybrIK)
        for m in project.modules.values():
            inherited = {n for n in self.flags[m.rel] if n.startswith("self.")}
            handed = {n for n in self.flags[m.rel] if "." in n and not n.startswith("self.")
                      and any(n.split(".")[0] in {x.arg for x in f.args.args} for f in m.functions.values()
                              if n in {dotted(t) for a in ast.walk(f) if isinstance(a, ast.Assign)
                                       for t in a.targets})}
            for u in project.modules.values():
                if inherited and u is not m and m.rel in project.imports_of(u) and u.classes:
                    self.flags[u.rel] |= {n for n in inherited if n not in self.flag_kinds[u.rel]}
                if handed and u is not m and m.rel in project.imports_of(u):
                    self.flags[u.rel] |= {n for n in handed if n not in self.flag_kinds[u.rel]}
        self._hand_flags_to_callees()
        self.objects: dict[str, set[str]] = {m.rel: self._rank0_objects(m) for m in project.modules.values()}
        self._hand_down_objects()

    def _hand_flags_to_callees(self):
        """A flag set on an object the script hands to a project function (Chinese-CLIP's `args.should_save = ...
        and is_master(args)`, then `train(..., args, ...)`): inside, `if args.should_save:` is rank 0's too."""
        for m in self.p.modules.values():
            rooted = {n for n in self.flags[m.rel] if "." in n and not n.startswith("self.")}
            if not rooted:
                continue
            for c in m.calls:
                passed = [*((i, a) for i, a in enumerate(c.args)), *((k.arg, k.value) for k in c.keywords)]
                handed = [(slot, a.id) for slot, a in passed if isinstance(a, ast.Name)
                          and any(n.split(".")[0] == a.id for n in rooted)]
                for tm, tf in self.p.resolve(m, c, exact=True) if handed else []:
                    params = [x.arg for x in tf.args.args]
                    params = params[1:] if params and params[0] in ("self", "cls") and tm.class_of(tf) else params
                    for slot, root in handed:
                        name = params[slot] if isinstance(slot, int) and slot < len(params) else slot
                        if isinstance(name, str):
                            self.flags[tm.rel] |= {f"{name}.{n.split('.', 1)[1]}" for n in rooted
                                                   if n.split(".")[0] == root} - set(self.flag_kinds[tm.rel])
        for _ in range(2):  # (through `super().__init__(..., save_to_disk, ...)` too)
            self._hand_bare_flags()

    def _hand_bare_flags(self):
        """A flag handed as it is to a project function or class (maskrcnn-benchmark's `save_to_disk = get_rank()
        == 0`, then `DetectronCheckpointer(cfg, model, ..., save_to_disk)`): the parameter, and the attribute its
        body copies it into (`self.save_to_disk = save_to_disk`, then `if not self.save_to_disk: return` in save),
        hold the flag, not a rank number."""
        for m in self.p.modules.values():
            bare = {n for n in self.flags[m.rel] if "." not in n}
            for c in m.calls if bare else []:
                passed = [*enumerate(c.args), *((k.arg, k.value) for k in c.keywords)]
                handed = [(slot, a.id) for slot, a in passed if isinstance(a, ast.Name) and a.id in bare]
                for tm, tf in resolved_past_super(self.p, m, c) if handed else []:
                    params = [x.arg for x in tf.args.args]
                    params = params[1:] if params and params[0] in ("self", "cls") and tm.class_of(tf) else params
                    names = {params[slot] if isinstance(slot, int) and slot < len(params) else slot
                             for slot, _ in handed} & set(params)
                    copies = {dotted(t) for a in walk(tf) if isinstance(a, ast.Assign) and isinstance(
                        a.value, ast.Name) and a.value.id in names for t in a.targets}
                    # (over the taint's reading: a rank *test*'s answer, not the rank number it seemed)
                    self.flags[tm.rel] |= names | copies

    def arm(self, m: Module, a: ast.AST) -> str | None:
        """kind(), and 'not0' for the else arm of a rank-0 test (`if rank == 0: ... else: flag = False`)."""
        k = self.kind(m, a)
        parent = m.parent.get(id(a))
        if k is None and isinstance(parent, ast.If) and any(a is s for s in parent.orelse) \
                and self.classify(m, parent.test) == "rank0":
            return "not0"
        return k

    def classify(self, m: Module, t: ast.AST, shallow: bool = False) -> str | None:
        """'rank0' (the true branch is rank 0 only), 'not0' (it excludes rank 0), 'leaky', or None."""
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Is, ast.Eq)) and isinstance(
                t.comparators[0], ast.Constant) and isinstance(t.comparators[0].value, bool):  # (`... is True`:
            inner = self.classify(m, t.left, shallow)  # Birder's `if is_global_primary(args) is True:`)
            return inner if t.comparators[0].value else {"rank0": "not0", "not0": "rank0"}.get(inner)
        if isinstance(t, ast.IfExp) and const_value(t.body) is True and const_value(t.orelse) is False:
            return self.classify(m, t.test, shallow)  # `main_device = True if rank == 0 else False` (ADAPT)
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.IsNot, ast.Is)) and \
                isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value is None and \
                self.rank0_object(m, dotted(t.left)) and not _a_parameter(m, t, dotted(t.left)):
            # `if writer is not None:` with a rank-0 writer; `if self.save_path is None: return` excludes rank 0
            return "rank0" if isinstance(t.ops[0], ast.IsNot) else "not0"
        if isinstance(t, ast.BoolOp):
            kinds = [self.classify(m, v, shallow) for v in t.values]
            if isinstance(t.op, ast.And):
                return "rank0" if "rank0" in kinds else "not0" if "not0" in kinds else \
                    "leaky" if "leaky" in kinds else None
            launched = [k for v, k in zip(t.values, kinds, strict=True) if not unlaunched(v, self.p)]
            if len(launched) < len(kinds) and launched and all(k == "rank0" for k in launched):
                return "rank0"  # `'RANK' not in os.environ or int(os.environ['RANK']) == 0` (YouReID): a launch
            switches_off = [negated(v) for v in t.values if negated(v) is not None  # sets RANK
                       and not involves_rank(v, m.rank_tainted)]
            if "rank0" in kinds and switches_off and all(set_by_launch(m, v) or self._own_launch_switch(v) or
                                                    self._param_given_switch(m, v) or launch_switch_function(
                                                        self.p, m, v) for v in switches_off):
                # `not is_distributed or rank == 0` with `is_distributed = num_gpus > 1` (from WORLD_SIZE): true
                # in every launched run, so rank 0 alone passes; only a launcher option (`not
                # args.multiprocessing_distributed or ...`, off under torchrun) leaks
                return "rank0"
            if "rank0" in kinds and switches_off:
                return "leaky"
            return "rank0" if "rank0" in kinds and all(k == "rank0" or one_process_test(self.p, v) for k, v in zip(
                kinds, t.values, strict=True)) else "leaky" if "leaky" in kinds or "rank0" in kinds else None
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            inner = self.classify(m, t.operand, shallow)
            if inner is None and involves_rank(t.operand, m.rank_tainted) and isinstance(
                    t.operand, (ast.Name, ast.Attribute, ast.Call)) and not RANK0_NAME.search(dotted(t.operand)):
                return "rank0"  # `if not rank:`
            return {"rank0": "not0", "not0": "rank0"}.get(inner)
        if isinstance(t, ast.Compare) and len(t.ops) == 1:
            left, op, right = t.left, t.ops[0], t.comparators[0]
            if isinstance(left, ast.Constant) and not isinstance(right, ast.Constant):
                left, right = right, left
                op = {ast.Gt: ast.Lt(), ast.Lt: ast.Gt(), ast.GtE: ast.LtE(), ast.LtE: ast.GtE()}.get(type(op), op)
            if re.search(r"device", dotted(left).split(".")[-1]) and const_value(right.args[0] if isinstance(
                    right, ast.Call) and callee(right) == "device" and right.args else right) == "cuda:0":
                # `device == torch.device('cuda:0')`, a rank's own device (BISS): the first GPU's process
                return {ast.Eq: "rank0", ast.NotEq: "not0"}.get(type(op))
            if not involves_rank(left, m.rank_tainted) or isinstance(left, ast.Call) and callee(left) == "len":
                return None  # (a length is no rank: HydraGNN's `if len(true_values[0]) > 0:`)
            counted = [dotted(n).split(".")[-1] for n in ast.walk(left.left) if isinstance(n, (
                ast.Name, ast.Attribute))] if isinstance(left, ast.BinOp) else []
            if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod) and (isinstance(
                    left.left, ast.Attribute) and not RANKISH.search(left.left.attr) or any(
                    re.search(r"step|iter|batch|epoch|count", n) for n in counted) and not any(
                    RANKISH.search(n) for n in counted) and (re.search(r"freq|interval|every|period|iters|steps",
                                                                        dotted(left.right)) or isinstance(
                        left.left, ast.BinOp) and not involves_rank(left.right, m.rank_tainted))):  # (StudioGAN's
                # `(d_updates * current_step + step_index) % d_reg_interval == 0`: step counts, whatever the divisor)
                return None  # `logger.iters % hps.save_iters == 0` (Jukebox), `batch_num % args.save_freq` (ml-mdm,
                # whose batch_num the rank-tainted data partition reaches): a step count, not the rank
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Set, ast.Tuple, ast.List)):
                has0 = any(isinstance(e, ast.Constant) and e.value in (0, '0') for e in right.elts)  # (`in ['0']`)
                if has0:
                    return "rank0" if isinstance(op, ast.In) else "not0"
                return None
            if isinstance(right, (ast.Name, ast.Attribute)) and MAIN_RANK.search(dotted(right).split(".")[-1]) or \
                    isinstance(right, ast.Name) and _module_zero(m, right.id):
                right = ast.Constant(0)  # `dist.get_rank() != self.main_gpu` (IDDM): the main process's rank; a
                # module constant (LMP's `HOST_RANK: Final[int] = 0`, then `if args.rank == HOST_RANK:`)
            if isinstance(right, ast.Constant) and right.value == "0":
                right = ast.Constant(0)  # `self.rank == '0'`, the RANK variable's text (YouReID's Logger)
            if not (isinstance(right, ast.Constant) and isinstance(right.value, (int, float))):
                return None
            v = right.value
            if isinstance(op, (ast.Eq, ast.Is)) and v == 0 or isinstance(op, ast.Lt) and v == 1 or \
                    isinstance(op, ast.LtE) and v == 0:
                return "rank0"
            if isinstance(op, (ast.NotEq, ast.IsNot)) and v == 0 or isinstance(op, ast.Gt) and v == 0 or \
                    isinstance(op, ast.GtE) and v == 1:
                return "not0"
            return None
        if isinstance(t, ast.Call):
            name = callee(t)
            if not shallow and name in self.leaky_fns:
                return "leaky"
            if RANK0_NAME.search(name) or (not shallow and name in self.rank0_fns):
                return "rank0"
            return None
        if isinstance(t, (ast.Name, ast.Attribute)):
            name = dotted(t)
            if name in getattr(self, "objects", {}).get(m.rel, ()):
                return "rank0"
            if RANK0_NAME.search(name.split(".")[-1]) or (not shallow and name in self.flags.get(m.rel, ())):
                return "rank0"
            if not shallow and name in getattr(self, "flag_kinds", {}).get(m.rel, {}):
                return self.flag_kinds[m.rel][name]
            if not shallow and isinstance(t, ast.Name) and self._param_given_rank0(m, t):
                return "rank0"  # (a parameter handed `rank == 0` is tainted by the rank, but no rank number)
            if involves_rank(t, m.rank_tainted) and not RANK0_NAME.search(name) and not _periodic(m, name):
                return "not0"  # `if local_rank:` is true on every rank but 0
        return None

    def _own_launch_switch(self, flag: ast.AST) -> bool:
        """`args.multi_gpu` in `not args.multi_gpu or rank == 0` when the project itself starts its ranks, or wraps
        its model in DDP, only under that flag (`if args.multi_gpu: mp.spawn(...)`, SAM-Med3D): with the flag off
        the run is one process, so the guard is rank 0's in every run the script starts (a torchrun launch
        without the flag, the leak, is not how it runs)."""
        attr = dotted(flag).split(".")[-1]
        cache = self.__dict__.setdefault("_launch_cache", {})
        if attr not in cache:  # (or a flag the project's launch scripts pass: ProVLAE's `--distributed`)
            if "_launch_flags" not in self.__dict__:  # (read once: every script of the project)
                self.__dict__["_launch_flags"] = launch_flags(self.p.root) if self.p.on_disk else set()
            passed = self.__dict__["_launch_flags"]
            cache[attr] = bool(attr) and attr in passed or bool(attr) and any(
                isinstance(n, ast.If) and attr in conjuncts(n.test) and any(
                    isinstance(c, ast.Call) and (callee(c) == "spawn" or "DistributedDataParallel" in dotted(c.func)
                                                 or callee(c) == "DDP") for s in n.body for c in ast.walk(s))
                for mm in self.p.modules.values() for n in mm.nodes)
        return cache[attr]

    def _param_given_rank0(self, m: Module, t: ast.Name) -> bool:
        """`t` is a parameter every project caller hands a rank-0 test (`train_network(loader, verbose=(args.gpu
        == 0))`, voxceleb_trainer): inside, it is true on rank 0 alone."""
        return self._param_given(m, t, lambda cm, g: self.classify(cm, g, shallow=True) == "rank0")

    def _param_given_switch(self, m: Module, t: ast.AST) -> bool:
        """`t` is a parameter every caller hands a distributed switch the launch sets (`train_one_epoch(...,
        distributed=(args.local_rank != -1))`, OpenDCVC): `not distributed or rank == 0` is rank 0's guard."""
        return isinstance(t, ast.Name) and self._param_given(
            m, t, lambda cm, g: set_by_launch(cm, g) or is_switch_value(g))

    def _param_given(self, m: Module, t: ast.Name, holds) -> bool:
        fn = m.enclosing(t)
        names = [a.arg for a in fn.args.args] if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if t.id not in names:
            return False
        cache = self.__dict__.setdefault("_param_cache", {})
        key = (m.rel, id(fn), t.id, holds.__code__)
        if key not in cache:
            cache[key] = False  # (a recursive question answers no)
            i = names.index(t.id) - (1 if names[0] in ("self", "cls") else 0)
            sites = self.p.callers(m, fn)
            given = [(cm, next((k.value for k in c.keywords if k.arg == t.id),
                               c.args[i] if 0 <= i < len(c.args) else None)) for cm, c in sites]
            cache[key] = bool(sites) and all(g is not None and holds(cm, g) for cm, g in given)
        return cache[key]

    def kind(self, m: Module, node: ast.AST) -> str | None:
        """'rank0' when only rank 0 runs `node` within its function, 'leaky' when its guard is leaky,
        'not0' when rank 0 never runs it, None when every rank does."""
        child, n = node, m.parent.get(id(node))
        while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            if isinstance(n, ast.If):
                k = self.classify(m, n.test)
                in_body = any(child is s for s in n.body)
                if k == "rank0" and in_body or k == "not0" and not in_body and any(child is s for s in n.orelse):
                    return "rank0"
                if k == "not0" and in_body:
                    return "not0"
                if k == "leaky" and in_body:
                    return "leaky"
            if isinstance(n, ast.IfExp) and child is n.body and self.classify(m, n.test) in ("rank0", "leaky"):
                return self.classify(m, n.test)  # `self.logger.info(msg) if self.local_master else None` (PICK)
            body = getattr(n, "body", None)
            if isinstance(body, list) and any(child is s for s in body):
                exited = self._after_early_exit(m, body, child)
                if exited:
                    return exited
            child, n = n, m.parent.get(id(n))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            exited = self._after_early_exit(m, n.body, child)
            if exited:
                return exited
            if n.decorator_list and self._rank0_decorated(m, n):
                return "rank0"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                dotted(node.func.value) in getattr(self, "objects", {}).get(m.rel, ()) and \
                not self._bound_here_for_every_rank(m, node.func.value, node):
            return "rank0"  # writer.add_scalar(...) on the writer only rank 0 holds
        return None

    def _bound_here_for_every_rank(self, m: Module, held: ast.AST, node: ast.AST) -> bool:
        """A name this function binds to a bar every rank shows, another's of that name rank 0's (UVC's tqdm)."""
        binds = [a for a in m.single_assignments(held.id) if m.enclosing(a) is m.enclosing(node)] if isinstance(
            held, ast.Name) else []
        others = {callee(a.value) for a in binds and m.single_assignments(held.id) if isinstance(
            a.value, ast.Call) and self._off_but_rank0(m, a.value)}
        return bool(binds) and all(isinstance(a.value, ast.Call) and callee(a.value) in others and kw(
            a.value, "disable") is None and self.kind(m, a) != "rank0" for a in binds)

    def _rank0_decorated(self, m: Module, fn: ast.AST) -> bool:
        """`@master_only` / `@main_process` / `@rank_zero_only`, or a project decorator whose wrapper calls the
        function only on rank 0 (SALMONN's `def main_process(func): ... if rank == 0: return func(*args)`), or one
        the class body defines (SMDE's `def _parallel_mask(func)`, whose inner calls it `if self.rank_id == 0:`)."""
        for d in fn.decorator_list:
            if RANK0_NAME.search(dotted(d.func if isinstance(d, ast.Call) else d).split(".")[-1]):
                return True
            cls = m.classes.get(m.class_of(fn) or "") if isinstance(d, ast.Name) else None  # (or one in the class
            own = [(m, x) for x in getattr(cls, "body", []) if getattr(x, "name", "") == d.id]  # body: SMDE's mask)
            for dm, dfn in own or self.p.resolve(m, ast.Call(func=d, args=[], keywords=[])):
                first = dfn.args.args[0].arg if dfn.args.args else None
                if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == first and
                       self.kind(dm, c) == "rank0" for c in ast.walk(dfn)):
                    return True
        return False

    def _after_early_exit(self, m: Module, body: list, child: ast.AST) -> str | None:
        """`if rank != 0: return` (or continue, or raise) earlier in the same block: the rest is rank 0's alone
        ('rank0'); `if self.rank == 0: return` (timer's HiddenPrints.__enter__): the rest is the other ranks'
        ('not0')."""
        for s in body:
            if s is child:
                return None
            if self._only_rank0_goes_on(m, s):
                return "rank0"
            # (or a raise under a plain rank test, ACE's `if not dist.is_root(): raise`; under a compound one it
            # guards a misuse, CleanUNet's `if num_gpus == 1 and args.rank != 0:`, or ODTK's divergence: no split)
            if isinstance(s, ast.If) and s.body and (isinstance(s.body[-1], (ast.Return, ast.Continue, ast.Break))
                                                     or isinstance(s.body[-1], ast.Raise)
                                                     and not isinstance(s.test, ast.BoolOp)):
                k = self.classify(m, s.test)
                if k in ("rank0", "not0") and not (isinstance(s.test, ast.BoolOp) and isinstance(s.test.op, ast.And)
                                                    and any(not self.classify(m, v) and not is_switch_test(v)
                                                            for v in s.test.values)):
                    # (`if args.eval_first and is_main_process(): ...; return`, ODLab's FCOS: past it every rank
                    # goes on whenever the option is off; only a test of the rank alone splits the ranks)
                    return "rank0" if k == "not0" else "not0"
                # `if args.rank != 0 or epoch % freq != 0: return` (VICRegL): past it every operand was false
                if isinstance(s.test, ast.BoolOp) and isinstance(s.test.op, ast.Or):
                    kinds = {self.classify(m, v) for v in s.test.values}
                    named = any(self.classify(m, v) == "not0" and involves_rank(v) for v in s.test.values)
                    if named and "rank0" not in kinds:  # (a rank named in the test itself, not a tainted flag)
                        return "rank0"
        return None

    def _only_rank0_goes_on(self, m: Module, s: ast.AST) -> bool:
        """`if rank == 0: loss = stats[0] / world_size` `else: continue` (adaptive-span's reduced losses): past `s`
        only rank 0 goes on; so too when that if sits in the distributed switch (`if distributed: ...`), whose
        other arm is the run of one process."""
        if not others_may_leave(s):  # (the shape first: this is asked of every statement before a finding)
            return False
        if leaves_block(s.orelse) and not leaves_block(s.body) and self.classify(m, s.test) == "rank0":
            return True
        return not s.orelse and is_switch_test(s.test) and not self.classify(m, s.test) and any(
            self._only_rank0_goes_on(m, x) for x in s.body)

    def effective(self, m: Module, node: ast.AST, depth: int = 3) -> str | None:
        """kind() through the callers: a function called only under a rank-0 guard runs on rank 0 only. Asked
        once per (node, depth): a helper that many functions call, each called from many places (OpenOOD's
        trainers and evaluators), would otherwise be asked again along every path, for minutes."""
        if getattr(self.p, "_callers_index", None) is None:
            return self._effective(m, node, depth)  # (the callers still being indexed: a partial answer)
        memo = self.__dict__.setdefault("_effective_memo", {})
        if (id(node), depth) not in memo:
            memo[id(node), depth] = self._effective(m, node, depth)
        return memo[id(node), depth]

    def _effective(self, m: Module, node: ast.AST, depth: int) -> str | None:
        k = self.kind(m, node)
        if k or depth == 0:
            return k
        fn = m.enclosing(node)
        if fn is None:
            return None
        sites = self.p.callers(m, fn)
        if not sites:
            return None
        each = [(cm, c, self.effective(cm, c, depth - 1)) for cm, c in sites]  # (once each: asked again below,
        kinds = {k for _, _, k in each}  # the recursion would double at every level)
        if kinds != {"rank0"} and len(sites) > 1:  # callers the run never reaches do not count: a base class's
            # method every subclass it builds replaces, a class nothing names (XNAS's Trainer.saving, called
            # unguarded by the base train_epoch that BigNASTrainer replaces, and by DartsTrainer; a one-process arm)
            kinds = {k for cm, c, k in each if not off_the_run(self.p, cm, c) and not one_process_arm(cm, c)} or kinds
        if kinds == {"rank0"}:
            return "rank0"
        if "leaky" in kinds and kinds <= {"rank0", "leaky"}:
            return "leaky"
        return None


# the name of the main process's rank compared with the rank (`main_gpu`, `master_rank`, `main_process_rank`;
# DiffCardGCN's `reduce_rank`, the rank its reductions go to and its logs print from)
MAIN_RANK = re.compile(r"^(main|master|root|reduce|leader)_(gpu|rank|process|process_rank|device)$", re.I)


def _a_parameter(m: Module, t: ast.AST, name: str) -> bool:
    """`name` is a parameter of the function around `t` that the function itself rebinds (SoftGroup's
    `collect_results_cpu(..., tmpdir=None)`, whose `if tmpdir is None:` asks what the caller passed, though rank 0
    fills it in below): no rank-0 object. (A writer handed down and only tested, icefall's tb_writer, still is.)"""
    fn = m.enclosing(t)
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in {
        a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]} and any(
        isinstance(a, ast.Assign) and any(dotted(x) == name for x in a.targets) for a in walk(fn))


def _periodic(m: Module, name: str) -> bool:
    """`log_input_output = (logger.iters % hps.save_iters == 0)`: a flag of a step count, not of the rank."""
    index = m.__dict__.get("_assigned_values")
    if index is None:  # (asked for every rank-like name a test reads: the module's assignments, indexed once)
        index = m.__dict__["_assigned_values"] = {}
        for a in m.nodes:
            if isinstance(a, ast.Assign):
                for t in a.targets:
                    index.setdefault(dotted(t), []).append(a.value)
    values = index.get(name, [])
    return bool(values) and all(isinstance(v, ast.Compare) and (not involves_rank(v.left, m.rank_tainted) or isinstance(
        v.left, ast.BinOp) and isinstance(v.left.op, ast.Mod) and isinstance(v.left.left, ast.Attribute)
        and not RANKISH.search(v.left.left.attr)) for v in values)  # (or `(i == 0)`, the first batch)


def _module_zero(m: Module, name: str) -> bool:
    """`name` is a module constant bound to the int 0 (`HOST_RANK: Final[int] = 0`)."""
    return any(isinstance(a, (ast.Assign, ast.AnnAssign)) and repr(const_value(a.value)) == "0" and name in {
        dotted(x) for x in (a.targets if isinstance(a, ast.Assign) else [a.target])} for a in m.tree.body)
