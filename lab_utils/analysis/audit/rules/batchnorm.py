"""Chapter 07: BatchNorm under DDP, in the script's own model, in the project classes it builds, in a project
factory (by name or by a string), or in a torchvision model made by name."""

from __future__ import annotations

import ast
import re

from ..batchnorm_layers import is_batchnorm
from ..batchnorm_models import (
    arm_off_by_default,
    handed_to_a_wrap_helper,
    wrapped_batchnorm,
    wrapped_from_unseen_factories,
)
from ..facts import Facts
from ..options import option_text
from ..project import Module
from ..registry import Hit, rule
from ..scripts import evaluation_script
from ..switches import is_switch_test
from ..syntax import callee, const_str, const_value, dotted, kw, walk


@rule("batchnorm-without-sync", "07_batchnorm", "BatchNorm under DDP without SyncBatchNorm: each rank normalises "
      "with its own micro-batch's statistics")
def batchnorm_without_sync(f: Facts, m: Module):
    if not m.entry and not any(m.rel in f.p.imports_of(e) for e in f.p.modules.values() if e.entry) and not any(
            f.is_ddp_call(m, c) for c in m.calls):
        return  # a library no audited script runs, and that wraps no model itself: its scripts decide
    if m.entry and evaluation_script(f, m):
        return  # a test script: BatchNorm in eval mode uses its running statistics, the same on every rank
    related = f.p.related(m)
    if _trains_in_eval_mode(m, related):
        return  # a linear probe (PCL's eval_cls_imagenet.py): BatchNorm in eval mode uses its running statistics
    bns = [c for c in m.calls if is_batchnorm(m, c)] if m.entry else []
    converts = [c for c in m.calls if callee(c) in ("convert_sync_batchnorm", "convert_syncbn_model")]
    wraps = any(f.is_ddp_call(m, c) for c in m.calls)  # a run(settings) module a launcher imports by name wraps too
    if not converts and (m.entry or wraps) and not any(
            isinstance(n, (ast.Name, ast.Attribute)) and dotted(n).split(".")[-1] in SYNC_NAMES
            and not (isinstance(mm.parent.get(id(n)), ast.Call) and mm.parent.get(id(n)).func is n
                     and dotted(n).split(".")[-1] == "SyncBatchNorm") for mm in related for n in mm.nodes):
        # (`nn.SyncBatchNorm(c)` built as one model's layer, LlamaGen's VQ model under norm_type='batch', converts no
        # other model's BatchNorm: only a conversion call, or SyncBatchNorm chosen as the norm class, speaks)
        wrap, bn = wrapped_batchnorm(f, m)
        if wrap is not None and arm_off_by_default(f, *bn):
            return  # the BatchNorm arm of a norm option whose default picks another norm (PLOP's 'iabn_sync')
        if wrap is None and bns:  # BatchNorm in the script itself, whatever model it ends up in
            wrap, bn = bns[0], (m, bns[0])
        if wrap is None:
            handed = handed_to_a_wrap_helper(f, m)
            if handed is not None:
                c, factory, (dm, cls, param), (wm, w) = handed
                yield Hit(c, (f"{callee(c)}() wraps the model in DDP, and the model comes from {factory}(), which "
                          f"these files do not hold; the project's {cls.name} normalises with BatchNorm by default "
                          f"({dm.rel}:{param.lineno}: '{param.value}') and nothing converts it to SyncBatchNorm: at 2 "
                          "ranks each rank would normalise with its own half-batch's statistics, unlike the single "
                          "run — check whether the model holds it; nn.SyncBatchNorm.convert_sync_batchnorm(model) "
                          "before DDP"), "check-by-hand", related=((wm, w),))
                return
        if wrap is None:
            unseen = wrapped_from_unseen_factories(f, m)
            if unseen is not None and not _a_model_converts_itself(f):
                w, factory, (bm, node), why = unseen
                yield Hit(w, (f"the model wrapped here comes from {factory}(), whose class these files do not name "
                              f"in code, and {why} ({bm.rel}:{node.lineno}); nothing "
                              "converts it to SyncBatchNorm: at 2 ranks each rank would normalise with its own "
                              "half-batch's statistics, unlike the single run — check which model the factory "
                              "builds; nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP"), "check-by-hand",
                          related=((bm, node),))
                return
        if wrap is None and m.entry:
            ignored = _sync_option_ignored(f, m)
            if ignored is not None:
                w, (om, opt) = ignored
                yield Hit(w, (f"the script offers {const_str(opt.args[0])} ({om.rel}:{opt.lineno}), which says its "
                              "model has BatchNorm, but nothing reads the option and nothing converts the model "
                              "to SyncBatchNorm: at 2 ranks each rank normalises with its own half-batch's "
                              "statistics, unlike the single run — nn.SyncBatchNorm.convert_sync_batchnorm(model) "
                              "before DDP when the option is set"), related=((om, opt),))
                return
        if wrap is not None:
            where = f"{bn[0].rel}:{bn[1].lineno}" if bn[0] is not m else f"line {bn[1].lineno}"
            yield Hit(wrap, (f"the model wrapped here has BatchNorm ({where}) and nothing converts it to "
                             "SyncBatchNorm: at 2 ranks each rank normalises with its own half-batch's statistics (and "
                             "keeps its own running stats), unlike the single run's whole batch — "
                             "nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP"),
                      related=(((bn[0], bn[1]),) if bn[1] is not wrap else ()) + f.p.script_calls(m, wrap))
        return
    # a flag that gates the DDP wrap as well (`if args.distributed:` around both) is the distributed switch, not an
    # opt-in to SyncBatchNorm: every DDP run converts
    gates = [g if g is None or not any(isinstance(w, ast.Call) and f.is_ddp_call(m, w) for w in ast.walk(g[1]))
             and not _gates_the_process_group(f, g[1]) else None for g in (f.flag_gate(m, c) for c in converts)]
    if converts and all(gates) and not _registered_models_without_bn(f):
        # offering --sync-bn says the model has BatchNorm; the default run goes without
        flag, test = gates[0]
        # (named with it: the wrap that takes the unconverted model, and the option's definition)
        places = [(m, w) for w in m.calls if f.is_ddp_call(m, w)] + [
            (mm, a) for mm in {m, *f.p.related(m)} for a in mm.calls if callee(a) == "add_argument" and any(
                (const_str(x) or "").lstrip("-").replace("-", "_") == flag.replace("-", "_") for x in a.args)] + \
            f.yaml_places(flag.split(".")[-1])[:2]  # (where a config turns it off: US3L's `SYNC_BN: False`)
        yield Hit(test, (f"SyncBatchNorm only with {option_text(flag)}, which is off by default: the default DDP run "
                         "normalises each rank's micro-batch with its own statistics, unlike the single run — "
                         "turn the flag on when you compare the port"), related=tuple(places))
        return
    unseen = [_unseen_option(f, m, c) for c in converts]
    if converts and all(unseen):
        test, name = unseen[0]
        yield test, (f"SyncBatchNorm only when `{name}` is set, an option these files never define (its parser is "
                     "elsewhere): if it is off by default, as such switches usually are, the default DDP run "
                     "normalises each rank's micro-batch with its own statistics, unlike the single run — check "
                     "its default; turn it on when you compare the port"), "check-by-hand"


def _gates_the_process_group(f: Facts, test: ast.If) -> bool:
    """The same test gates init_process_group or a DDP wrap elsewhere in the project (MatteFormer's `if
    CONFIG.dist:` in main.py and around convert_sync_batchnorm in the trainer): the distributed switch, which every
    DDP run turns on, not an opt-in to SyncBatchNorm."""
    text = dotted(test.test) if isinstance(test, ast.If) else ""
    return bool(text) and any(isinstance(i, ast.If) and dotted(i.test) == text and any(
        isinstance(w, ast.Call) and (callee(w) == "init_process_group" or f.is_ddp_call(mm, w)) for w in ast.walk(i))
        for mm in f.p.modules.values() for i in mm.nodes)


def _trains_in_eval_mode(m: Module, related) -> bool:
    """Every function of the script's files that calls backward() puts the model in eval mode (`model.eval()`) and
    never back in train mode: a linear probe over a frozen backbone (MoCo's and PCL's main_lincls), whose BatchNorm
    normalises with its running statistics, the same on every rank as in the single run."""
    steps = [fn for mm in {m, *related} for fn in mm.functions.values()
             if any(isinstance(c, ast.Call) and callee(c) == "backward" for c in walk(fn))]

    def modes(fn, name):
        return [c for c in walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                and c.func.attr == name and not (name == "train" and c.args and const_value(c.args[0]) is False)]
    return bool(steps) and all(modes(fn, "eval") and not modes(fn, "train") for fn in steps)


def _sync_option_ignored(f: Facts, m: Module) -> tuple[ast.Call, tuple[Module, ast.Call]] | None:
    """(the script's DDP wrap, the `--sync-bn` add_argument) when the script parses a SyncBatchNorm option that no
    file reads (YOLOP's `--sync-bn`, parsed and never used): offering it says the model has BatchNorm, in model
    files the audit may not hold, and no run converts it."""
    wraps = [c for c in m.calls if f.is_ddp_call(m, c)]
    opts = [(mm, a) for mm in (m, *f.p.related(m)) for a in mm.calls if callee(a) == "add_argument" and a.args
            and SYNC_OPTION.fullmatch((const_str(a.args[0]) or "").lstrip("-").replace("-", "_").lower())]
    if not wraps or not opts:
        return None
    om, opt = opts[0]
    attr = (const_str(kw(opt, "dest")) or (const_str(opt.args[0]) or "").lstrip("-")).replace("-", "_")
    read = any(isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Load)
               for mm in f.p.modules.values() for n in mm.nodes)
    return None if read else (wraps[0], (om, opt))


def _unseen_option(f: Facts, m: Module, c: ast.Call) -> tuple[ast.If, str] | None:
    """(the `if args.sync_bn:` around the conversion, the option) when the option is read but no audited file
    defines it (no add_argument, no assignment): Point-MAE's parser lives in a file the audit was not given."""
    child, n = c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        read = _option_read(m, n.test) if isinstance(n, ast.If) and any(child is s for s in n.body) else None
        if read is not None and not is_switch_test(read):
            attr = read.attr
            nodes = [(mm, a) for mm in f.p.modules.values() for a in mm.nodes]
            bound = {dotted(t).split(".")[-1] for _, a in nodes if isinstance(a, (ast.Assign, ast.AnnAssign))
                     for t in (a.targets if isinstance(a, ast.Assign) else [a.target])}
            defined = attr in bound or any(callee(a) == "add_argument" and any(
                (const_str(x) or "").lstrip("-").replace("-", "_") == attr for x in a.args) or const_str(
                kw(a, "dest")) == attr for _, a in nodes if isinstance(a, ast.Call)) or any(
                isinstance(i, ast.If) and dotted(i.test) == dotted(read) and any(isinstance(
                    w, ast.Call) and f.is_ddp_call(mm, w) for w in ast.walk(i)) for mm, i in nodes)
            # (the last: the distributed switch, which gates the DDP wrap too: GCA-Matting's CONFIG.dist; or the
            # project's YAML config sets it on, CRIS's `sync_bn: True` read into args)
            return None if defined or f._yaml_turns_on(attr) else (n, dotted(read))
        child, n = n, m.parent.get(id(n))
    return None


def _option_read(m: Module, test: ast.expr) -> ast.Attribute | None:
    """The option a test reads: `args.sync_bn`, or the first conjunct of an `and` that reads one, through `==
    True` and a local copy (TAdaConv's `sync_bn = cfg.BN.SYNC`, then `if sync_bn == True and cfg.NUM_GPUS * ... >
    1:`)."""
    for t in (test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test])[:1]:
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.Is)) and \
                const_value(t.comparators[0]) is True:
            t = t.left
        if isinstance(t, ast.Name):
            bound = [a.value for a in walk(m.enclosing(test) or m.tree) if isinstance(a, ast.Assign) and any(
                isinstance(x, ast.Name) and x.id == t.id for x in a.targets) and a.lineno < test.lineno]
            t = bound[0] if len(bound) == 1 else t
        if isinstance(t, ast.Attribute) and isinstance(t.value, (ast.Name, ast.Attribute)):
            return t
    return None


SYNC_NAMES = {"SyncBatchNorm", "convert_sync_batchnorm", "convert_syncbn_model"}


def _a_model_converts_itself(f: Facts) -> bool:
    """A project class converts its own layers (MoBY's __init__: `nn.SyncBatchNorm.convert_sync_batchnorm(
    self.projector)`, in place): the project syncs BatchNorm in model code, so a model from an unseen factory is
    no evidence of plain BatchNorm."""
    return any(callee(c) in ("convert_sync_batchnorm", "convert_syncbn_model") and mm.class_of(mm.enclosing(c))
               for mm in f.p.modules.values() for c in mm.calls if mm.enclosing(c) is not None)
SYNC_OPTION = re.compile(r"sync_?bn|sync_?batch_?norm|syncbn")


def _registered_models_without_bn(f: Facts) -> bool:
    """The project's own timm-registered models (`@register_model def CSWin_64_12211_tiny_224(...)`) build no
    BatchNorm: the --sync-bn a timm-derived script keeps offers nothing for them (CSWin's LayerNorm blocks)."""
    homes = [mm for mm in f.p.modules.values() if any(isinstance(fn, ast.FunctionDef) and any(
        dotted(d).split(".")[-1] == "register_model" for d in fn.decorator_list) for fn in mm.functions.values())]
    return bool(homes) and not any(isinstance(c, ast.Call) and is_batchnorm(mm, c) for mm in homes for c in mm.calls)
