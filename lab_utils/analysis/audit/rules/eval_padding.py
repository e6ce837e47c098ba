"""Chapter 08's padding sampler in evaluation: a DistributedSampler that repeats samples to even the shards, in an
evaluation whose metrics are reduced over ranks, counts the duplicates."""

from __future__ import annotations

import ast
import re

from ..evaluation import dedups_gathered_ids, evaluations_of
from ..facts import Facts
from ..loaders import (
    discarded,
    handed_sampler_class,
    loader_names,
    not_built_for,
    trains_over,
    trimmed_to_ranks,
    used_only_when_off,
)
from ..project import Module
from ..registry import Hit, rule
from ..syntax import (
    DIST_SWITCH,
    EVAL_WORD,
    EVALISH,
    REDUCING,
    TRAIN_WORD,
    callee,
    const_value,
    dotted,
    kw,
    rank_reducing_name,
    spread_kw,
    walk,
)
from .samplers import sampler_label


def _eval_words(node: ast.AST) -> bool:
    """A name part or a string that names an evaluation split: 'val', `cfg.TEST.SPLIT`, `val_loader`,
    `construct_test_loader`; not a word that merely contains the letters (`interval`, `value`)."""
    words = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    words += [w for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))
              for w in re.split(r"[._]", dotted(n) or getattr(n, "attr", ""))]
    return any(EVAL_WORD.fullmatch(w) for w in words)


def _in_training_arm(m: Module, c: ast.Call) -> bool | None:
    """True when the sampler sits under `if is_training:` (a helper that builds either split on a switch), False
    in that if's else arm, None when no such switch encloses it."""
    child, n = c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and any(TRAIN_WORD.fullmatch(w) for x in ast.walk(n.test)
                                         if isinstance(x, (ast.Name, ast.Attribute))
                                         for w in re.split(r"[._]", dotted(x))):
            if any(child is s for s in n.body):
                return True
            if any(child is s for s in n.orelse):
                return False
        child, n = n, m.parent.get(id(n))
    return None


def _collective_inside(f: Facts, mm: Module, call: ast.Call) -> tuple:
    """The collective a reducing call runs inside the project helper it calls (`mse, mae =
    self.test_long_term_forecast(...)`, whose gather_tensors_from_all_gpus all-gathers the predictions), as a
    second related place: where the duplicates are merged in."""
    for tm, tf in f.p.resolve(mm, call):
        for x in walk(tf):
            if isinstance(x, ast.Call) and (callee(x) in REDUCING or rank_reducing_name(x)
                                            and f.p.resolve(tm, x)):
                return ((tm, x),)  # dist.all_gather(...), or a project helper named so (gather_tensors_from_all_gpus)
    return ()


def _kept_for_training(m: Module, c: ast.Call) -> bool:
    """A helper of either split builds the sampler but hands it to the loader only for training (`sampler=sampler
    if train else None`, FourCastNet's get_data_loader): the evaluation loader reads the whole set, unpadded."""
    up = m.parent.get(id(c))
    while isinstance(up, ast.IfExp):
        up = m.parent.get(id(up))
    if not (isinstance(up, ast.Assign) and len(up.targets) == 1 and isinstance(up.targets[0], ast.Name)):
        return False
    name = up.targets[0].id
    uses = [n for n in ast.walk(m.enclosing(c) or m.tree) if isinstance(n, ast.Name) and n.id == name
            and isinstance(n.ctx, ast.Load)]
    def training_test(test):
        return isinstance(test, (ast.Name, ast.Attribute)) and TRAIN_WORD.fullmatch(dotted(test).split(".")[-1])

    def for_training_only(n):  # `sampler if train else None`, or under `if train: return loader, sampler`
        child, up = n, m.parent.get(id(n))
        while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            if isinstance(up, ast.IfExp) and up.body is child and isinstance(up.orelse, ast.Constant) and \
                    up.orelse.value is None and training_test(up.test):
                return True
            if isinstance(up, ast.If) and any(child is b for b in up.body) and training_test(up.test):
                return True
            child, up = up, m.parent.get(id(up))
        return False
    return bool(uses) and all(for_training_only(n) for n in uses)


def _choosing_argument(m: Module, c: ast.Call, call: ast.Call) -> ast.AST:
    """The argument of `call` that makes the helper build the sampler `c`: `distributed=args.distributed` when
    the helper builds it under `if distributed and ...:`; the call itself when no parameter decides."""
    fn = m.enclosing(c)
    if fn is None:
        return call
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    n, deciding = m.parent.get(id(c)), set()
    while n is not None and n is not fn:
        if isinstance(n, ast.If):
            deciding |= {x.id for x in ast.walk(n.test) if isinstance(x, ast.Name)} & params
        n = m.parent.get(id(n))
    # the switch that makes it a distributed sampler first (`distributed=`), then the split's (`is_training=`)
    chosen = sorted((k for k in call.keywords if k.arg in deciding), key=lambda k: not DIST_SWITCH.search(k.arg))
    return chosen[0].value if chosen else call


def _built_for_evaluation(f: Facts, m: Module, c: ast.Call, depth: int = 3):
    """The call that asks a generic helper for an evaluation split (see _evaluation_caller), or False."""
    if _in_training_arm(m, c):
        return False
    return _evaluation_caller(f, m, c, depth) or False


def _evaluation_caller(f: Facts, m: Module, c: ast.Call, depth: int = 3, every: bool = False):
    """A sampler made in a generic helper (`create_sampler(dataset, shuffle, cfg)`, `_construct_loader(name,
    split, ...)`) is an evaluation sampler when some chain of callers asks for an evaluation split: a call with
    'val' or `split=cfg.TEST.SPLIT`, assigned to `val_loader`, or made inside `construct_test_loader`."""
    fn = m.enclosing(c)
    data = dotted(c.args[0]) if c.args else ""
    others = [x for x in ast.walk(fn or m.tree) if isinstance(x, ast.Call) and x is not c and (
        callee(x) in f.sampler_classes() or callee(x) == "DataLoader") and x.args and dotted(x.args[0]) != data]
    if others and any(TRAIN_WORD.fullmatch(w) for w in re.split(r"[._ ]", sampler_label(m, c))):
        return False  # the training split's sampler of a helper that also builds the evaluation one (a helper
        # with one sampler for every split's dataset, named `train_datasampler` in Timer's data_provider, builds
        # the evaluation one too)
    if fn is not None and not isinstance(fn, ast.ClassDef) and not f.p.callers(m, fn) and any(
            TRAIN_WORD.fullmatch(a.arg) for a in fn.args.args + fn.args.kwonlyargs):
        # a builder of either split (`def build_custom_dataloader(cfg, training, ...)`) that no audited file
        # calls (its caller is not in these files): called with training false, it builds the evaluation one
        return m, c
    todo, seen, found = [(m, fn, 0)], set(), []  # (every: each call that asks, in OpenTAD both val and test)
    while todo:
        mod, fn, d = todo.pop()
        if fn is None or id(fn) in seen or d >= depth:
            continue
        seen.add(id(fn))
        for cm, call in f.p.callers(mod, fn):
            outer = cm.enclosing(call)
            target = cm.parent.get(id(call))
            if _eval_words(ast.Tuple(elts=[*call.args, *[k.value for k in call.keywords]])) or (
                    isinstance(target, ast.Assign) and any(_eval_words(t) for t in target.targets)) or (
                    outer is not None and any(EVAL_WORD.fullmatch(w) for w in outer.name.split("_"))):
                if not every:
                    return cm, call
                found.append((cm, call))
                continue
            if isinstance(target, ast.Assign) and any(TRAIN_WORD.fullmatch(w) for t in target.targets
                                                      for w in re.split(r"[._ ]", dotted(t))):
                continue  # the training split's call (EfficientDet's `loader_train = create_loader(...)`): its
                # callers ask for the evaluation split through the helper's other call, found on its own
            todo.append((cm, outer, d + 1))
    return found if every else None


def _pads(f: Facts, name: str) -> bool:
    """Whether a sampler class repeats samples to even the shards: torch's DistributedSampler does (without
    drop_last), and so does a project subclass that keeps its __iter__; a project class of its own pads only if
    its code does (a ceil of len / replicas, a total_size, indices extended by their own head). A class that
    cuts contiguous, unpadded shards (`np.linspace(0, len(ds), n + 1)`) counts nothing twice."""
    found = [(mm, cd) for mm in f.p.modules.values() for nm, cd in mm.classes.items() if nm == name]
    if not found:
        return True  # torch's, or a class the audited files do not hold
    for _mm, cd in found:
        own_iter = any(isinstance(d, ast.FunctionDef) and d.name == "__iter__" for d in cd.body)
        if any("DistributedSampler" in dotted(b) for b in cd.bases) and not own_iter and not _total_is_length(cd):
            return True  # (unless it sets total_size to the set's length: torch's __iter__ then pads nothing,
            # GDKD's DistributedEvalSampler, which gives the first ranks one sample more)
        if _extends_by_its_own_head(cd):
            return True  # the padding itself (code only: NeWCRFs's sampler keeps torch's line commented out)
        text = ast.unparse(cd)
        if not own_iter and ("ceil" in text or "total_size" in text) and not _total_is_length(cd):
            return True
    return False


def _total_is_length(cd: ast.ClassDef) -> bool:
    """`self.total_size = len(self.dataset)` in the class: the padding torch's __iter__ adds is total_size minus
    the length, none."""
    return any(isinstance(n, ast.Assign) and any(dotted(t) == "self.total_size" for t in n.targets)
               and isinstance(n.value, ast.Call) and callee(n.value) == "len" for n in ast.walk(cd))


def _extends_by_its_own_head(cd: ast.ClassDef) -> bool:
    """`indices += indices[:pad]`, `idx = idx + idx[:pad]`, `indices.extend(indices[:pad])`, or
    `np.concatenate([indices, indices[:pad]])`: a list padded with repeats of its own head."""
    def own_slice(v: ast.AST, name: str) -> bool:
        return any(isinstance(x, ast.Subscript) and dotted(x.value) == name for x in ast.walk(v))
    for n in ast.walk(cd):
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) and own_slice(n.value, dotted(n.target)):
            return True
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, (ast.BinOp, ast.Call)):
            name = dotted(n.targets[0])
            parts = [n.value.left, n.value.right] if isinstance(n.value, ast.BinOp) else [
                e for a in n.value.args if isinstance(a, (ast.List, ast.Tuple)) for e in a.elts]
            if name and len(parts) == 2 and dotted(parts[0]) == name and own_slice(parts[1], name):
                return True
        if isinstance(n, ast.Call) and callee(n) == "extend" and isinstance(n.func, ast.Attribute) and n.args and \
                own_slice(n.args[0], dotted(n.func.value)):
            return True
    return False


@rule("eval-padding-duplicates", "08_checkpoints", "a padding DistributedSampler in evaluation plus a reduction over "
      "ranks: the padded duplicates are counted, so the metric is not the single run's")
def eval_padding_duplicates(f: Facts, m: Module):
    told: dict[int, list] = {}  # helper function -> its samplers already reported (one defect per helper)
    for c in sorted(m.calls, key=lambda x: (x.lineno, x.col_offset)):
        kind = callee(c) if callee(c) in f.sampler_classes() else handed_sampler_class(f, m, c)
        if kind not in f.sampler_classes() or not (c.args or kw(c, "dataset")) or not _pads(f, kind) or any(
                k.arg and re.fullmatch(r"pad(ding)?", k.arg) and const_value(k.value) is False for k in c.keywords):
            continue  # (a project sampler told not to pad: RobustNet's `DistributedSampler(val_set, pad=False)`)
        asked = _built_for_evaluation(f, m, c) if not EVALISH.search(sampler_label(m, c)) else None
        if not (EVALISH.search(sampler_label(m, c)) or asked) or any(const_value(v) for v in spread_kw(
                m, c, "drop_last")) or trains_over(m, c) or trimmed_to_ranks(m, c) or discarded(f.p, m, c):
            continue
        flag = f.off_by_default(m, c)
        if flag and not DIST_SWITCH.search(flag):  # (`--distributed` itself is how the DDP run is asked for)
            continue  # `if args.dist_eval:` on a store_true option (DeiT, DyTox): the default run evaluates whole
        if asked and _kept_for_training(m, c) or not asked and used_only_when_off(f, m, c):
            continue  # (or its loader evaluated only under an option off by default: GLNet's --evaluation)
        sites = _evaluation_caller(f, m, c, every=True) if asked else []
        sites = [sites] if isinstance(sites, tuple) else sites or [asked]
        if asked and all(not_built_for(m, c, call) for _, call in sites):
            continue  # every evaluation call takes the helper's arm without the sampler
        if asked and all(f.off_in_default_run(am, call) for am, call in sites):
            continue  # the evaluation split is asked for only under an option off by default (VICRegL's --evaluate)
        if m.enclosing(c) is not None and f.p.overridden(m, m.enclosing(c)):
            continue  # a base class's loader builder the run's own subclass replaces: reported in that one
        near = {mm.rel for mm in f.p.related(m)}  # (a reduction in another script's evaluation counts nothing in
        # a script: CLaMP 3's train_cls.py reduces nothing, its sibling train_clamp3_audio.py does; a helper no
        # audited file imports is judged by the project's, UniAD's loader builder)
        if any(r[0].rel in near or not m.entry for r in f.eval_loop_reduces()) and not dedups_gathered_ids(
                f, evaluations_of(f.p, loader_names(f.p, m, c))):
            # the reduction that counts the duplicates, as a related place: one in a file that runs with this one
            # (up to three: UniTS's test() reduces in one helper per task)
            # (a call that reduces before a class built there: Spann3R's synchronize_between_processes(), then
            # the MetricLogger(...) whose method it is)
            reduced = tuple(x for r in sorted(f.eval_loop_reduces(), key=lambda r: (
                r[0].rel not in near, callee(r[1])[:1].isupper()))[:3]
                            for x in (r, *_collective_inside(f, *r)))
            what = ("pads the set to a multiple of world_size with repeated samples, and the evaluation loop reduces "
                    "its metrics over ranks: the duplicates are counted, so the metric is not the single run's unless "
                    "len(dataset) % world_size == 0 — shard without padding, or drop the padded tail")
            if asked and asked[0] is not m and asked[0].entry:
                # One defect per evaluation split, one finding each: shown in the script that asks the helper for
                # that split's sampler (the argument to change), with the helper's sampler as its related place.
                for am, call in [x for x in _evaluation_caller(f, m, c, every=True) if x[0].entry] or [asked]:
                    yield Hit(_choosing_argument(m, c, call), f"{ast.unparse(call.func)}(...) gets the evaluation "
                              f"split's {callee(c)} ({m.rel}:{c.lineno}), which {what}", "check-by-hand", am,
                              related=((m, c), *reduced))
            elif m.enclosing(c) is not None and id(m.enclosing(c)) in told:
                # another branch of the same helper, or its test split's twin beside the validation one
                # (InternImage's sampler_val and sampler_test in build_loader): the same defect, one finding
                told[id(m.enclosing(c))].append((m, c))
            else:
                others = told.setdefault(id(m.enclosing(c)), []) if m.enclosing(c) is not None else []
                others += [(m, x) for x in m.calls if x is not c and callee(x) == callee(c)
                           and m.enclosing(x) is m.enclosing(c)]
                # (and the call that asks the helper for the evaluation split: UniFormerV2's `construct_loader(cfg,
                # "val")` in train_net.py, where a reader looks)
                sites = _evaluation_caller(f, m, c, every=True) if asked else []
                asking = tuple(x for x in ([sites] if isinstance(sites, tuple) else sites or []) if x[0] is not m)[:2]
                yield Hit(c, f"{callee(c)}({ast.unparse(c.args[0] if c.args else kw(c, 'dataset'))}) {what}",
                          "check-by-hand",
                          related=(*others, *asking, *reduced))
