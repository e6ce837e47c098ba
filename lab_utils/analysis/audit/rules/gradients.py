"""Chapters 05 and 01: gradients (a sum loss, a gather without autograd), and a learning rate that grows with the
GPU count. Accumulation (chapter 06) is in accumulation.py, the rendezvous port (chapter 09) in launching.py."""

from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..gathers import (
    applications,
    assigned_without_grad,
    called_only_without_grad,
    features_without_grad,
    fills_state_only,
    grad_free,
)
from ..global_counts import global_count_hits
from ..growth import a_count, grows, never_read, world_holding
from ..hierarchy import never_named
from ..project import Module
from ..registry import Hit, rule
from ..scripts import off_the_default_path
from ..syntax import (
    WORLDISH,
    callee,
    const_str,
    const_value,
    dotted,
    involves,
    involves_rank,
    kw,
    walk,
)


def _divided_later(m: Module, c: ast.Call) -> bool:
    """The sum loss is divided afterwards (`loss = crit(...) / n`, `loss /= batch_size`, `loss.div(count)`): a
    mean over the rank's own samples, which DDP's gradient average turns into the global mean."""
    n = m.parent.get(id(c))
    while isinstance(n, (ast.BinOp, ast.Call, ast.Attribute)):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and not _fixed_divisor(m, c, n.right):
            return True
        n = m.parent.get(id(n))
    if not isinstance(n, (ast.Assign, ast.AnnAssign)):
        return False
    names = {dotted(t) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}
    scope = m.enclosing(c) or m.tree
    for x in walk(scope):
        if isinstance(x, ast.AugAssign) and isinstance(x.op, ast.Div) and dotted(x.target) in names:
            return True
        if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Div) and any(
                dotted(y) in names for y in ast.walk(x.left) if isinstance(y, (ast.Name, ast.Attribute))):
            return True
        if isinstance(x, ast.Call) and callee(x) in ("div", "div_", "true_divide") and isinstance(
                x.func, ast.Attribute) and dotted(x.func.value) in names:
            return True
    return False


def _fixed_divisor(m: Module, c: ast.Call, d: ast.AST) -> bool:
    """A divisor that is the same whatever the batch: constants and attributes the class sets only in __init__
    (SMOKE's `F.l1_loss(..., reduction="sum") / (self.loss_weight[1] * self.max_objs)`): the loss stays a sum over
    the rank's own samples, and DDP's average halves it at 2 ranks."""
    fn = m.enclosing(c)
    cls = m.class_of(fn) if fn is not None else None
    if cls is None:
        return False
    init = m.functions.get(f"{cls}.__init__")
    set_in = {id(f) for f in m.functions.values() if m.class_of(f) == cls}

    def only_in_init(attr: str) -> bool:
        writes = [a for a in m.nodes if isinstance(a, (ast.Assign, ast.AugAssign)) and any(
            dotted(t) == f"self.{attr}" for t in (a.targets if isinstance(a, ast.Assign) else [a.target]))]
        return bool(writes) and init is not None and all(
            m.enclosing(a) is init for a in writes if id(m.enclosing(a)) in set_in)
    leaves = [n for n in ast.walk(d) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))
              and not isinstance(m.parent.get(id(n)), ast.Attribute)]
    return bool(leaves) and all(isinstance(n, ast.Attribute) and dotted(n.value) == "self" and only_in_init(n.attr)
                                for n in leaves)


# FSDP2's own switches for its gradient division: a project that sets one (torchtitan: factor 1.0, so the ranks'
# gradients are summed, and the loss is divided by the token count over every rank) does not average over ranks
# the way the rule's consequence needs
DIVIDE_FACTOR_CALLS = {"set_gradient_divide_factor", "set_reduce_scatter_divide_factor"}


@rule("sum-loss-unscaled", "05_ddp_flags", "reduction='sum' under DDP, never divided and without a x world_size: "
      "DDP averages the gradients over ranks, so each step is 1/world_size of the single run's")
def sum_loss_unscaled(f: Facts, m: Module):
    if any(callee(c) in DIVIDE_FACTOR_CALLS for mm in f.p.modules.values() for c in mm.calls):
        return  # the reduction over ranks is not DDP's average: the 1/world_size consequence does not follow
    yield from global_count_hits(f, m)  # (a loss over a count summed over ranks: LOCA's num_objects)
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and (involves(n.left, WORLDISH)
                                                                       or involves(n.right, WORLDISH))
           and not _counts_processes(m, n) for n in m.nodes):
        return  # the sum is scaled by the world size somewhere
    per_fn: dict[int, Hit] = {}  # one defect, one finding: a function's sum losses (SMOKE's three DisL1 terms)
    for c in m.calls:
        if _sums(m, c) and not _divided_later(m, c) and not _in_a_function_nothing_uses(f, m, c) and \
                not _kept_unread(f, m, c) and not _read_out(m, c):
            key = id(m.enclosing(c)) if m.enclosing(c) is not None else id(c)
            if key in per_fn:
                per_fn[key] = per_fn[key]._replace(related=(*per_fn[key].related, (m, c)))
                continue
            how = "reduction='sum'" if kw(c, "reduction") is not None else \
                f"{callee(c)}(...), which sums over the batch,"
            per_fn[key] = Hit(c, (f"{how} under DDP without a x world_size: DDP averages the gradients over ranks, so "
                                  "each step is 1/world_size of the single run's (AdamW hides it in the loss; the grad "
                                  "norm shows it) — multiply the loss by world_size, or divide the sum by the global "
                                  "count"))
    yield from per_fn.values()


def _torch_loss(m: Module, c: ast.Call) -> bool:
    """torch's own loss (`nn.MSELoss(size_average=False)`, `F.mse_loss(...)`), not a project's class or a metric
    that takes the same keyword with its own meaning (FieldsLpLoss, an ssim helper)."""
    name = callee(c)
    if name in m.classes or name in m.functions:
        return False
    head = dotted(c.func).split(".")[0]
    imp = m.imports.get(head if isinstance(c.func, ast.Attribute) else name)
    return bool(imp) and imp[0].split(".")[0] == "torch" and bool(re.search(r"Loss$|_loss$|cross_entropy", name))


def _counts_processes(m: Module, n: ast.BinOp) -> bool:
    """`args.world_size = ngpus_per_node * args.world_size`, `args.rank = args.rank * ngpus_per_node + gpu` (the
    ImageNet example's launcher): the product is the world size or a rank, a count of processes, not a loss scaled
    by it."""
    a = m.parent.get(id(n))
    while isinstance(a, ast.BinOp):
        a = m.parent.get(id(a))
    return isinstance(a, ast.Assign) and all(re.search(r"world|rank|gpus|nprocs", dotted(t).split(".")[-1] or "", re.I)
                                             for t in a.targets)


def _sums(m: Module, c: ast.Call) -> bool:
    """A loss that sums over the batch: reduction='sum', the old `size_average=False`, or warp-ctc's CTCLoss
    (warpctc_pytorch), whose size_average defaults to False (the handwritten-OCR samples' criterion)."""
    if any(k.arg == "reduction" and const_str(k.value) == "sum" for k in c.keywords):
        return True
    size_average = kw(c, "size_average")
    if isinstance(size_average, ast.Constant) and size_average.value is False and _torch_loss(m, c):
        return True
    imp = m.imports.get(callee(c)) if isinstance(c.func, ast.Name) else m.imports.get(dotted(c.func).split(".")[0])
    return callee(c) == "CTCLoss" and bool(imp) and imp[0].startswith("warpctc") and size_average is None


def _in_a_function_nothing_uses(f: Facts, m: Module, c: ast.Call) -> bool:
    """GFSLT-VLP's `def loss_fn_kd(...)`, defined and never called or named anywhere in the project."""
    fn = m.enclosing(c)
    return isinstance(fn, ast.FunctionDef) and m.class_of(fn) is None and not f.p.callers(m, fn) and \
        fn.name not in f.all_names()


def _kept_unread(f: Facts, m: Module, c: ast.Call) -> bool:
    """img2pose's `self.pose_loss = MSELoss(reduction="sum")` in its Config: the loss object is stored under a name
    no line of the project reads again, so no loss it computes reaches a backward these files run."""
    a = m.parent.get(id(c))
    if not (callee(c)[:1].isupper() and isinstance(a, ast.Assign) and len(a.targets) == 1
            and isinstance(a.targets[0], (ast.Name, ast.Attribute))):
        return False  # (a loss module, MSELoss(...); not a loss value, F.cross_entropy(...), which backward reads)
    name = dotted(a.targets[0]).split(".")[-1]
    return bool(name) and not any(
        isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Load)
        or isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        for mm in f.p.modules.values() for n in mm.nodes)


LOSS_CODE = re.compile(r"loss|contrast|nce|clip|simclr|moco|criterion", re.I)
LOOP_CODE = re.compile(r"train|runner|engine|solver|learner", re.I)
MATMUL = {"matmul", "mm", "bmm", "einsum", "cosine_similarity"}


def _uses_in_similarity(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) or isinstance(n, ast.Call)
               and callee(n) in MATMUL for n in walk(fn))


# calls that make a new leaf tensor: what they return has no autograd history, so gathering it loses nothing
def _in_a_loss(f: Facts, m: Module, fn: ast.AST | None) -> bool:
    """The gathered features enter a loss: the function (or its class) is a loss, or it or a caller multiplies
    them into similarities (`a @ all_b.T`, einsum) — in-batch negatives across ranks."""
    if fn is None:
        return False
    sites = [(m, fn)] + [(cm, cm.enclosing(c)) for cm, c in f.p.callers(m, fn)]
    for mm, g in sites:
        if g is None:
            continue
        owner = mm.class_of(g) or ""
        # (a name says loss only when it is not a training loop's: Re-IQA's ContrastTrainer._train_moco gathers the
        # momentum encoder's no-grad keys and the input images for shuffle-BN, in no loss)
        if any(LOSS_CODE.search(x) and not LOOP_CODE.search(x) for x in (g.name, owner)) or _uses_in_similarity(g):
            return True
    return False


def _applied_only_without_backward(f: Facts, name: str) -> bool:
    """Every `Name.apply(...)` of an autograd.Function in the project sits in code that never runs backward, nor
    do the callers of the function around it: its backward never runs. False when nothing applies it here."""
    sites = applications(f, name)
    return bool(sites) and all(not f.trains(cm, c) and (cm.enclosing(c) is None or _callers_never_step(
        f, cm, cm.enclosing(c))) for cm, c in sites)


def _loss_callers(f: Facts, m: Module, fn: ast.AST | None) -> list[tuple[Module, ast.Call]]:
    """The calls of a gather helper made inside a loss (SLIP's CLIPLoss calling utils.all_gather_batch)."""
    out = []
    for cm, c in (f.p.callers(m, fn) if fn is not None else []):
        g = cm.enclosing(c)
        if g is not None and (LOSS_CODE.search(g.name) or LOSS_CODE.search(cm.class_of(g) or "")
                              or _uses_in_similarity(g)):
            out.append((cm, c))
    return out


def _uncalled(f: Facts, m: Module, fn: ast.AST, depth: int = 2) -> bool:
    """Nothing in these files runs `fn`: no call and, in a script, no mention (a library's function is its
    callers' to judge), or only functions that nothing runs call it (Text4Vis's gather_features, called by
    create_logits, which only a script not copied calls). A function that sets up the process group, in a module
    nothing here imports or loads by name (`import_module`: DeepAVFusion's launcher picks its worker), is a run's
    own main, started by a launcher these files lack (MAE-ST's main_finetune.main, started by run_finetune.py)."""
    mods = f.p.modules.values()
    if not any(m.rel in f.p.imports_of(o) or any(callee(c) == "import_module" for c in o.calls) for o in mods
               if o is not m) and f.p.function_does(m, fn, lambda mm, cc: callee(cc) == "init_process_group", 2):
        return False
    sites = f.p.callers(m, fn)
    if not sites:  # (a module another one imports is a library, even with a self-test `__main__` block)
        return (not m.entry or any(m.rel in f.p.imports_of(o) for o in f.p.modules.values() if o is not m)) and \
            never_named(f.p, m, fn)
    return depth > 0 and all((g := cm.enclosing(c)) is not None and not cm.class_of(g) and _uncalled(
        f, cm, g, depth - 1) for cm, c in sites)


def _handed_detached_only(f: Facts, m: Module, fn: ast.AST) -> bool:
    """Every call of the helper hands it a detached value (`gather(loss.detach().float())`), apart from calls in
    helpers nothing calls (contrastors' unused gather_dict)."""
    sites = [(cm, c) for cm, c in f.p.callers(m, fn) if (g := cm.enclosing(c)) is None or cm.class_of(g)
             or f.p.callers(cm, g)]
    return bool(sites) and all(c.args and any(isinstance(x, ast.Call) and callee(x) == "detach" for x in ast.walk(
        c.args[0])) for _, c in sites)


def _callers_never_step(f: Facts, m: Module, fn: ast.AST | None) -> bool:
    """A gather helper that the project calls only from code that never runs backward or an optimizer step
    (an evaluation gathering features for a kNN/SVM probe): its result feeds no gradient, so the missing autograd
    has no consequence. A helper nobody calls here (a library's) stays open."""
    sites = f.p.callers(m, fn) if fn is not None else []
    return bool(sites) and not any(f.trains(cm, c) or _in_a_forward(f, cm, cm.enclosing(c), 3) for cm, c in sites)


READ_OUT = {"cpu", "numpy", "tolist", "item", "detach", "batch_decode", "decode", "print", "info", "log"}


def _read_out(m: Module, c: ast.Call) -> bool:
    """What this call returns is only read out after it (DPO's `chosen_rewards = all_gather_if_needed(...)`, then
    `metrics[...] = chosen_rewards.cpu().numpy().tolist()`; generated tokens handed to `tokenizer.batch_decode`):
    every later use of the name it is bound to goes through .cpu()/.item()/.tolist()/.detach(), a decode or a log.
    A gathered value read out feeds no loss, so the gradient it lacks is never missed."""
    a = m.parent.get(id(c))
    if _chained_read_out(m, c):
        return True  # `self.gather_distributed_data(preds).cpu()` (Vesper's evaluation)
    names = {t.id for t in getattr(a, "targets", []) if isinstance(t, ast.Name)} if isinstance(a, ast.Assign) else set()
    scope = m.enclosing(c) or m.tree
    uses = [n for n in walk(scope) if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
            and n.lineno > c.lineno]
    if not names or not uses:
        return False

    def read(n: ast.AST) -> bool:
        up = m.parent.get(id(n))
        for _ in range(6):  # (InstructLLaMA's `(num_accurate.sum() / num_samples.sum()).item()`, within one line)
            if isinstance(up, ast.Call) and callee(up) in READ_OUT:
                return True
            if up is None or isinstance(up, ast.stmt):
                return False
            up = m.parent.get(id(up))
        return False
    return all(read(n) for n in uses)


def _chained_read_out(m: Module, c: ast.Call) -> bool:
    """`c(...).cpu()`, `.numpy()`, `.tolist()`: the value leaves for a metric the moment it is made."""
    up = m.parent.get(id(c))
    return isinstance(up, ast.Attribute) and up.attr in READ_OUT and isinstance(m.parent.get(id(up)), ast.Call)


def _concatenated_then_read_out(m: Module, scope: ast.AST, lst: str) -> bool:
    """Every concatenation of the gathered list is read out on the spot (`torch.cat(gathered).cpu()`): the
    gathered features go to a metric, not into a loss."""
    cats = [n for n in walk(scope) if isinstance(n, ast.Call) and callee(n) in ("cat", "stack") and n.args
            and dotted(n.args[0]) == lst]
    return bool(cats) and all(_chained_read_out(m, n) for n in cats)


def _in_a_forward(f: Facts, m: Module, fn: ast.AST | None, depth: int) -> bool:
    """`fn` is a model's `forward`, or a helper it calls (up to `depth` calls down): `model(x)` runs it, a call
    these sites do not name, and a training loop may backward through it (CLIP4Clip's get_similarity_logits)."""
    if fn is None or depth < 0:
        return False
    return getattr(fn, "name", "") == "forward" or any(
        _in_a_forward(f, cm, cm.enclosing(c), depth - 1) for cm, c in f.p.callers(m, fn))


@rule("gather-without-grad", "05_ddp_flags", "in-batch negatives through a plain all_gather: the other ranks' "
      "features carry no gradient, so the model gets a fraction of the single run's gradient")
def gather_without_grad(f: Facts, m: Module):
    """One defect per loss function: OpenCLIP-style losses gather the image and the text features (and their
    MLP projections, LAION-CLAP) the same way; the first gather is the finding, the others its related places."""
    per_fn: dict[int, Hit] = {}
    order = []
    for hit in _gather_hits(f, m):
        hit = hit if isinstance(hit, Hit) else Hit(*hit)
        key = id(m.enclosing(hit.node)) if m.enclosing(hit.node) is not None else id(hit.node)
        if key in per_fn:
            per_fn[key] = per_fn[key]._replace(related=(*per_fn[key].related, (m, hit.node)))
        else:
            per_fn[key] = hit
            order.append(key)
    yield from (per_fn[k] for k in order)


def _gather_hits(f: Facts, m: Module):
    for c in m.calls:
        plain = dotted(c.func) in ("dist.all_gather", "torch.distributed.all_gather", "all_gather") or callee(
            c) == "all_gather" and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and \
            m.imports.get(c.func.value.id, ("",))[0] == "torch.distributed"  # (`import torch.distributed as td`)
        into = callee(c) == "all_gather_into_tensor" and "dist" in dotted(c.func)
        if not ((plain or into) and len(c.args) == 2):
            continue
        fn = m.enclosing(c)
        scope = fn or m.tree
        lst, x = dotted(c.args[0]), c.args[1]
        if fn is not None and (not m.class_of(fn) and _uncalled(f, m, fn) or called_only_without_grad(f, m, fn)
                               or _handed_detached_only(f, m, fn)):
            continue  # a helper nobody here calls (Text4Vis's gather_features, for a script not copied) is its
            # callers' to judge; one called only under no_grad (AVID's memory-bank update), or handed only detached
            # values (contrastors' `gather(loss.detach().float())` for its logs), feeds no gradient
        own = any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) and dotted(t.value) == lst and
                                                    involves_rank(t.slice, m.rank_tainted) for t in a.targets)
                  for a in walk(scope))
        if own and any(isinstance(n, ast.Call) and callee(n) in ("cat", "stack") and n.args and dotted(n.args[0]) == lst
                       for n in walk(scope)) and not features_without_grad(m, scope, x):
            # gathered under no_grad, then `all_z[rank] = z` (hyp_metric's training loop): the gather looks
            # deliberate, but every rank's loss over the global batch reaches only its own rows, and DDP's mean
            # then takes 1/world_size of the single run's gradient
            # (the helper's calls in the step are related places: HIER's `z = utils.all_gather(z, local_rank)`)
            yield Hit(c, (f"{ast.unparse(c)} then {lst}[rank] = {ast.unparse(x)}: only the rank's own slice keeps "
                          "its gradient; the other ranks' features enter the loss as constants, so at 2 ranks the "
                          "model gets about 1/world_size of the single run's gradient for those terms (DDP averages "
                          "the ranks' partial gradients) — torch.distributed.nn.functional.all_gather keeps the "
                          "gradient, or scale the loss by world_size"),
                      related=tuple(sorted(f.p.callers(m, fn), key=lambda x: not f.trains(*x))[:3])
                      if fn is not None else ())
            continue
        if "detach" in ast.unparse(x) or m.enclosing(c, (ast.With,)) is not None and any(
                "no_grad" in dotted(i.context_expr) for i in m.enclosing(c, (ast.With,)).items):
            continue
        if isinstance(fn, ast.FunctionDef) and any("no_grad" in dotted(d) for d in fn.decorator_list):
            continue
        if grad_free(scope, x) or assigned_without_grad(m, scope, x) or _after_the_steps_backward(m, c) or \
                _grad_disabled_before(scope, c):
            continue
        owner = m.classes.get(m.class_of(fn) or "") if fn is not None else None
        backward = next((d for d in owner.body if isinstance(d, ast.FunctionDef) and d.name == "backward"),
                        None) if owner is not None else None
        if backward is not None:  # an autograd.Function (a GatherLayer)
            if any(isinstance(n, ast.Call) and callee(n) in ("all_reduce", "reduce_scatter", "all_to_all",
                                                             "reduce_scatter_tensor") for n in ast.walk(backward)):
                continue  # its backward sums every rank's gradient for this rank's features (VICReg's)
            if _applied_only_without_backward(f, owner.name):
                continue  # applied only where nothing runs backward (DLRM gathers its evaluation outputs)
            if (sites := applications(f, owner.name)) and all(f.off_by_default(cm, x) for cm, x in sites):
                continue  # applied only under an option off by default (RawNeXt's `if args.use_metric_l:`)
            yield Hit(c, (f"{owner.name}.backward hands back only this rank's slice of the incoming gradients, with "
                          "no all_reduce: the gradient other ranks' losses send to this rank's features is dropped, "
                          "so at 2 ranks the step is about 1/world_size of the single run's — all_reduce the stacked "
                          "gradients in backward before slicing (or torch.distributed.nn.functional.all_gather)"),
                      related=tuple(applications(f, owner.name)))
            continue
        used = into or any(isinstance(n, ast.Call) and callee(n) in ("cat", "stack") and n.args
                           and dotted(n.args[0]) == lst for n in walk(scope)) or any(
            isinstance(r, ast.Return) and r.value is not None and lst in {dotted(n) for n in ast.walk(r.value)}
            for r in walk(scope))  # returned to a caller that concatenates it
        if not used or _concatenated_then_read_out(m, scope, lst) or _into_metrics_only(m, scope, lst, c) or \
                fills_state_only(fn, lst):
            continue  # (Simple-CCReID's test-time concat_all_gather: `torch.cat(tensors_gather, dim=0).cpu()`)
        if _in_a_loss(f, m, fn):
            # one defect, one finding: at the gather (the fix), naming the losses that call the helper
            yield Hit(c, (f"{ast.unparse(c)} inside a loss returns tensors without a gradient: the gathered features "
                          "(in-batch negatives from the other ranks) are constants, and even this rank's own rows lose "
                          "the gradient through the gathered copy, so at 2 ranks the step is a fraction of the single "
                          "run's — torch.distributed.nn.functional.all_gather keeps it"),
                      related=tuple(_loss_callers(f, m, fn)))
        elif fn is not None and f.p.callers(m, fn) and not _callers_never_step(f, m, fn) and not all(
                cc.args and _index_valued(cc.args[0]) or _read_out(cm, cc) or _in_a_reducing_function(cm, cc)
                for cm, cc in f.p.callers(m, fn)):
            # (iBOT's concat_all_gather of argmax predictions and labels for an accuracy: no gradient to lose)
            # a helper nobody in these files calls (a utility module's gather of metrics) is judged by its callers
            yield c, (f"{ast.unparse(c)} returns tensors without a gradient: if the gathered features enter a loss "
                      "(in-batch negatives), that loss's gradient reaches no rank's features but through its own "
                      "rows — torch.distributed.nn.functional.all_gather keeps it"), "check-by-hand"
    yield from _gathered_as_objects(f, m)


METRICISH = re.compile(r"acc|top_?k|metric|score|auc|precision|recall|f1|confusion|evaluat", re.I)


def _into_metrics_only(m: Module, scope: ast.AST, lst: str, gather: ast.Call) -> bool:
    """After the gather, the gathered list (or its concatenation under the same name) is read only as an argument
    of metric calls (RealNet's `all_preds = torch.cat(all_preds)` then `compute_top_k(all_preds, all_labels, 1)`):
    an accuracy, no loss, so no gradient is lost."""
    reads = [n for n in walk(scope) if isinstance(n, ast.Name) and n.id == lst and isinstance(n.ctx, ast.Load)
             and n.lineno > gather.lineno]
    def use(n: ast.AST) -> bool:
        up = m.parent.get(id(n))
        if isinstance(up, ast.Call) and callee(up) in ("cat", "stack") and up.args and up.args[0] is n:
            at = m.parent.get(id(up))  # (re-bound under its own name, read on below)
            return isinstance(at, ast.Assign) and any(dotted(t) == lst for t in at.targets)
        return isinstance(up, ast.Call) and n in up.args and bool(METRICISH.search(callee(up)))
    return bool(reads) and all(use(n) for n in reads)


def _in_a_reducing_function(m: Module, c: ast.Call) -> bool:
    """The gather helper is called in the forward of an autograd.Function whose backward all-reduces the gradient
    (PointContrast's AllGatherWithGradient: `all_gather_batch([input])` forward, `scaled_all_reduce` backward): the
    Function carries the gradient back, so the plain gather inside it loses nothing."""
    fn = m.enclosing(c)
    cls = m.classes.get(m.class_of(fn) or "") if fn is not None and fn.name == "forward" else None
    backward = next((d for d in cls.body if isinstance(d, ast.FunctionDef) and d.name == "backward"), None) \
        if cls is not None else None
    return backward is not None and any(isinstance(n, ast.Call) and re.search(r"all_reduce|reduce_scatter", callee(n))
                                        for n in ast.walk(backward))


def _after_the_steps_backward(m: Module, c: ast.Call) -> bool:
    """The gather comes after the loop body's backward() (the retina grader gathers its predictions for the
    metrics once the step is taken): what it gathers feeds no gradient of this step."""
    loop = m.enclosing(c, (ast.For, ast.While))
    return loop is not None and any(isinstance(n, ast.Call) and callee(n) == "backward" and n.lineno < c.lineno
                                    for n in walk(loop))


def _grad_disabled_before(scope: ast.AST, c: ast.Call) -> bool:
    """`torch.set_grad_enabled(False)` earlier in the function, not turned back on before the gather (an
    evaluation loop): the gathered tensors carry no gradient in any case."""
    sets = sorted((n.lineno, const_value(n.args[0])) for n in walk(scope) if isinstance(n, ast.Call)
                  and callee(n) == "set_grad_enabled" and n.args and n.lineno < c.lineno)
    return bool(sets) and sets[-1][1] is False


LABELISH = re.compile(r"^(labels?|targets?|y|gt|idx|index|indices|ids?)$", re.I)


def _index_valued(v: ast.AST) -> bool:
    """A tensor of class indices or labels, which carries no gradient: `probs.max(dim=1)[1]`, `x.argmax(1)`,
    `labels.to(device)`."""
    if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Call) and callee(v.value) in ("max", "topk", "sort") \
            and const_value(v.slice) == 1:
        return True
    if isinstance(v, ast.Call) and callee(v) in ("argmax", "argsort", "argmin", "long", "int"):
        return True
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and callee(v) in ("to", "cuda", "cpu"):
        return _index_valued(v.func.value)
    return isinstance(v, (ast.Name, ast.Attribute)) and bool(LABELISH.match(dotted(v).split(".")[-1]))


def _detached(scope: ast.AST, v: ast.AST) -> bool:
    """A value that is a detached copy, or a container holding one (`[q.detach(), ctx.cpu().detach_()]`),
    directly or through the names assigned in the scope."""
    names = {n.id for n in ast.walk(v) if isinstance(n, ast.Name)}
    sources = [v] + [a.value for a in walk(scope) if isinstance(a, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id in names for t in a.targets)]
    return any(isinstance(n, ast.Attribute) and n.attr in ("detach", "detach_") for s in sources for n in ast.walk(s))


def _gathered_as_objects(f: Facts, m: Module):
    """In-batch negatives exchanged as plain objects (`dist.all_gather_object`, or a project helper that pickles
    them through a collective) from detached copies, with this rank's own slot put back from its live tensors
    (`if i != rank: use(q) else: use(local_q)`): every rank computes the global loss, but the other ranks' rows
    are constants, so after DDP's average the step is 1/world_size of the single run's for those terms."""
    for c in m.calls:
        fn = m.enclosing(c)
        if fn is None or not c.args or not (callee(c) == "all_gather_object" or (
                f.p.resolve(m, c) and f.collective(m, c))) or any("no_grad" in dotted(d) for d in fn.decorator_list):
            continue
        if not any(_detached(fn, a) for a in c.args):
            continue
        target = next((dotted(a.targets[0]) for a in walk(fn) if isinstance(a, ast.Assign)
                       and a.value is c), None) or (dotted(c.args[0]) if callee(c) == "all_gather_object" else None)
        own_slot = any(isinstance(loop, ast.For) and target and target in {dotted(n) for n in ast.walk(loop.iter)}
                       and any(isinstance(i, ast.If) and involves_rank(i.test, m.rank_tainted) for i in walk(loop))
                       for loop in walk(fn))
        if own_slot and _in_a_loss(f, m, fn):
            yield c, (f"{ast.unparse(c)[:60]} exchanges detached copies, and only this rank's own slot is put back "
                      "from its live tensors: every rank computes the loss over the global batch, but the other "
                      "ranks' rows are constants, so after DDP's average the step is 1/world_size of the single "
                      "run's for those terms — multiply the loss by world_size, or gather with "
                      "torch.distributed.nn.functional.all_gather")


LR_NAME = re.compile(r"(^|_)lr$|^lr_?|learning_rate|learn_rate", re.I)
# (nor a batch size or step count named for the lr schedule it sizes: RF-DETR's `total_batch_size_for_lr`, LeReS's
# `cfg.TRAIN.LR_SCHEDULER_MULTISTEPS`; not `lr_schedule`, which holds the lrs)
NOT_LR = re.compile(r"warmup|decay_steps|step_size|milestone|batch_size|_steps?(_|$)|multistep", re.I)


def _leaf(t: ast.AST) -> str:
    """The name a target writes: `args.lr` -> lr, `param_group['lr']` -> lr (GeoTransformer's register_optimizer)."""
    return const_str(t.slice) or "" if isinstance(t, ast.Subscript) else dotted(t).split(".")[-1]


def _lr_factor_of_a_scheduler(t: ast.AST) -> bool:
    """`configs['scheduler_args']['scale_ratio'] = world_size * batch_size / 64` (WeSpeaker): a factor the scheduler
    or optimizer is built with, which multiplies its lr."""
    keys = []
    while isinstance(t, (ast.Subscript, ast.Attribute)):
        keys.append(const_str(t.slice) or "" if isinstance(t, ast.Subscript) else t.attr)
        t = t.value
    return len(keys) > 1 and re.search(r"scale|ratio|factor|mult", keys[0], re.I) is not None and any(
        re.search(r"sched|optim", k, re.I) for k in keys[1:])


@rule("lr-grows-with-world-size", "01_unchanged", "the learning rate is multiplied by the GPU count (directly or "
      "through a global batch that grows with it): at two ranks every step uses another lr than the single run")
def lr_grows_with_world_size(f: Facts, m: Module):
    holding = world_holding(f, m)
    found = []
    for n in m.nodes:
        if isinstance(n, ast.Assign) and any(LR_NAME.search(_leaf(t)) and not NOT_LR.search(
                dotted(t)) or _lr_factor_of_a_scheduler(t) for t in n.targets) and grows(n.value, holding) and \
                not never_read(f, m, n):
            found.append((n, n.value, ast.unparse(n)))
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and any(
                LR_NAME.search(_leaf(t)) for t in n.targets) and _scales_by_the_count(f, m, n.value):
            found.append((n, n.value, ast.unparse(n)))  # (asv-subtools' `lr = utils.auto_scale_lr(lr)`)
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Mult) and LR_NAME.search(_leaf(n.target)) and (
                grows(n.value, holding) or a_count(n.value, holding)):  # `hp["learning_rate"] *= get_world_size()`
            found.append((n, n, ast.unparse(n)))
        elif isinstance(n, ast.Call) and kw(n, "lr") is not None and grows(kw(n, "lr"), holding):
            found.append((kw(n, "lr"), kw(n, "lr"), f"lr={ast.unparse(kw(n, 'lr'))}"))  # (at the scaling line)
        elif isinstance(n, ast.Call) and re.search(r"warm", callee(n), re.I) and (v := kw(n, "multiplier")) is not \
                None and (grows(v, holding) or a_count(v, holding)):  # SeLaVi's GradualWarmupScheduler(multiplier=ws)
            found.append((v, v, f"multiplier={ast.unparse(v)}"))
        elif isinstance(n, ast.Return) and n.value is not None and grows(n.value, set()) and isinstance(
                m.enclosing(n), ast.FunctionDef) and LR_NAME.search(m.enclosing(n).name) and not NOT_LR.search(
                m.enclosing(n).name):  # an lr helper (EfficientNetV2's `def lr(args): return 0.256 *
            # args.batch_size * args.world_size / 4096`), the count named in the return itself: not a scheduler's
            # get_lr whose `multiplier` another function of the module scales (RQ-VAE's, mode 'fix' by default)
            found.append((n, n.value, ast.unparse(n)))
        elif isinstance(n, ast.Dict):  # a parameter group (TSP's `{'params': ..., 'lr': args.fc_lr * args.world_size}`)
            found += [(v, v, f"'lr': {ast.unparse(v)}") for k, v in zip(n.keys, n.values, strict=True)
                      if const_str(k) == "lr" and grows(v, holding)]
    # the scaling itself (`lr = base_lr * bs * get_world_size() / 512`) before a copy of a name it writes later
    # (`base_lr = args.lr` read before DyTox's loop assigns the scaled lr back to args.lr)
    # ... and the one that names the count itself (XNAS's `init_lr = cfg.OPTIM.BASE_LR * cfg.NUM_GPUS`) before one
    # that grows only through a name holding it (its warm-up helper's `new_lr = ... * (init_lr - warmup_lr)`)
    found.sort(key=lambda x: (not any(isinstance(b, ast.BinOp) for b in ast.walk(x[1])), not involves(x[1], WORLDISH)))
    # (the arm the default run takes: PixPro's `if args.optimizer == 'sgd': ... elif ... 'lars':` with the launch
    # script's --optimizer lars; the registry would drop a finding in the other arm, not pick the next)
    found = [x for x in found if not off_the_default_path(f, m, x[0])] or found
    found = [x for x in found if not _per_rank_share_times_the_count(m, x[1])]
    # a scaling helper nothing in the project calls (Vesper's scale_learning_rate, never used) scales nothing
    found = [x for x in found if m.enclosing(x[0]) is None or m.class_of(m.enclosing(x[0]))
             or not _uncalled(f, m, m.enclosing(x[0]))]  # (a method: its object may be built under an alias)
    for n, value, where in found:
        # at the line of the growing product when the statement spans lines (iBOT's cosine_scheduler(...) call)
        n = next((x for x in ast.walk(value) if isinstance(x, ast.BinOp) and grows(x, holding)), n)
        fn = m.enclosing(n)  # a scaling helper (FSCIL's lr_scaler): where it is called builds the optimizer
        callers = f.p.callers(m, fn)[:3] if fn is not None else []
        yield Hit(n, (f"`{where[:90]}` grows the learning rate with the number of GPUs: the single run and the "
                      "2-rank run step with different lrs, so their losses part from the first step (linear scaling "
                      "is a choice, not a port) — keep the lr and the global batch fixed when you check the port, and "
                      "scale both deliberately afterwards"), related=tuple(callers))
        return  # one finding: the lr is one value


def _per_rank_share_times_the_count(m: Module, value: ast.AST) -> bool:
    """`args.batch_size * args.world_size` where the same script set `args.batch_size = int(args.batch_size /
    args.world_size)` (SlotCon): the product is the total batch the user gave, the same at any GPU count. (Not a
    sibling script's division: CLD's ImageNet main divides, its CIFAR script does not.)"""
    shares = {dotted(t) for mm in [m] for a in mm.nodes if isinstance(a, ast.Assign)
              for t in a.targets for d in ast.walk(a.value) if isinstance(d, ast.BinOp) and isinstance(
                  d.op, (ast.Div, ast.FloorDiv)) and dotted(d.left) == dotted(t) and involves(d.right, WORLDISH)}
    return any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mult) and (
        dotted(b.left) in shares and involves(b.right, WORLDISH) or dotted(b.right) in shares and involves(
            b.left, WORLDISH)) for b in ast.walk(value)) if shares else False


def _scales_by_the_count(f: Facts, m: Module, c: ast.Call) -> bool:
    """A project helper that returns its argument times the GPU count in the arm a DDP run takes (asv-subtools'
    `def auto_scale_lr(lr): ... elif use_ddp(): return lr * dist.get_world_size()`)."""
    return any(isinstance(r, ast.Return) and r.value is not None and grows(r.value, world_holding(f, tm))
               for tm, tf in f.p.resolve(m, c) for r in walk(tf))

