"""Chapters 00 and 08: collectives that only some ranks reach (a hang), and the DDP-wrapped model run by rank 0
alone. A collective outside the distributed switch is rules/outside_switch.py."""

from __future__ import annotations

import ast
import re

from ..exits import rank0_loop_exits
from ..facts import Facts
from ..hierarchy import method_calling_wrapped_attribute
from ..project import Module
from ..registry import Hit, rule
from ..switches import one_process_arm
from ..syntax import (
    callee,
    const_str,
    const_value,
    dotted,
    kw,
    local_def,
    root,
    walk,
)


@rule("collective-under-rank0", "00_preflight", "a collective only rank 0 (or only the others) reaches: the "
      "ranks that call it wait forever for the ones that skip it (a hang)")
def collective_under_rank0(f: Facts, m: Module):
    for c in m.calls:
        kind = f.g.kind(m, c)
        if kind not in ("rank0", "not0") or not f.collective(m, c, kind) or one_process_arm(m, c):
            continue  # (`if args.local_rank == -1: evaluate(...)`: a run of one process, no rank to wait for)
        fn = m.enclosing(c) or m.tree
        other = "not0" if kind == "rank0" else "rank0"
        if any(isinstance(o, ast.Call) and callee(o) == callee(c) and o is not c and f.g.kind(m, o) in (other, None)
               for o in walk(fn)):
            continue  # `if rank != 0: barrier()` ... `if rank == 0: barrier()`: every rank meets once
        who = "rank 0 only" if kind == "rank0" else "every rank but 0"
        yield c, (f"{ast.unparse(c.func)}(...) runs on {who} (its guard, or an early return of the others): the "
                  "ranks that skip it never join, so the ones that call it wait forever (a hang) — move it outside "
                  "the rank branch")
    yield from rank0_loop_exits(f, m)  # ... or a training loop rank 0 alone leaves (an early stop only it decides)


@rule("ddp-forward-under-rank0", "08_checkpoints", "the DDP-wrapped model called by rank 0 alone: its buffer "
      "broadcast waits for the other ranks if the module has buffers")
def ddp_forward_under_rank0(f: Facts, m: Module):
    """One defect per function (ALIGNN's rank-0 evaluation calls its wrappers six times), naming the rest."""
    first: dict = {}
    for hit in (h if isinstance(h, Hit) else Hit(*h) for h in _rank0_forwards(f, m)):
        key = id(m.enclosing(hit.node))
        first[key] = first[key]._replace(related=(*first[key].related, (m, hit.node))) if key in first else hit
    yield from first.values()


def _rank0_forwards(f: Facts, m: Module):
    wrapped = f.ddp_wrapped.get(m.rel, {})
    for c in m.calls:
        kind = f.g.kind(m, c)
        # a function only rank 0 calls runs on rank 0 alone too (`if master_process: losses = estimate_loss()`)
        if kind != "rank0" and (kind is not None or f.g.effective(m, c) != "rank0") or f.collective(m, c):
            continue
        if one_process_arm(m, c):
            continue  # `if rank == 0 and world_size == 1:` (the retinal OCT scripts): no other rank to wait for
        if isinstance(c.func, (ast.Name, ast.Attribute)) and dotted(c.func) in wrapped and \
                not _other_arm_unwraps(m, c, dotted(c.func)) and \
                f.same_scope(m, c, dotted(c.func), wrapped[dotted(c.func)]) and \
                _wrap_reaches(m, c, dotted(c.func), wrapped[dotted(c.func)]):
            if _no_grad_run(f, m, c) and (_buffer_free(f, m, dotted(c.func)) or _no_buffer_broadcast(
                    m, wrapped[dotted(c.func)])):
                continue  # no buffers to broadcast (none, or broadcast_buffers=False: SOTA-Face-Recognition's
                # evaluation), no backward to prepare: the forward talks to no other rank
            yield c, (f"{dotted(c.func)}(...) is the DDP-wrapped model, called by rank 0 alone: with "
                      "broadcast_buffers=True (the default) and a module that has buffers its forward broadcasts them "
                      "and waits for the other ranks (a hang), and with grad on the next backward does — call "
                      f"{dotted(c.func)}.module(...) for rank-0-only evaluation"), "check-by-hand"
            continue
        param = _wrapper_parameter(f, m, c)
        if param is not None:
            if not (_no_grad_run(f, m, c) and _buffer_free(f, m, dotted(c.func))):
                cm, site = param
                yield Hit(c, (f"{dotted(c.func)}(...) runs on rank 0 alone, and {dotted(c.func)} is the DDP-wrapped "
                              f"model ({cm.path.name}:{site.lineno} hands it in): with broadcast_buffers=True (the "
                              "default) and a module that has buffers its forward broadcasts them and waits for the "
                              f"other ranks (a hang) — call {dotted(c.func)}.module(...) for rank-0-only evaluation"),
                          "check-by-hand", related=((cm, site),))
            continue
        method = _self_forward_in_method(f, m, c)
        if method is not None:
            name, inner, tm = method
            fn_in = tm.enclosing(inner)  # (every call of the wrapper in that method: LIA's two self.gen(...) lines)
            more = [(tm, x) for x in ast.walk(fn_in) if isinstance(x, ast.Call) and x is not inner
                    and dotted(x.func) == dotted(inner.func)] if fn_in is not None else []
            yield Hit(c, (f"rank 0 alone runs {ast.unparse(c.func)}(), which calls the DDP-wrapped {name} "
                          f"{_at(inner)}: {BUFFER_HANG} — call {name}.module(...) there for rank-0-only evaluation"),
                      "check-by-hand", related=((tm, inner), *more[:2]))
            continue
        unseen = _handed_to_an_unseen_runner(f, m, c, wrapped)
        if unseen is not None and not (_no_grad_run(f, m, c) and _buffer_free(f, m, unseen)):
            yield Hit(c, (f"rank 0 alone hands the DDP-wrapped {unseen} to {callee(c)}(), a sampler or evaluator "
                          f"from a module these files lack, which runs it: {BUFFER_HANG} — pass {unseen}.module for "
                          "rank-0-only sampling"), "check-by-hand")
            continue
        handed = _forwarded_in_callee(f, m, c, wrapped)
        fn = m.enclosing(c) or m.tree
        other_arms = {id(x) for n in _ancestor_ifs(m, c) for s in n.orelse for x in ast.walk(s)}
        if handed and not any(isinstance(o, ast.Call) and callee(o) == callee(c) and (
                f.g.kind(m, o) == "not0" or id(o) in other_arms) for o in walk(fn)):
            # (`if rank == 0: train(..., logger) else: train(...)`; not the training call every rank makes at
            # another time, FastAutoAugment's run_epoch over the train loader)
            name, inner, tm = handed
            if _no_grad_run(f, tm, inner) and _buffer_free(f, m, name):
                continue  # (USDM's Voicebox: evaluate() runs it under no_grad, and no layer of it holds a buffer)
            yield Hit(c, (f"rank 0 alone hands the DDP-wrapped {name} to {callee(c)}(), which calls it {_at(inner)}: "
                          f"{BUFFER_HANG} — pass {name}.module for rank-0-only evaluation"), "check-by-hand",
                      related=((tm, inner),))


BUFFER_HANG = ("with broadcast_buffers=True (the default) and a module that has buffers that forward broadcasts them "
               "and waits for the other ranks (a hang)")


def _at(inner: ast.AST) -> str:
    return f"(line {inner.lineno}: `{ast.unparse(inner)[:50]}`)"


# torch.nn layers that hold no buffers (InstanceNorm only without track_running_stats=True)
BUFFER_FREE = re.compile(r"(Conv(Transpose)?[123]d|Linear|Bilinear|Sequential|Module(List|Dict)|Parameter(List|Dict)?|"
                         r"P?ReLU6?|LeakyReLU|GELU|SiLU|ELU|CELU|SELU|Mish|Hardswish|Hardtanh|Sigmoid|Tanh|Softmax|"
                         r"LogSoftmax|Softplus|GLU|Dropout[123]?d?|LayerNorm|GroupNorm|InstanceNorm[123]d|Embedding|"
                         r"LSTM|GRU|RNN|LSTMCell|GRUCell|MultiheadAttention|Identity|Flatten|Unflatten|Upsample|"
                         r"(Adaptive)?(Max|Avg)Pool[123]d|(Constant|Reflection|Replication|Zero)Pad[123]d|"
                         r"Pixel(Un)?[Ss]huffle|Unfold|Fold|DeformConv2d|Rearrange|"
                         r"Size|\w*(Error|Exception|Warning))")
# (DeformConv2d: torchvision.ops; Rearrange: einops; neither holds a buffer; torch.Size and a raised error are no
# layers: MUSE's `torch.Size(normalized_shape)`, `raise ValueError(...)` in a builder)


# where submodules are built (`__init__`, `_make_layer`, `build_decoder`), as opposed to the forward's path
BUILDER = re.compile(r"^__init__$|make|build|create|layer|block|stage|head|neck|backbone|encoder|decoder", re.I)


def _no_grad(m: Module, c: ast.Call) -> bool:
    """The call runs under `with torch.no_grad():` / `torch.inference_mode()`, or in a function decorated so."""
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, (ast.With, ast.AsyncWith)) and any(
                callee(i.context_expr) in ("no_grad", "inference_mode") for i in n.items
                if isinstance(i.context_expr, ast.Call)):
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                callee(d) in ("no_grad", "inference_mode") if isinstance(d, ast.Call) else
                dotted(d).split(".")[-1] in ("no_grad", "inference_mode") for d in n.decorator_list):
            return True
        n = m.parent.get(id(n))
    return False


def _no_grad_run(f: Facts, m: Module, c: ast.Call) -> bool:
    """_no_grad(), or every project call of `c`'s function runs under no_grad (UPR-Net's Pipeline.inference)."""
    if _no_grad(m, c):
        return True
    fn = m.enclosing(c)
    sites = f.p.callers(m, fn) if fn is not None else []
    return bool(sites) and all(_no_grad(cm, s) for cm, s in sites)


def _buffer_free(f: Facts, m: Module, name: str) -> bool:
    """The wrapped model is a project class every layer of which is a torch.nn layer without buffers
    (InstanceNorm2d(affine=True), LayerNorm, Conv2d, LSTM: MP-SENet's MPNet): DDP's forward then has no buffers to
    broadcast. A BatchNorm, a register_buffer, a running-stats InstanceNorm, or a layer from another library (whose
    buffers these files do not show) keeps the finding."""
    found = f.model_class(m, name)
    if found is None:
        return False
    cm, cdef = found
    keys = set()
    for meth in (d for d in cdef.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))):
        keys |= f.p.reach(cm, meth)
    for mm, c in f.p.calls_in(keys):
        name = callee(c)
        if name == "register_buffer" or const_value(kw(c, "track_running_stats")) is True:
            return False
        if not name[:1].isupper() or not isinstance(c.func, (ast.Name, ast.Attribute)) or \
                root(c.func).startswith("self.") or f.p.resolve(mm, c):
            continue  # a function, a submodule called (`self.blocks[i](x)`), or a project class (reached above)
        if not BUILDER.search(getattr(mm.enclosing(c), "name", "__init__")):
            continue  # applied on the forward's path, not built (UPR-Net's `softsplat.FunctionSoftsplat(...)` in
            # get_warped_representations): a submodule that holds buffers is built in __init__ (or a builder)
        if not BUFFER_FREE.fullmatch(name):
            return False
    return True


def _only_in_a_dead_arm(f: Facts, m: Module, name: str, line: int) -> bool:
    """`name` holds the wrapper only in the else of `if args.use_ema:`, store_true with default True (FixMatch)."""
    on = {(const_str(x) or "").lstrip("-").replace("-", "_") for mm in f.p.modules.values() for c in mm.calls
          if callee(c) == "add_argument" and const_str(kw(c, "action")) == "store_true"
          and isinstance(kw(c, "default"), ast.Constant) and kw(c, "default").value is True for x in c.args[:1]}
    binds = [a for a in m.nodes if isinstance(a, ast.Assign) and a.lineno == line
             and any(dotted(t) == name for t in a.targets)]
    for a in binds:
        up = m.parent.get(id(a))
        if not (isinstance(up, ast.If) and any(a is s for s in up.orelse) and isinstance(up.test, ast.Attribute)
                and up.test.attr in on):
            return False
    return bool(binds)


def _ancestor_ifs(m: Module, c: ast.AST) -> list[ast.If]:
    """The ifs whose body holds `c`, innermost first."""
    out, child, n = [], c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and any(child is s for s in n.body):
            out.append(n)
        child, n = n, m.parent.get(id(n))
    return out


RUNNER = re.compile(r"sample|generat|evaluat|valid|infer|predict|visuali|render", re.I)
LIBRARIES = ("torch", "torchvision", "numpy", "diffusers", "transformers", "timm", "accelerate", "mmcv", "mmengine",
             "detectron2", "pytorch_lightning", "lightning", "wandb")


def _handed_to_an_unseen_runner(f: Facts, m: Module, c: ast.Call, wrapped: dict[str, int]) -> str | None:
    """The wrapper's name when rank 0 alone hands it to a sampler or evaluator imported from a project module these
    files lack (LCT's `karras_sample(diffusion, generator, model, ...)` from models.karras_diffusion): it runs it."""
    head = dotted(c.func).split(".")[0]
    imp = m.imports.get(head)
    if imp is None or not RUNNER.search(callee(c)) or f.p.resolve(m, c) or f.p.module_for(m, head) is not None \
            or imp[0].split(".")[0] in LIBRARIES:
        return None
    for a in [*c.args, *(k.value for k in c.keywords)]:
        name = dotted(a) if isinstance(a, (ast.Name, ast.Attribute)) else ""
        if name in wrapped and f.same_scope(m, c, name, wrapped[name]) and _wrap_reaches(m, c, name, wrapped[name]) \
                and not _no_buffer_broadcast(m, wrapped[name]) and not _only_in_a_dead_arm(f, m, name, wrapped[name]):
            return name
    return None


def _forwarded_in_callee(f: Facts, m: Module, c: ast.Call, wrapped: dict[str, int]):
    """(wrapped name, the call that runs it) when a rank-0-only call hands the wrapper to a project function that
    calls that parameter (`val_loss = evaluate(model, val_loader)` whose body runs `model(images)`). A wrap with
    broadcast_buffers=False broadcasts nothing in a forward."""
    for i, a in [*enumerate(c.args), *((k.arg, k.value) for k in c.keywords)]:
        name = dotted(a) if isinstance(a, (ast.Name, ast.Attribute)) else ""
        here = name in wrapped and f.same_scope(m, c, name, wrapped[name])
        handed_in = not here and isinstance(a, ast.Name) and m.enclosing(c) is not None and \
            _param_holds_wrapper(f, m, m.enclosing(c), name)  # (llm-baselines: train(model) -> eval_and_log(model))
        if not handed_in and (name not in wrapped or not f.same_scope(m, c, name, wrapped[name]) or
                              not _wrap_reaches(m, c, name, wrapped[name]) or
                              _no_buffer_broadcast(m, wrapped[name]) or _only_in_a_dead_arm(f, m, name, wrapped[name])):
            continue
        local = local_def(m, c) if isinstance(c.func, ast.Name) else None  # (SkinDDP's compute_accuracy, defined
        for tm, tf in f.p.resolve(m, c, exact=True) or ([(m, local)] if local else []):  # in main's rank-0 block)
            if not isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [x.arg for x in tf.args.args]
            if params[:1] in (["self"], ["cls"]):
                params = params[1:]
            param = i if isinstance(i, str) else params[i] if i < len(params) else None
            if any(isinstance(x, ast.Assign) and param in {dotted(t) for t in x.targets} for x in walk(tf)):
                continue  # `net = net.module` first: what it calls is no longer the wrapper
            inner = next((x for x in walk(tf) if isinstance(x, ast.Call) and isinstance(x.func, ast.Name)
                          and x.func.id == param), None)
            if inner is not None:
                return name, inner, tm
    return None


def _wrapper_parameter(f: Facts, m: Module, c: ast.Call):
    """(caller's module, call site) when `c` calls a parameter of its function that a caller fills with the DDP
    wrapper (VQ-VAE-2: `train(i, loader, model, ...)` after `model = DDP(model)`, and train's rank-0 branch runs
    `model(sample)`). A function that rebinds the parameter (`net = net.module`) calls something else."""
    fn = m.enclosing(c)
    if fn is None or not isinstance(c.func, ast.Name) or f.g.kind(m, c) != "rank0":
        return None  # (a function only rank 0 calls is judged where rank 0 hands it the wrapper)
    params = [x.arg for x in fn.args.args]
    if c.func.id not in params or any(isinstance(x, (ast.Assign, ast.AugAssign)) and c.func.id in {
            dotted(t) for t in (x.targets if isinstance(x, ast.Assign) else [x.target])} for x in walk(fn)):
        return None
    return _param_holds_wrapper(f, m, fn, c.func.id)


def _param_holds_wrapper(f: Facts, m: Module, fn: ast.AST, param: str, depth: int = 3):
    """(caller's module, call site) when a caller fills the parameter `param` of `fn` with the DDP wrapper, itself
    or through its own parameter, up to `depth` calls up (llm-baselines: main's wrapped model -> train(model) ->
    eval_and_log(model)); None otherwise."""
    params = [x.arg for x in fn.args.args] if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if param not in params or depth == 0:
        return None
    i = params.index(param) - (1 if params[:1] in (["self"], ["cls"]) else 0)
    for cm, site in f.p.callers(m, fn):
        held = f.ddp_wrapped.get(cm.rel, {})
        args = [a for j, a in enumerate(site.args) if j == i] + [k.value for k in site.keywords if k.arg == param]
        for a in args:
            name = dotted(a) if isinstance(a, (ast.Name, ast.Attribute)) else ""
            direct = name in held and f.same_scope(cm, site, name, held[name])
            if direct and _wrap_reaches(cm, site, name, held[name]) and not _no_buffer_broadcast(cm, held[name]) \
                    and not _only_in_a_dead_arm(f, cm, name, held[name]):
                return cm, site
            outer = cm.enclosing(site)
            if isinstance(a, ast.Name) and not direct and outer is not None and \
                    _param_holds_wrapper(f, cm, outer, name, depth - 1) is not None:
                return cm, site
    return None


def _self_forward_in_method(f: Facts, m: Module, c: ast.Call):
    """(wrapped name, its call, module) when a rank-0-only call runs a method of the same object whose body calls
    the wrapped `self.model(...)` in an arm the call's constant arguments reach (DifFace: `self.feed_data(data,
    phase='val')` in rank 0's validation, and feed_data runs `self.model(data['lq'])` for phase 'val')."""
    if not isinstance(c.func, ast.Attribute):
        return None
    for tm, tf in f.p.resolve(m, c, exact=True) or method_calling_wrapped_attribute(
            f.p, c, f.ddp_wrapped.get(m.rel, {})):
        # (or another object's method: ECAPA-TDNN's `s.eval_network(...)` under `if rank == 0:` in the script)
        if not isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)) or dotted(c.func.value) != "self" and not (
                tm.class_of(tf) and tm is not m):
            continue
        held = {k: (tm, v) for k, v in f.ddp_wrapped.get(tm.rel, {}).items()}
        # (or wrapped from outside into its attribute: E2EC's `trainer.network = DDP(...)`, then `trainer.val(...)`)
        owner = dotted(c.func.value) + "."
        held.update({"self." + k[len(owner):]: (m, v) for k, v in f.ddp_wrapped.get(m.rel, {}).items()
                     if owner != "self." and k.startswith(owner) and "." not in k[len(owner):]})
        params = [x.arg for x in tf.args.args][1:]
        consts = {params[j]: a.value for j, a in enumerate(c.args) if j < len(params) and isinstance(a, ast.Constant)}
        consts.update({k.arg: k.value.value for k in c.keywords if isinstance(k.value, ast.Constant)})
        for x in walk(tf):
            name = dotted(x.func) if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) else ""
            if name.startswith("self.") and name in held and not _arm_ruled_out(tm, x, tf, consts) and \
                    not _other_arm_unwraps(tm, x, name) and \
                    not _no_buffer_broadcast(*held[name]) and not (_no_grad(tm, x) and _buffer_free(f, tm, name)):
                return name, x, tm
    return None


def _other_arm_unwraps(m: Module, node: ast.AST, name: str) -> bool:
    """`node` sits in the else of an `if` whose body calls `name.module(...)` (EzFlow's `if self.model_parallel:
    output = self.model.module(img1, img2) else: output = self.model(img1, img2)`): the author unwrapped in the
    arm the DDP run takes; the else is the plain model's."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and any(child is s for s in n.orelse) and any(
                isinstance(x, ast.Call) and dotted(x.func) == f"{name}.module" for s in n.body for x in ast.walk(s)):
            return True
        child, n = n, m.parent.get(id(n))
    return False


def _arm_ruled_out(m: Module, node: ast.AST, fn: ast.AST, consts: dict) -> bool:
    """`node` lies in an arm of `if phase == 'train':` that the call's constant (`phase='val'`) does not take."""
    child, n = node, m.parent.get(id(node))
    while n is not None and n is not fn:
        t = n.test if isinstance(n, ast.If) else None
        if isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id in consts and \
                len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)) and \
                isinstance(t.comparators[0], ast.Constant):
            holds = (consts[t.left.id] == t.comparators[0].value) == isinstance(t.ops[0], ast.Eq)
            if any(child is s for s in (n.orelse if holds else n.body)):
                return True
        child, n = n, m.parent.get(id(n))
    return False


def _no_buffer_broadcast(m: Module, line: int) -> bool:
    """The wrap broadcasts no buffers in forward: broadcast_buffers=False, or apex's DistributedDataParallel
    (it reduces gradients in backward only)."""
    for a in m.nodes:
        if isinstance(a, ast.Assign) and a.lineno == line and isinstance(a.value, ast.Call):
            imp = m.imports.get(dotted(a.value.func).split(".")[0])
            if "apex" in dotted(a.value.func) or imp and imp[0].startswith("apex") or any(
                    k.arg == "broadcast_buffers" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in a.value.keywords):
                return True
    return False


def _wrap_reaches(m: Module, c: ast.Call, owner: str, line: int) -> bool:
    """Whether the wrapping assignment (at `line`) has run when `c` calls the name: `c` comes after it in the
    function's flow, or sits in a loop that also holds the wrap (the next turn sees the wrapper). A forward of the
    plain model before `model = DDP(model)` (a rank-0 reference pass) broadcasts nothing; nor does one after the
    name is bound again to a model built anew (SpikingResformer's `model = create_model(...)` for the final test)."""
    if owner.startswith("self."):
        return True
    if c.lineno > line:
        scope = m.enclosing(c) or m.tree
        return not any(isinstance(a, ast.Assign) and line < a.lineno < c.lineno and owner in {
            dotted(t) for t in a.targets} and isinstance(a.value, ast.Call) and "DistributedDataParallel" not in (
            dotted(a.value.func)) and callee(a.value) != "DDP" and owner not in {
            dotted(x) for x in ast.walk(a.value) if isinstance(x, (ast.Name, ast.Attribute))} for a in walk(scope))
    n = m.parent.get(id(c))
    while n is not None:
        if isinstance(n, (ast.For, ast.While)) and any(
                isinstance(a, ast.Assign) and a.lineno == line for a in ast.walk(n)):
            return True
        n = m.parent.get(id(n))
    return False
