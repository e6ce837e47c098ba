"""Which evaluation loops of a project bring every rank's results together (an all_reduce of the metric, an
all_gather of the predictions): chapter 08's padding rule needs one to count the padded duplicates."""

from __future__ import annotations

import ast
import re

from .project import Module
from .syntax import (
    EVAL_WORD,
    EVALISH,
    REDUCING,
    WORLDISH,
    callee,
    const_str,
    dict_view,
    dotted,
    reduces_or_gathers,
    walk,
)


def eval_loop_reduces(facts) -> list[tuple[Module, ast.Call]]:
    """Where some evaluation loop of the project reduces over ranks (empty when none does): a loop over a
    val/test loader, or any loop of a function named so (evaluate(), validate()), with a collective in it or
    in a helper it calls, or in one that helper calls (`test_sample_depth` -> `reduce_scalar_outputs`)."""
    out = []
    for mm in facts.p.modules.values():
        for f in [*mm.functions.values(), *_script_body(mm)]:
            named = EVALISH.search(f.name) or any(EVAL_WORD.fullmatch(w) for w in f.name.split("_"))
            if _drops_the_padding(f):
                continue
            # ... or a gather of what an evaluation helper returned (`x, y = eval_dataset(model, dl_eval)`, then
            # all_gather(all_x, x), hyp_metric's get_emb)
            evaluated = {dotted(t) for a in ast.walk(f) if isinstance(a, ast.Assign) and isinstance(
                a.value, ast.Call) and EVALISH.search(callee(a.value)) and facts.p.resolve(mm, a.value)
                         for tt in a.targets for t in (tt.elts if isinstance(tt, ast.Tuple) else [tt])}
            if not any(isinstance(n, ast.For) and (named or EVALISH.search(ast.unparse(n.iter))
                                                   and not dict_view(n.iter)) for n in ast.walk(f)) and not any(
                    isinstance(n, ast.Call) and callee(n) in REDUCING and any(
                        dotted(x) in evaluated for a in n.args for x in ast.walk(a)) for n in ast.walk(f)):
                continue
            if not facts.p.callers(mm, f) and f.name.split(".")[-1] not in facts.all_names() and f.name != "<script>":
                continue  # an evaluation nothing calls (Point-MAE's validate(), its call commented out)
            # in a function not named for evaluation, only what its evaluation loops (or the evaluated values)
            # reduce: SSD's do_train reduces its training losses, and loops over eval_results elsewhere
            loops = [n for n in ast.walk(f) if isinstance(n, ast.For) and EVALISH.search(ast.unparse(n.iter))
                     and not dict_view(n.iter)]
            first = min((lp.lineno for lp in loops), default=0)
            inside = None if named else {id(x) for lp in loops for x in ast.walk(lp)} | {
                id(n) for n in ast.walk(f) if isinstance(n, ast.Call) and (any(
                    dotted(x) in evaluated for a in n.args for x in ast.walk(a)) or loops and n.lineno > first)}
            # (a reduction after the evaluation loop, Depth Anything's all_reduce of the metric sums, counts)
            out += [(mm, n) for n in ast.walk(f) if isinstance(n, ast.Call) and (inside is None or id(n) in inside)
                    and (
                    callee(n) in ("all_reduce", "reduce", "all_gather", "gather", "all_gather_object",
                                  "gather_object", "all_gather_into_tensor") and (
                        "dist" in dotted(n.func) and callee(n) != "gather" or dotted(n.func) in (
                            "dist.gather", "torch.distributed.gather") or isinstance(n.func, ast.Name)
                        and mm.imports.get(n.func.id, ("",))[0].startswith("torch.distributed")) or
                    # (`from torch.distributed import all_gather`: the retina grader's eval)
                    _unseen_gather(facts, mm, n) or
                    any(facts.p.function_does(tm, tf, reduces_or_gathers, 2) and _counts_through(facts, tm, tf, 2)
                        for tm, tf in facts.p.resolve(mm, n) or facts.one_method(n)))
                    # (an untyped evaluator's method the project defines once: EfficientDet's
                    # `evaluator.add_predictions(output, target)`, which all-gathers the detections)
                    and not _merged_by_key(mm, f, n) and not _unfed_meter(mm, f, n)
                    and not _helper_scatters(facts, mm, n) and not _reduces_unseen_result(facts, mm, f, n)
                    and not any(_drops_the_padding(tf) for _, tf in facts.p.resolve(mm, n))]
    return sorted(out, key=lambda x: (x[0].rel, x[1].lineno))


def _script_body(m: Module) -> list:
    """A script's top-level code as one scope named '<script>' (HPNN's run_ddp.py validates in its `__main__`
    block, with the epoch loop): its evaluation loops count like a function's."""
    body = [s for s in m.tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return [ast.FunctionDef(name="<script>", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                                kw_defaults=[], defaults=[]),
                            body=body, decorator_list=[], lineno=1)] if m.entry and body else []


def _unfed_meter(m: Module, fn: ast.AST, c: ast.Call) -> bool:
    """`metric_logger.log_every(loader, ...)` only paces the loop (and `metric_logger = MetricLogger()` only builds
    it): nothing in the evaluation feeds the logger (`metric_logger.update(...)`), so whatever it reduces holds no
    metric of the evaluation (VidChapters' evaluate(), whose captions are merged by video id)."""
    bound = m.parent.get(id(c))
    if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and c.func.attr == "log_every":
        held = c.func.value.id
    elif isinstance(bound, ast.Assign) and len(bound.targets) == 1 and isinstance(bound.targets[0], ast.Name):
        held = bound.targets[0].id
        if not any(isinstance(x, ast.Call) and callee(x) == "log_every" and dotted(x.func.value) == held
                   for x in walk(fn)):
            return False
    else:
        return False
    return not any(isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr != "log_every"
                   and dotted(x.func.value) == held for x in walk(fn))


def _counts_through(facts, m: Module, fn: ast.AST, depth: int, seen: frozenset = frozenset()) -> bool:
    """`fn`, or a project function it calls (to `depth`), gathers or reduces over ranks, and no function on the way
    cuts the padding off what it gathered (UniGaze's test() -> test_wlabel(), which keeps `[:num_samples]` of what
    misc.gather_tensors brings back)."""
    if _drops_the_padding(fn) or id(fn) in seen:
        return False
    calls = [c for c in walk(fn) if isinstance(c, ast.Call)]
    return any(reduces_or_gathers(m, c) for c in calls) or depth > 0 and any(
        _counts_through(facts, tm, tf, depth - 1, seen | {id(fn)}) for c in calls for tm, tf in facts.p.resolve(m, c))


def _reduces_unseen_result(facts, m: Module, fn: ast.AST, c: ast.Call) -> bool:
    """What the collective brings together is only what an evaluation function the audit cannot read returned
    (`dataset_result = inference(cfg, model, loader, ...)` from a package file the project's copy lacks, appended to
    a list, then `all_gather(torch.tensor(values))`, maskrcnn-benchmark's scene-graph trainers): that function
    computes the metric, and whether it counts the padded duplicates is decided inside it (maskrcnn-benchmark's
    gathers the predictions keyed by image id, mmdet's multi_gpu_test cuts them to len(dataset)), so this reduction
    is not evidence that they are counted. The values are followed through assignments, `.append(...)` and loops."""
    if callee(c) not in REDUCING:
        return False  # a project helper that reduces is judged by its own code
    leaves: list[bool] = []  # one per origin: True for an unseen evaluation's result
    seen: set[str] = set()
    todo = [x for a in c.args for x in _names_in(a, m)]
    while todo and len(seen) < 40:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found = False
        for n in (x for x in walk(fn) if getattr(x, "lineno", c.lineno) < c.lineno):  # what came before it
            if isinstance(n, ast.Assign) and any(isinstance(x, ast.Name) and x.id == name for t in n.targets
                                                 for x in ast.walk(t)):
                value = n.value
            elif isinstance(n, ast.For) and any(isinstance(x, ast.Name) and x.id == name for x in ast.walk(n.target)):
                value = n.iter
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in (
                    "append", "extend") and dotted(n.func.value) == name and n.args:
                value = n.args[0]
            else:
                continue
            found = True
            if isinstance(value, ast.Call) and any(EVAL_WORD.fullmatch(w) for w in callee(value).split("_")) and (
                    dotted(value.func).split(".")[0] in m.imports):  # (imported: not the builtin eval())
                leaves.append(not facts.p.resolve(m, value))
            elif isinstance(value, ast.Call) and facts.p.resolve(m, value):
                leaves.append(False)  # a project function's result: judged by its own code
            else:
                todo += _names_in(value, m)
        if not found:
            leaves.append(False)  # a parameter or a global: whatever it holds is not known here
    return bool(leaves) and all(leaves)


def _names_in(node: ast.AST, m: Module) -> list[str]:
    """The variables an expression reads: not the functions it calls (`float`) nor the modules it calls into
    (`torch` of torch.tensor)."""
    called = {id(x.func) for x in ast.walk(node) if isinstance(x, ast.Call)}
    bound = {x.id for g in ast.walk(node) if isinstance(g, ast.comprehension) for x in ast.walk(g.target)
             if isinstance(x, ast.Name)}  # `t` of `[t.view(-1) for t in gathered]`
    return [x.id for x in ast.walk(node) if isinstance(x, ast.Name) and id(x) not in called
            and x.id not in m.imports and x.id not in bound]


def _merged_by_key(m: Module, fn: ast.AST, c: ast.Call) -> bool:
    """The gathered results are merged into a dict by their sample's key (`for qid2ans in all_gather(quesid2ans):
    for k, v in qid2ans.items(): quesid2ans[k] = v`, VL-T5): a padded duplicate overwrites its own entry, so
    nothing is counted twice."""
    if callee(c) in ("all_reduce", "reduce") and c.args and dotted(c.args[0]) and _scattered_by_index(
            fn, dotted(c.args[0])):
        return True
    if callee(c) == "all_gather" and any(isinstance(x, ast.Call) and callee(x) == "unique" and any(
            k.arg == "return_index" for k in x.keywords) for x in walk(fn)):
        return True  # the gathered ids deduplicated (DETR's coco_eval merge: `np.unique(ids, return_index=True)`)
    assign = m.parent.get(id(c))
    names = {dotted(t) for t in assign.targets} if isinstance(assign, ast.Assign) else set()
    if callee(c) in ("all_gather", "all_gather_object") and c.args:
        names.add(dotted(c.args[0]))  # `dist.all_gather(gathered_indexes, indexes)`: the list it fills
    if callee(c) in ("gather", "gather_object") and len(c.args) > 1:  # (`gather_object(obj, output if rank == 0
        out = c.args[1]  # else None, dst=0)`, then `for d in output: merged.update(d)`: scimon's T5 trainer)
        names.add(dotted(out.body if isinstance(out, ast.IfExp) else out))
    if any(isinstance(r, ast.Call) and callee(r) == "reduce" and len(r.args) > 1 and dotted(r.args[1]) in names
           and isinstance(r.args[0], ast.Lambda) and "update" in ast.unparse(r.args[0]) for r in walk(fn)):
        return True  # `reduce(lambda a, b: a.update(b) or a, all_res, {})`, dicts keyed by video (VidChapters)
    names.discard("")  # (a tuple target, `top1_err, top5_err = du.all_reduce([...])`, names nothing: TAdaConv)
    for loop in (n for n in walk(fn) if isinstance(n, ast.For)):
        over = {dotted(x) for x in ast.walk(loop.iter)} - {""}
        if not (names & over or any(x is c for x in ast.walk(loop.iter))):
            continue
        each = {x.id for x in ast.walk(loop.target) if isinstance(x, ast.Name)}
        if any(isinstance(a, ast.Call) and callee(a) == "update" and isinstance(a.func, ast.Attribute) and a.args
               and dotted(a.args[0]) in each for a in walk(loop)):
            return True  # `for p in all_predictions: predictions.update(p)`, dicts keyed by image index (SSD)
        if any(isinstance(a, ast.If) and isinstance(a.test, ast.Compare) and isinstance(a.test.ops[0], ast.NotIn)
               and isinstance(a.test.left, ast.Name) and a.test.left.id in each and any(
                   isinstance(x, ast.Assign) and isinstance(x.value, ast.Name) and x.value.id in each and any(
                       isinstance(t, ast.Subscript) and dotted(t.slice) == a.test.left.id for t in x.targets)
                   for x in ast.walk(a)) for a in walk(loop)):
            return True  # `for key, value in zip(gathered ids, gathered values): if key not in unique: unique[key] =
            # value` (OpenStereo): one entry per sample, not `losses_tracker[key] = AverageMeter()` (OpenTAD)
        if any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) for t in a.targets) or
               isinstance(a, ast.Call) and callee(a) == "update" for inner in walk(loop)
               if isinstance(inner, ast.For) and inner is not loop and isinstance(inner.iter, ast.Call)
               and callee(inner.iter) == "items" for a in ast.walk(inner)):
            return True
    return False


def _scattered_by_index(fn: ast.AST, buf: str) -> bool:
    """`dataset_feats[indices] = feats` in the loop over the loader, `indices` a loop value, then
    all_reduce(dataset_feats) (OpenSphere): each sample has its own slot, so a padded duplicate lands on its own
    sample's slot instead of adding a row to the set the metric is computed on."""
    for loop in (n for n in walk(fn) if isinstance(n, ast.For)):
        taken = {x.id for x in ast.walk(loop.target) if isinstance(x, ast.Name)}
        if any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) and dotted(t.value) == buf and {
                x.id for x in ast.walk(t.slice) if isinstance(x, ast.Name)} & taken for t in a.targets)
               for a in walk(loop)):
            return True
    return False


def _helper_scatters(facts, m: Module, c: ast.Call, depth: int = 2) -> bool:
    """A call of a project helper whose every reduction is of a buffer it fills by sample index (OpenSphere's
    `feats = self.model.get_feature_dataset(val_loader)`), or whose every gather is merged by key (SSD's
    inference() -> _accumulate_predictions_from_multiple_gpus: `for p in all_gather(...): predictions.update(p)`),
    through up to `depth` helpers."""
    verdicts = []
    for tm, tf in facts.p.resolve(m, c):
        for r in (x for x in walk(tf) if isinstance(x, ast.Call)):
            if callee(r) in ("all_reduce", "reduce", "all_gather") and r.args:
                verdicts.append(_merged_by_key(tm, tf, r) if callee(r) == "all_gather" else
                                _scattered_by_index(tf, dotted(r.args[0])))
            elif depth and any(facts.p.function_does(sm, sf, reduces_or_gathers, 1)
                               for sm, sf in facts.p.resolve(tm, r)):
                verdicts.append(_helper_scatters(facts, tm, r, depth - 1))
    return bool(verdicts) and all(verdicts)


def _drops_the_padding(fn: ast.AST) -> bool:
    """The evaluation works out how many samples the sampler padded (`len(dataloader.dataset) % world_size`) and
    drops them from what it gathered (CBIM's validation_ddp pops `padding_size` results): nothing counted twice."""
    lengths = {dotted(t) for a in walk(fn) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
               and callee(a.value) == "len" for t in a.targets}  # dataset_len = len(dataloader.dataset)
    # ... or cuts what it gathered back to the set's size (BSQ-ViT's `np.vstack(reorg)[:cfg.fid.num_samples]`,
    # mmdet's `ordered_results[:size]` with size = len(dataset)): the padded tail is dropped
    if any(isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and n.slice.lower is None and
           n.slice.upper is not None and (isinstance(n.slice.upper, ast.Call) and callee(n.slice.upper) == "len" or
                                          dotted(n.slice.upper) in lengths or re.search(
                                              r"num_samples|n_samples|num_examples|dataset_size|dataset_len|"
                                              r"len_ds|ds_len|len_dataset|data_len|len_data",  # (ContrastiveCrop)
                                              dotted(n.slice.upper))) for n in walk(fn)):
        return True
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and any(
        isinstance(x, ast.Call) and callee(x) == "len" or isinstance(x, ast.Name) and x.id in lengths
        for x in ast.walk(n.left)) and any(
        isinstance(x, (ast.Name, ast.Attribute, ast.Call)) and WORLDISH.search(dotted(x.func) if isinstance(
            x, ast.Call) else dotted(x)) for x in ast.walk(n.right)) for n in walk(fn))


GATHERS = {"gather", "all_gather", "all_gather_object", "gather_object"}


def _unseen_gather(facts, m: Module, c: ast.Call) -> bool:
    """`data_list = gather(data_list, dst=0)` with `gather` imported from the project's own distributed utilities
    outside the audited files (YOLOX's yolox.utils): a gather of every rank's predictions, not torch.gather (a
    tensor method or `torch.gather(input, dim, index)`)."""
    if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and c.func.attr in (
            *GATHERS, "all_reduce") and c.func.value.id in m.imports and not facts.p.resolve(m, c):
        # (`du.all_reduce([top1_err, top5_err])`, du the project's utils.distributed these files lack: TimeSformer)
        mod = m.imports[c.func.value.id]
        return "dist" in ".".join(x or "" for x in mod[:2]) and not mod[0].startswith("torch")
    return isinstance(c.func, ast.Name) and c.func.id in GATHERS and c.func.id in m.imports and \
        not m.imports[c.func.id][0].startswith("torch") and not facts.p.resolve(m, c)


def dedups_gathered_ids(facts, used_by: set | None = None) -> bool:
    """Some project function gathers results over ranks and keeps one per sample id (DETR's coco_eval.merge:
    `all_gather(img_ids)`, then `np.unique(merged_img_ids, return_index=True)`): the evaluation's metric counts
    each sample once, padded duplicates included. `used_by`: reach() keys of the functions that evaluate the
    loader in question; a dedup none of them runs is another evaluation's (ReferFormer's COCO-style evaluator,
    while its A2D evaluation gathers the padded predictions as they are)."""
    def ran(mm, fn):
        return used_by is None or (mm.rel, id(fn)) in used_by
    return any(ran(mm, fn) and any(isinstance(x, ast.Call) and callee(x) == "all_gather" for x in walk(fn))
               and any(isinstance(x, ast.Call) and callee(x) == "unique" and any(
                   k.arg == "return_index" for k in x.keywords) for x in walk(fn))
               for mm in facts.p.modules.values() for fn in mm.functions.values()) or any(
        _keyed_by_sample_id(facts.p, mm, d) and (mm.enclosing(d) is None or ran(mm, mm.enclosing(d)))
        for mm in facts.p.modules.values() for d in mm.nodes if isinstance(d, ast.DictComp))


def evaluations_of(p, loader_names: set[str]) -> set | None:
    """reach() keys of the project functions handed one of the loaders (`evaluate_a2d(model, data_loader_val,
    ...)`), with those functions' own callees; None when no call hands one on (the loader is iterated where it
    is built, or the names are not known): the caller then asks about the whole project."""
    keys: set = set()
    for mm in p.modules.values():
        for c in mm.calls:
            if any(isinstance(a, (ast.Name, ast.Attribute)) and dotted(a) in loader_names
                   for a in [*c.args, *(k.value for k in c.keywords)]):
                for tm, tf in p.resolve(mm, c):
                    keys |= p.reach(tm, tf)
    return keys or None


SAMPLE_ID = re.compile(r"^(image_|img_|sample_|video_|utt_|doc_)?ids?$")


def _keyed_by_sample_id(p, m, d: ast.DictComp) -> bool:
    """`res = {target['image_id'].item(): output ...}` handed to an evaluator's update whose code is not in the
    project (DETR's engine, whose CocoEvaluator file these copies may lack): results keyed by the sample's id, so a
    padded duplicate overwrites its first copy instead of counting twice. An evaluator the project defines is
    judged by its own code (TadTR's appends every window's detections: counted twice)."""
    if not any(SAMPLE_ID.match(const_str(x) or getattr(x, "attr", "") or "") for x in ast.walk(d.key)):
        return False
    a = m.parent.get(id(d))
    names = {t.id for t in getattr(a, "targets", []) if isinstance(t, ast.Name)} if isinstance(a, ast.Assign) else set()
    return any(isinstance(c, ast.Call) and callee(c) == "update" and re.search(r"evaluat", dotted(c.func), re.I)
               and any(isinstance(x, ast.Name) and x.id in names for x in c.args) and not _project_evaluator(p, m, c)
               for c in m.calls)


def _project_evaluator(p, m, c: ast.Call) -> bool:
    """The evaluator's update is project code: resolved, or a method `update` of a project class named so."""
    return bool(p.resolve(m, c)) or any(re.search(r"evaluat", cls, re.I) and f"{cls}.update" in mm.functions
                                        for mm in p.modules.values() for cls in mm.classes)
