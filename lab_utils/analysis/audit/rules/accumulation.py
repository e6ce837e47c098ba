"""Chapter 06 (gradient accumulation): micro-batches that all-reduce on every backward (no no_sync), and a per-GPU
batch and accumulation count both divided by the world size. Where a run accumulates: a step every N micro-batches,
or an inner loop of micro-batches before one step, with the count's default in the default run."""

from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..hierarchy import replaced_where_built
from ..project import Module
from ..registry import Hit, rule
from ..scripts import script_value
from ..syntax import (
    ACCUMISH,
    BATCHISH,
    WORLDISH,
    callee,
    const_str,
    dotted,
    involves,
    kw,
    walk,
)


def _steps(c: ast.AST) -> bool:
    """An optimizer step however it is spelt: `optimizer.step()`, `scaler.step(opt)`, a custom `optimizer_step(...)`,
    a loss-scaler helper told when to update (`loss_scaler(loss, opt, update_grad=...)`)."""
    # (... or a step that also moves the lr: `ScheduledOptim.step_and_update_lr()`, R-ESM's step_and_lr_schedule)
    return isinstance(c, ast.Call) and (callee(c) == "step" or callee(c).endswith("optimizer_step")
                                        or callee(c).startswith("step_and_")
                                        or any(k.arg == "update_grad" for k in c.keywords)
                                        or callee(c).endswith("_step") and any(  # UniTabE's bp_step(optimizer)
                                            "optim" in dotted(a).lower() for a in c.args))


def _stepped(c: ast.Call) -> str:
    """What a step call steps: `optim_g` for `optim_g.step()` or `scaler.step(optim_g)`; '' when it cannot tell."""
    if callee(c) == "step" and isinstance(c.func, ast.Attribute) and re.search(r"scaler", dotted(c.func.value), re.I):
        return dotted(c.args[0]) if c.args else ""
    return dotted(c.func.value) if isinstance(c.func, ast.Attribute) else ""


SCHEDULER = re.compile(r"[Ss]chedul|LR|Warmup")  # StepLR, OneCycleLR, PolynomialLRWarmup, CosineScheduler


def _scheduler_step(m: Module, c: ast.Call) -> bool:
    """`lr_scheduler.step()`: a learning-rate schedule advancing, no optimizer step (no parameter moves, so it
    says nothing about where gradients stop accumulating). The receiver is named like one, or built by a
    scheduler class (`sched = PolynomialLRWarmup(optimizer=opt, ...)`, `torch.optim.lr_scheduler.StepLR`)."""
    if not (isinstance(c.func, ast.Attribute) and c.func.attr == "step"):
        return False
    owner = dotted(c.func.value)
    if owner and re.search(r"sched", owner.split(".")[-1], re.I):
        return True
    return any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and owner in {dotted(t) for t in a.targets}
               and ("lr_scheduler" in dotted(a.value.func) or SCHEDULER.search(callee(a.value)))
               for a in m.nodes)


def _backward_each_iteration(loop: ast.AST, gate: ast.If | None = None) -> bool:
    """A backward in the loop, outside `gate`'s body: with every backward under the step's own gate
    (Openpilot-Deepdive sums the loss over `optimize_per_n_step` steps and runs one backward before the step), the
    loss accumulates, not the gradients, and nothing all-reduces between steps."""
    inside = {id(x) for s in gate.body for x in ast.walk(s)} if gate is not None else set()
    # (or a backward helper handed the loss: UniTabE's `self.backward_loss(loss)`, R-ESM's
    # `training_scheduler.loss_scale_and_backward(loss)`)
    return any(isinstance(c, ast.Call) and id(c) not in inside and (
        callee(c) == "backward" or "scaler" in callee(c).lower() or re.search(
            r"(^|_)backward(_|$)", callee(c)) and any("loss" in dotted(a).lower() for a in c.args)) for c in walk(loop))


def _counts_micro_batches(test: ast.AST) -> bool:
    """A step gate that counts micro-batches, however it is written: `(i + 1) % accum == 0`, or YOLOv5's
    `ni - last_opt_step >= accumulate` (a comparison against the accumulation count)."""
    return any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mod) for b in ast.walk(test)) or any(
        isinstance(c, ast.Compare) and any(involves(x, ACCUMISH) for x in (c.left, *c.comparators))
        and not any(isinstance(o, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for o in c.ops)
        and not all(isinstance(x, ast.Constant) for x in c.comparators)  # (`if n_accum > 0:`, a flush of the rest)
        for c in ast.walk(test))


def _accumulation_steps(f: Facts, m: Module) -> list[ast.AST]:
    """Where a loop steps the optimizer only every N-th backward: `if (i + 1) % accum == 0: opt.step()`, a
    loss-scaler helper given `update_grad=(i + 1) % accum == 0`, whatever the counter is called; or the
    accumulation count used by name (`loss / accum_steps`)."""
    out = []
    loops = [n for n in m.nodes if isinstance(n, (ast.For, ast.While))]
    # ... or a step function an engine calls once per micro-batch (ignite's `def update(engine, batch)`, gated by
    # `engine.state.iteration % accum`), with no loop of its own around the backward
    loops += [fn for fn in m.functions.values() if not any(isinstance(x, (ast.For, ast.While)) and any(
        isinstance(b, ast.Call) and callee(b) == "backward" for b in ast.walk(x)) for x in walk(fn))]
    for loop in loops:
        if not _backward_each_iteration(loop):
            continue
        gated = [n for n in walk(loop) if isinstance(n, ast.If) and _counts_micro_batches(n.test)
                 and any(_steps(c) and not _scheduler_step(m, c) for s in n.body for c in ast.walk(s))
                 and _backward_each_iteration(loop, n)]
        # (a flush of the micro-batches left at the epoch's end, `if n_accumulate_bp > 0: step`, is gated too)
        flushes = [n for n in walk(loop) if isinstance(n, ast.If) and involves(n.test, ACCUMISH)]
        inside = {id(c) for g in [*gated, *flushes] for s in g.body for c in ast.walk(s)}
        # (the other arm of `if args.accu_grad: <gated steps> else: <a step each batch>`, ClearerVoice's: the
        # run takes one arm, and the accumulating one is judged; under `if ACCUMULATION_STEPS > 1:`, Swin's, only
        # when a launch script passes a count above one, HashTrans's `--accumulation-steps 2`)
        inside |= {id(c) for n in walk(loop) if isinstance(n, ast.If) and (
            not isinstance(n.test, ast.Compare) or _script_count_above_one(f)) and any(
            g is x for s in n.body for x in ast.walk(s) for g in gated) for s in n.orelse for c in ast.walk(s)}
        free = {_stepped(c) for c in walk(loop) if _steps(c) and id(c) not in inside and not any(
            k.arg == "update_grad" for k in c.keywords) and not _scheduler_step(m, c)}
        # every step of the loop is gated: it accumulates; or one optimizer's steps are, while another (a GAN's
        # discriminator, so-vits-svc's optim_d) steps every micro-batch
        held = [g for g in gated if any(_steps(c) and not _scheduler_step(m, c) and _stepped(c) not in free and (
            not free or re.search(r"optim|opt\b", _stepped(c), re.I)) for s in g.body for c in ast.walk(s))]
        if held and (not free or "" not in free):
            out += [g.test for g in held]  # (each gate: the run takes one, SLAM-LLM's fp16 arm or the plain one)
        for n in walk(loop):
            if isinstance(n, ast.Call) and any(k.arg == "update_grad" and any(
                    isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mod) for b in ast.walk(k.value))
                    for k in n.keywords):
                out.append(n)
    out += _inner_micro_batch_loops(m, loops)
    if not out and any(isinstance(c, ast.Call) and callee(c) == "backward" for c in m.calls):
        # the count used by name in a module that runs backward (`loss / accum_steps`); a string formatted with
        # it (`"%d" % args.accum_iter`) is no arithmetic
        out = [n for n in m.nodes if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mod, ast.Div))
               and involves(n.right, ACCUMISH) and not isinstance(n.left, (ast.Constant, ast.JoinedStr))]
    return sorted(out, key=lambda n: n.lineno)


def _script_count_above_one(f: Facts) -> bool:
    return any(ACCUMISH.search(k) and script_value(f, k) not in (None, "0", "1")
               for k in f._passed_in_launch_scripts())


def _inner_micro_batch_loops(m: Module, loops: list) -> list[ast.AST]:
    """An inner loop that runs backward on every pass and never steps, inside an outer loop that steps once after it
    (I2SB: `for _ in range(n_inner_loop): ... loss.backward()`, then `optimizer.step()` per iteration): the inner
    loop's passes are micro-batches accumulated into one step. Its `for` line."""
    out = []
    for outer in (x for x in loops if isinstance(x, (ast.For, ast.While))):
        for inner in outer.body:
            if not isinstance(inner, ast.For) or not any(
                    isinstance(c, ast.Call) and callee(c) == "backward" for c in ast.walk(inner)) or any(
                    _steps(c) for c in ast.walk(inner)):
                continue
            after = [c for s in outer.body if s.lineno > inner.lineno for c in ast.walk(s)]
            if any(_steps(c) and not _scheduler_step(m, c) for c in after) and _draws_data(inner) and not any(
                    isinstance(w, ast.With) and any("sync" in dotted(i.context_expr.func if isinstance(
                        i.context_expr, ast.Call) else i.context_expr) for i in w.items) for w in ast.walk(inner)):
                out.append(inner)  # (EDM's `with misc.ddp_sync(ddp, last_round):` is its own no_sync)
    return out


def _draws_data(loop: ast.For) -> bool:
    """Each pass takes new data: `next(it)`, a batch-loading call (`self.sample_batch(...)`), or a slice the loop
    variable picks (`all_inds[j::accum]`, VoiceCraft). AttentiveNAS's loop over subnets trains each on the same
    batch: no micro-batches."""
    var = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    return any(isinstance(c, ast.Call) and (callee(c) == "next" or re.search(r"batch|load|fetch", callee(c)))
               for c in walk(loop)) or any(isinstance(x, ast.Subscript) and any(
                   isinstance(n, ast.Name) and n.id in var for n in ast.walk(x.slice)) for x in walk(loop))


def _under_count_above_one(f: Facts, m: Module, node: ast.AST) -> bool:
    """`node` sits under `if args.gradient_accumulation_steps > 1:` (or `!= 1`, `>= 2`) and the option defaults
    to 1 (VL-T5): the default run steps every micro-batch."""
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        t = n.test if isinstance(n, ast.If) else None
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.left, ast.Attribute) and \
                involves(t.left, ACCUMISH) and isinstance(t.comparators[0], ast.Constant) and (
                isinstance(t.ops[0], (ast.Gt, ast.NotEq)) and t.comparators[0].value == 1 or
                isinstance(t.ops[0], ast.GtE) and t.comparators[0].value == 2):
            if (_option_defaults_to_one(f, t.left.attr) or f.default_value(m, t.left) in (0, 1)) and \
                    script_value(f, t.left.attr) in (None, "0", "1"):
                return True  # (GroupViT's `accumulation_steps: 0` in its default YAML; unless a launch script
                # passes more, HashTrans's `--accumulation-steps 2`)
        n = m.parent.get(id(n))
    # the step gate itself counts with such an option: `if (step + 1) % args.gradient_accumulation_steps == 0:`
    # (CLIP4Clip) steps every micro-batch in the default run
    # and so does a loss divided by it (`_lm_loss / args.grad_acc`, LoRA's gpt2_ft), or by a local
    # or a parameter that holds it (AudioMAE's `accum_iter = args.accum_iter`, MSST's count from a YAML key set to 1)
    def one(x):  # (whatever the count is called, a default of 1 steps every micro-batch: DynamicViT's
        # update_freq, TadTR's iter_size; unless a launch script passes another: UniTS's `--acc_it 32`)
        fed = [x] + [a.value for a in m.nodes if isinstance(a, ast.Assign) and isinstance(x, ast.Name) and any(
            isinstance(t, ast.Name) and t.id == x.id for t in a.targets)]  # (`acc_it = self.args.acc_it`)
        passed = ({a.attr for v in fed for a in ast.walk(v) if isinstance(a, ast.Attribute)} | (
            {x.id} if isinstance(x, ast.Name) and ACCUMISH.search(x.id) else set())) & f._passed_in_launch_scripts()
        if passed:  # the scripts' value decides (LEAD passes --gradient_accumulation_steps 1)
            return all(script_value(f, a) == "1" for a in passed)
        # (`self.config['runner'].get('gradient_accumulate_steps')`, the key set to 1 in every YAML: s3prl; a key the
        # step's own modulus reads, whatever its name: GETMusic's `op_sc['optimizer']['step_iteration']`, 1)
        keys = {const_str(v.args[0]) if isinstance(v, ast.Call) and v.args else const_str(v.slice) for v in fed
                if isinstance(v, ast.Call) and callee(v) == "get" or isinstance(v, ast.Subscript)}
        fn = m.enclosing(x)
        if isinstance(x, ast.Name) and fn is not None and x.id in {a.arg for a in fn.args.args}:
            if _parameter_one(f, m, fn, x.id):
                return True
            if _handed(f, m, fn, x.id):
                return False  # its callers decide, not its default (TimeChat's runner hands 4 from its YAML)
        return involves(x, ACCUMISH) and isinstance(x, ast.Attribute) and (_option_defaults_to_one(
            f, x.attr) or f.json_option_value(x.attr) == 1) \
            or f.default_value(m, x) == 1 or any(k and (ACCUMISH.search(k) or isinstance(x, ast.Subscript))
                                                     and f._yaml_value(k) == 1 for k in keys) \
            or isinstance(x, ast.Name) and _parameter_one(f, m, m.enclosing(x), x.id)
    # ... or compares a counter with it (Pointcept: `self._counter >= self.cfg.gradient_accumulation_steps`)
    return any(isinstance(b, ast.BinOp) and isinstance(b.op, (ast.Mod, ast.Div)) and one(b.right)
               or isinstance(b, ast.Compare) and any(one(x) for x in b.comparators) for b in ast.walk(node))


def _parameter_one(f: Facts, m: Module, fn: ast.AST | None, name: str, depth: int = 3) -> bool:
    """`name` is a parameter of `fn` that holds 1 in the default run: every call seen passes 1 (a value that is 1
    by default, or a parameter of its own that is so) or leaves it out where it defaults to 1; with no call seen,
    its default decides (MiniGPT-4's `_train_inner_loop(..., accum_grad_iters=1)`, handed train_epoch's
    `accum_grad_iters=1`, which the runner, through a task its registry builds, hands `self.accum_grad_iters`)."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth == 0:
        return False
    args = fn.args.args
    default = dict(zip([a.arg for a in args][len(args) - len(fn.args.defaults):], fn.args.defaults,
                       strict=True)).get(name)
    default_one = isinstance(default, ast.Constant) and default.value == 1
    names = [a.arg for a in args if a.arg not in ("self", "cls")]
    if name not in names:
        return False
    position = names.index(name)
    sites = f.p.callers(m, fn) or [  # (a method of an object the project builds by name: `self.task.train_epoch(
        (cm, c) for cm in f.p.modules.values() for c in cm.calls  # ...)` on TimeChat's registry-built task)
        if m.class_of(fn) and isinstance(c.func, ast.Attribute) and c.func.attr == fn.name and not f.p.resolve(cm, c)]
    if not sites:
        return default_one
    for cm, c in sites:
        given = kw(c, name) or (c.args[position] if len(c.args) > position else None)
        if given is None and (any(k.arg is None for k in c.keywords) or not default_one):
            return False  # (`**config`: the key may be in it)
        if given is not None and not (isinstance(given, ast.Name) and _parameter_one(
                f, cm, cm.enclosing(c), given.id, depth - 1) or f.default_value(cm, given) == 1):
            return False
    return True


def _handed(f: Facts, m: Module, fn: ast.AST, name: str) -> bool:
    """Some call of `fn` (or of a method of its name on an object these files cannot type) passes `name`."""
    names = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
    sites = f.p.callers(m, fn) or [(cm, c) for cm in f.p.modules.values() for c in cm.calls if m.class_of(fn) and
                                   isinstance(c.func, ast.Attribute) and c.func.attr == fn.name]
    return any(kw(c, name) is not None or len(c.args) > names.index(name) for _, c in sites)


def _option_defaults_to_one(f: Facts, attr: str) -> bool:
    """Every add_argument of --attr in the project defaults to 1."""
    defaults = [kw(c, "default") for mm in f.p.modules.values() for c in mm.calls
                if callee(c) == "add_argument" and any(
                    (const_str(a) or "").lstrip("-").replace("-", "_") == attr for a in c.args)]
    defaults += f.config_defaults(attr)  # `gradient_accumulation_steps = 1` in a Python config file (Pointcept)
    return bool(defaults) and all(isinstance(d, ast.Constant) and d.value == 1 for d in defaults)


def _and_flag(f: Facts, m: Module, node: ast.AST) -> bool:
    """`node` is one operand of `flag and ...` (inside the same expression) where flag is off unless given; or
    node is the whole test, `flag and (j + 1) % accum == 0 or not flag` (DLRM: every micro-batch steps unless
    the flag is given)."""
    flags = f.store_true_flags()
    if any(isinstance(n, ast.BoolOp) and isinstance(n.op, ast.And) and any(
            isinstance(v, ast.Attribute) and v.attr in flags for v in n.values) and any(
            isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mod) for b in ast.walk(n)) for n in ast.walk(node)):
        return True
    n = m.parent.get(id(node))
    while isinstance(n, (ast.BoolOp, ast.Compare, ast.BinOp, ast.UnaryOp)):
        if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.And) and any(
                isinstance(v, ast.Attribute) and v.attr in flags for v in n.values):
            return True
        n = m.parent.get(id(n))
    return False


@rule("accumulation-without-no-sync", "06_accumulation", "gradient accumulation under DDP without no_sync: every "
      "micro-batch all-reduces, N-1 extra all-reduces a step")
def accumulation_without_no_sync(f: Facts, m: Module):
    if {"no_sync", "require_backward_grad_sync"} & f.all_names():
        yield from _forward_outside_no_sync(f, m)
        return
    if not m.entry and not any(m.rel in f.p.imports_of(e) for e in f.p.modules.values() if e.entry):
        return  # a library no audited script runs
    # accumulation only under a flag that is off unless given (DLRM: `args.mlperf_logging and (j + 1) %
    # args.mlperf_grad_accum_iter == 0`): the default run steps every micro-batch
    steps = [s for s in _accumulation_steps(f, m) if not f.off_by_default(m, s) and not _and_flag(f, m, s)
             and not _under_count_above_one(f, m, s) and not replaced_where_built(f.p, m, m.enclosing(s))]
    if not steps or _gradients_synced_by_hand(f):
        return
    # one finding per function that accumulates: each loop needs its own no_sync (FreeYOLO's warm-up loop and
    # its epoch loop, copies of each other)
    firsts = {}
    for s in steps:
        firsts.setdefault(id(m.enclosing(s)), s)
    for first in firsts.values():
        text = ast.unparse(first).splitlines()[0][:60]
        # the backward calls that all-reduce (MVSFormer's `loss.backward()` under the micro-batch loop)
        scope = m.enclosing(first) or m.tree
        backwards = [c for c in walk(scope) if isinstance(c, ast.Call) and callee(c) == "backward"][:3]
        yield Hit(first, (f"gradients accumulate over micro-batches (line {first.lineno}: "
                          f"`{text}`), but no micro-batch runs under model.no_sync(): at two "
                          "ranks every backward all-reduces (same result, N-1 extra all-reduces per step; one "
                          "rank has none) — run all but the last micro-batch inside `with model.no_sync():`"),
                  related=tuple((m, c) for c in backwards))


def _forward_outside_no_sync(f: Facts, m: Module):
    """`logits = model(x)`, then `with model.no_sync() if not is_last else nullcontext(): loss.backward()` (the
    from-scratch GPT's ddp_train.py): DDP decides in its forward whether the backward all-reduces, so a no_sync
    entered after the forward skips nothing; every micro-batch still all-reduces."""
    for w in (n for n in m.nodes if isinstance(n, ast.With)):
        held = {dotted(c.func.value) for i in w.items for c in ast.walk(i.context_expr) if isinstance(
            c, ast.Call) and callee(c) == "no_sync" and isinstance(c.func, ast.Attribute)}
        # (or a name bound to the method: MASR's `context = self.model.no_sync` ... `with context():`)
        named = {i.context_expr.func.id for i in w.items if isinstance(i.context_expr, ast.Call) and isinstance(
            i.context_expr.func, ast.Name)}
        held |= {dotted(a.value.value) for a in walk(m.enclosing(w) or m.tree) if isinstance(a, ast.Assign) and any(
            dotted(t) in named for t in a.targets) and isinstance(a.value, ast.Attribute) and a.value.attr == "no_sync"}
        body = [c for s in w.body for c in ast.walk(s) if isinstance(c, ast.Call)]
        if not held or not any(callee(c) == "backward" for c in body) or any(dotted(c.func) in held for c in body):
            continue
        loop = m.enclosing(w, (ast.For, ast.While))
        forwards = [c for c in walk(loop) if isinstance(c, ast.Call) and dotted(c.func) in held
                    and c.lineno < w.lineno] if loop is not None else []
        if forwards:
            yield Hit(w, (f"`{ast.unparse(w.items[0].context_expr)[:60]}` wraps only the backward: the forward "
                          f"(line {forwards[0].lineno}) ran outside it, and DDP decides in its forward whether the "
                          "backward all-reduces, so every micro-batch still all-reduces (N-1 extra all-reduces a "
                          "step, one rank has none) — move the forward into the no_sync block"),
                      related=tuple((m, c) for c in forwards[:2]))


def _gradients_synced_by_hand(f: Facts) -> bool:
    """The project never wraps a model in DDP and all-reduces the `.grad`s itself before the step (DialoGPT's
    `all_reduce_and_rescale_tensors([p.grad.data ...])`): no backward all-reduces, so there is nothing no_sync
    would skip."""
    names = f.all_names()
    return not any("DistributedDataParallel" in n or n == "DDP" for n in names) and any(
        re.search(r"all_reduce|reduce_scatter", callee(c)) and _of_gradients(mm, c, f)
        for mm in f.p.modules.values() for c in mm.calls)


def _of_gradients(m: Module, c: ast.Call, f: Facts | None = None) -> bool:
    """`c` is handed `.grad`s: `dist.all_reduce(p.grad)`, or a list built from them in its function (`grads =
    [p.grad.data for p in model.parameters()]`), or a parameter every caller fills with one (modded-nanogpt's
    `_launch_reduce(param, param.grad)`, whose `dist.all_reduce(grad, ...)`)."""
    def grads(x):
        return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(x))
    scope = m.enclosing(c) or m.tree
    built = {t.id for a in walk(scope) if isinstance(a, ast.Assign) and grads(a.value)
             for t in a.targets if isinstance(t, ast.Name)}
    built |= {a.target.id for a in walk(scope) if isinstance(a, ast.For) and isinstance(a.target, ast.Name) and (
        grads(a.iter) or isinstance(a.iter, ast.Name) and a.iter.id in built)}  # (`for g in grads: all_reduce(g)`)
    if f is not None and isinstance(scope, ast.FunctionDef):
        params = [a.arg for a in scope.args.args]
        sites = f.p.callers(m, scope)
        built |= {p for i, p in enumerate(params) if sites and all(any(grads(x) for x in (
            list(cc.args) + [None])[i - (params[:1] == ["self"]):][:1] if x is not None) for _, cc in sites)}
    return any(grads(a) or isinstance(a, ast.Name) and a.id in built for a in c.args)


@rule("batch-and-accum-divided", "06_accumulation", "per-GPU batch and accumulation steps both divided by "
      "world_size: the global batch shrinks by world_size")
def batch_and_accum_divided(f: Facts, m: Module):
    divided = {"batch": None, "accum": None}
    for n in m.nodes:
        target, value = None, None
        if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Div, ast.FloorDiv)):
            target, value = dotted(n.target), n.value
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.BinOp) and isinstance(
                n.value.op, (ast.Div, ast.FloorDiv)):
            target, value = dotted(n.targets[0]), n.value.right
        if target and value is not None and involves(value, WORLDISH):
            leaf = target.split(".")[-1]
            if ACCUMISH.search(leaf):
                divided["accum"] = n
            elif BATCHISH.search(leaf):
                divided["batch"] = n
    batch = divided["batch"]
    if batch is not None and divided["accum"] is not None and not _counts_the_divided_batch(batch, divided["accum"]):
        yield divided["accum"], (f"both the per-GPU batch (line {divided['batch'].lineno}) and the accumulation "
                                 "steps are divided by world_size: the global batch shrinks by world_size (article "
                                 "§7.2's table) — divide one of them, and check global = micro x accum x world_size")


def _counts_the_divided_batch(batch: ast.AST, accum: ast.AST) -> bool:
    """The accumulation count is the target over the per-GPU batch the run already divided (SatlasPretrain's
    `accumulate_freq = config['EffectiveBatchSize'] // batch_size // args.world_size` after `batch_size =
    config['BatchSize'] // args.world_size`): micro x accum x world_size is the target at any world size."""
    name = dotted(batch.target if isinstance(batch, ast.AugAssign) else batch.targets[0])
    value = accum.value if isinstance(accum, (ast.Assign, ast.AugAssign)) else accum
    return bool(name) and any(isinstance(x, (ast.Name, ast.Attribute)) and dotted(x) == name for x in ast.walk(value))
