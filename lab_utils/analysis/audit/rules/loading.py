"""Chapter 08 (checkpoints): where a checkpoint loads to. torch.load without map_location in code every rank runs
maps each tensor back to the GPU that saved it (cuda:0), so every rank fills GPU 0; data files a loader reads, the
launcher's own loads and loads rank 0 alone makes are not that."""

from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..hierarchy import method_never_called, never_named
from ..project import Module
from ..registry import Hit, rule
from ..scripts import reads_a_rank
from ..switches import LAUNCH_KEYS, one_process_arm
from ..syntax import callee, const_str, dotted, involves_rank, kw, mentions_ddp, walk


def _loaded_into_a_state_dict(m: Module, c: ast.Call) -> bool:
    """What is loaded is a checkpoint when it goes into load_state_dict, whatever its file is called:
    `checkpoint = torch.load(chkpt_path)` ... `model_g.load_state_dict(checkpoint['model_g'])`."""
    a = m.parent.get(id(c))
    if not (isinstance(a, ast.Assign) and len(a.targets) == 1):
        return False
    name, scope = dotted(a.targets[0]), m.enclosing(c) or m.tree
    return any(isinstance(n, ast.Call) and callee(n) == "load_state_dict" and any(
        isinstance(x, (ast.Name, ast.Attribute)) and dotted(x) == name for arg in n.args for x in ast.walk(arg))
        for n in walk(scope)) and not _saves_cpu_tensors(m)


def _synced_from_rank0(f: Facts, m: Module, c: ast.Call) -> bool:
    """`model.load_state_dict(torch.load(sync_path))` on every rank but 0 (Segmenter's sync_model, after rank 0
    saved its CUDA weights there): whatever the file is called, it holds rank 0's GPU tensors."""
    up = m.parent.get(id(c))
    return isinstance(up, ast.Call) and callee(up) == "load_state_dict" and f.g.effective(m, c) == "not0"


def _saves_cpu_tensors(m: Module) -> bool:
    """The module writes its checkpoints as CPU tensors (`state_dict[k] = param.cpu()` then torch.save, KAIR's
    save_network): loading them back maps nothing to the GPU that saved them."""
    return any(any(isinstance(c, ast.Call) and dotted(c.func) in ("torch.save", "th.save") for c in walk(fn))
               and any(isinstance(c, ast.Call) and callee(c) == "cpu" for c in walk(fn))
               for fn in m.functions.values())


def _unseen_torch_load(f: Facts, m: Module, c: ast.Call) -> bool:
    """A library's thin wrapper of torch.load, named so (`fs.torch_load(path)`, which forwards its keyword
    arguments to torch.load): without map_location it maps like torch.load. A project function of that name is
    judged by the torch.load inside it."""
    return callee(c) == "torch_load" and not f.p.resolve(m, c)


@rule("load-without-map-location", "08_checkpoints", "torch.load of a checkpoint without map_location in rank "
      "code: every rank maps the tensors to the GPU that saved them, so all ranks fill GPU 0")
def load_without_map_location(f: Facts, m: Module):
    if not (mentions_ddp(m) or m.rank_tainted or reads_a_rank(m) or _run_by_ddp_scripts(f, m)):
        return
    per_fn: dict[int, Hit] = {}  # one defect, one finding: a function's loads (CogKGE's model, optimizer and
    for c in m.calls:  # scheduler files, one after another) are one finding at the first, naming the others
        loads = dotted(c.func) in ("torch.load", "th.load") or _unseen_torch_load(f, m, c)
        if loads and len(c.args) < 2 and (re.search(
                r"ckpt|checkpoint|resume|weight|model|pretrain|snapshot|state|\.pth?\b", ast.unparse(c), re.I)
                or _loaded_into_a_state_dict(m, c) or _option_names_a_torch_file(f, c) or _held_as_a_checkpoint(m, c)
                or _synced_from_rank0(f, m, c)) and \
                kw(c, "map_location") is None and not any(k.arg is None for k in c.keywords) and not (
                    c.args and isinstance(c.args[0], ast.Call) and callee(c.args[0]) == "BytesIO") and \
                not f.off_in_default_run(m, c) and not one_process_arm(m, c) and not _unlaunched_arm(m, c) and \
                not _into_a_grad_scaler(m, c) and not _in_a_dataset(m, c) and not _a_data_file(c) and \
                not _handed_to_a_dataset(f, m, c) and \
                f.g.effective(m, c) != "rank0" and not _after_the_workers(f, m, c) and not _in_the_launcher(
                    f, m, c) and not (
                    m.enclosing(c) is not None and (method_never_called(f.p, m, m.enclosing(c)) or not m.class_of(
                        m.enclosing(c)) and not m.entry and never_named(f.p, m, m.enclosing(c)))) and not (
                    c.args and involves_rank(c.args[0], m.rank_tainted)):
            # (an option unset unless given; the arm of a run of one process (ADL-Stereo's else of `if
            # args.distributed:`, YouReID's of `if 'LOCAL_RANK' in os.environ:`); rank 0 alone loads onto its own
            # GPU; the launcher alone, after the workers; a file named by the rank, `worker_{rank}.pt`, which that
            # rank saved from its own GPU: llm-baselines)
            key = id(m.enclosing(c)) if m.enclosing(c) is not None else id(c)
            if key in per_fn:
                per_fn[key] = per_fn[key]._replace(related=(*per_fn[key].related, (m, c)))
                continue
            per_fn[key] = Hit(c, f"{ast.unparse(c)} has no map_location: every rank maps the tensors to the device "
                              "that saved them (cuda:0), so all ranks fill GPU 0 — map_location='cpu' (or the rank's "
                              "own device)")
    yield from per_fn.values()


def _held_as_a_checkpoint(m: Module, c: ast.Call) -> bool:
    """The load is kept under a checkpoint's name, whatever its path's (VidSitu's `checkpoint = torch.load(f)`)."""
    a = m.parent.get(id(c))
    return isinstance(a, ast.Assign) and any(re.search(r"ckpt|checkpoint|state_?dict", dotted(t), re.I)
                                             for t in a.targets) and not _saves_cpu_tensors(m)


def _handed_to_a_dataset(f: Facts, m: Module, c: ast.Call) -> bool:
    """The load's function is handed by name to a project Dataset class (RoseTTAFold2's `Dataset(keys, loader_pdb,
    ...)`, whose __getitem__ calls it): data the loader reads per sample, not a checkpoint onto the rank's GPU."""
    fn = m.enclosing(c)
    if not isinstance(fn, ast.FunctionDef) or m.class_of(fn):
        return False
    for mm in f.p.modules.values():
        if mm is not m and fn.name not in mm.imports:
            continue  # (the function itself, not a local of that name: UnivNet's `train=True` flags)
        for n in mm.nodes:
            up = mm.parent.get(id(n)) if isinstance(n, ast.Name) and n.id == fn.name and not _bound_locally(
                mm, n) else None
            if isinstance(up, ast.Call) and up.func is not n and any(
                    any(isinstance(d, ast.FunctionDef) and d.name == "__getitem__" for d in tm.classes[cls].body)
                    for tm, tf in f.p.resolve(mm, up, exact=True) if (cls := tm.class_of(tf))):
                return True
    return False


def _bound_locally(m: Module, n: ast.Name) -> bool:
    fn = m.enclosing(n)
    return fn is not None and (n.id in {a.arg for a in fn.args.args + fn.args.kwonlyargs} or any(
        isinstance(t, ast.Name) and t.id == n.id for a in walk(fn) if isinstance(a, ast.Assign) for t in a.targets))


def _run_by_ddp_scripts(f: Facts, m: Module) -> bool:
    """A helper module (a model's pretrained-weight loader, an optimizer builder's resume) that a DDP entry script
    imports: its functions run on every rank (MatteFormer's generators.py, RT-ODLab's solver/optimizer.py)."""
    return not m.entry and any(e.entry and mentions_ddp(e) and m.rel in f.p.imports_of(e) for e in f.p.modules.values())


def _in_a_dataset(m: Module, c: ast.Call) -> bool:
    """A load in a dataset's own method (ESD's `image, label = torch.load(... '_batch.pt')` in __getitem__, or
    HPNN's PyG InMemoryDataset reading its processed file in __init__): data read in the loader, not a checkpoint
    onto the rank's GPU."""
    cls = m.classes.get(m.class_of(m.enclosing(c)) or "") if m.enclosing(c) is not None else None
    return cls is not None and (any(isinstance(d, ast.FunctionDef) and d.name == "__getitem__" for d in cls.body)
                                or any(dotted(b).endswith("Dataset") for b in cls.bases))


def _a_data_file(c: ast.Call) -> bool:
    """The path's own text names data, not weights (Diffusion-BERT's `torch.load(f'./word_freq/{name}_{task}.pt')`,
    the annotated Transformer's `torch.load('vocab.pt')`): counts or a vocabulary a preprocessing step saved, which
    no rank's GPU held; `model` in a variable beside it (`args.model_name_or_path`) does not make it a checkpoint."""
    text = " ".join(n.value for n in ast.walk(c.args[0]) if isinstance(n, ast.Constant) and isinstance(
        n.value, str)) if c.args else ""
    return bool(DATA_FILE.search(text)) and not CKPT_WORDS.search(text)


DATA_FILE = re.compile(r"vocab|freq|stat(s|istic)|token|dictionary|mean|std\b|index|indices|cache|label|"
                       r"(?<![a-z])log(?![a-z])", re.I)
CKPT_WORDS = re.compile(r"ckpt|checkpoint|resume|weight|model|pretrain|snapshot|state|optim|epoch|best|last|net",
                        re.I)


def _option_names_a_torch_file(f: Facts, c: ast.Call) -> bool:
    """`torch.load(args.word_embedding)` whose option defaults to a saved torch file
    (`--word_embedding ./pretrained_weights/txt_encoding.pth`, CLIP-Driven Universal Model)."""
    a = c.args[0] if c.args else None
    if not isinstance(a, ast.Attribute):
        return False
    return any(callee(o) == "add_argument" and any((const_str(x) or "").lstrip("-").replace("-", "_") == a.attr
                                                   for x in o.args)
               and re.search(r"\.(pth?|ckpt|bin)$", const_str(kw(o, "default")) or "") is not None
               for mm in f.p.modules.values() for o in mm.calls)


def _after_the_workers(f: Facts, m: Module, c: ast.Call) -> bool:
    """`c` runs in a function only the launching process calls, after its mp.spawn of the workers has returned
    (NLSPN's main(): `mp.spawn(train, ...)`, then `test(args)`): one process, no rank on another's GPU."""
    fn = m.enclosing(c)
    sites = f.p.callers(m, fn) if fn is not None else []
    return bool(sites) and all(any(isinstance(s, ast.Call) and callee(s) == "spawn" and s.lineno < site.lineno
                                   for s in ast.walk(sm.enclosing(site) or sm.tree)) and not any(
        isinstance(a, ast.Name) and a.id == fn.name for s in ast.walk(sm.tree) if isinstance(s, ast.Call)
        and callee(s) == "spawn" for a in s.args[:1]) for sm, site in sites)


def _in_the_launcher(f: Facts, m: Module, c: ast.Call) -> bool:
    """`c` runs in a helper only the launching process calls: from the function that starts the workers with
    mp.spawn (TimesFM's multi_gpu_example: `model = get_model(load_weights=True)`, then `mp.spawn(setup_process,
    args=(..., model, ...))`), or from one that sets up no process group (its single_gpu_example): one process."""
    fn = m.enclosing(c)
    sites = f.p.callers(m, fn) if fn is not None else []

    def one_process(sm, site):
        outer = sm.enclosing(site)
        spawns = [s for s in ast.walk(outer or sm.tree) if isinstance(s, ast.Call) and "spawn" in callee(s)]
        if spawns:
            return not any(isinstance(a, ast.Name) and a.id == fn.name for s in spawns for a in s.args[:1])
        workers = f.cache.get("spawned_reach")
        if workers is None:  # (what the spawned workers run: asked once)
            workers = f.cache["spawned_reach"] = {
                k for mm in f.p.modules.values() for s in mm.calls if callee(s) == "spawn" and s.args
                for tm, tf in f.p.resolve(mm, ast.Call(func=s.args[0], args=[], keywords=[]))
                for k in f.p.reach(tm, tf)}
        return outer is not None and (sm.rel, id(outer)) not in workers and not any(
            isinstance(x, ast.Call) and (callee(x) == "init_process_group" or f.is_ddp_call(sm, x))
            for x in ast.walk(outer)) and not any(  # (handed by name to a launcher that spawns: VidSitu's
            isinstance(v, ast.Name) and v.id == getattr(outer, "name", None) and (re.search(  # launch_job(func=
                r"spawn|launch", callee(x)) or any(isinstance(s, ast.Call) and callee(s) == "spawn"  # main_fn))
                                                   for _, tf in f.p.resolve(mm, x) for s in walk(tf)))
            for mm in f.p.modules.values() for x in mm.calls for v in (*x.args, *(k.value for k in x.keywords)))
    return bool(sites) and any(isinstance(s, ast.Call) and callee(s) == "spawn" for mm in f.p.modules.values()
                               for s in mm.calls) and all(one_process(sm, site) for sm, site in sites)


def _unlaunched_arm(m: Module, c: ast.Call) -> bool:
    """`c` is in the else of `if 'LOCAL_RANK' in os.environ:` (YouReID's load_ckpt): only a run no launcher
    started, one process, gets there. (A port there is still a port two single-GPU runs share: the port rule
    does not ask this.)"""
    child, n = c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and len(n.test.ops) == 1 and isinstance(
                n.test.ops[0], ast.In) and const_str(n.test.left) in LAUNCH_KEYS and "environ" in dotted(
                n.test.comparators[0]) and any(child is s for s in n.orelse):
            return True
        # ... or the body of `if args.gpu is None:` (the ImageNet example's resume, TransGeo's): the process has
        # no GPU of its own, the DataParallel or CPU path, while each DDP rank gets its GPU index
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and len(n.test.ops) == 1 and isinstance(
                n.test.ops[0], ast.Is) and dotted(n.test.left).split(".")[-1] == "gpu" and isinstance(
                n.test.comparators[0], ast.Constant) and n.test.comparators[0].value is None and any(
                child is s for s in n.body):
            return True
        child, n = n, m.parent.get(id(n))
    return False


def _into_a_grad_scaler(m: Module, c: ast.Call) -> bool:
    """`scaler.load_state_dict(torch.load('scaler.pth'))` with `scaler = GradScaler()` (PVDM): a GradScaler's state
    is Python numbers, no tensor lands on any GPU."""
    up = m.parent.get(id(c))
    if not (isinstance(up, ast.Call) and callee(up) == "load_state_dict" and isinstance(up.func, ast.Attribute)):
        return False
    holder = dotted(up.func.value)
    made = [a.value for a in m.nodes if isinstance(a, ast.Assign) and any(dotted(x) == holder for x in a.targets)
            and not (isinstance(a.value, ast.Constant) and a.value.value is None)]
    return bool(made) and all(isinstance(v, ast.Call) and callee(v) == "GradScaler" for v in made) or not made and \
        re.search(r"scaler", holder.split(".")[-1], re.I) is not None or holder.split(".")[-1] == "amp"
    # (an AMP scaler handed in, or apex.amp's loss-scale state: Sockeye's)

