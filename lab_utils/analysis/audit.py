"""`ddp-lab audit PATH ...`: a static check of a DDP training project against the corrected checklist
(docs/checklist.md; taught in notebooks/10_workflow.ipynb).

It parses every file with `ast` (nothing is imported or run), follows the imports that stay inside the audited
folder, and judges seeds, samplers, logging, saving and collectives across files: a helper that seeds, a loader
library whose `set_epoch` call sits in the training script, a `save_checkpoint` helper called on every rank.
Each finding names the defect it claims (what differs from the single run, or which hazard), its severity
(`defect`: the code shows it; `check-by-hand`: it depends on something the audit cannot see), the real line
and the chapter that measures it.

Rules (severity; the defect it claims; the chapter that measures it):
- set-epoch-missing (defect): a DistributedSampler whose set_epoch is never called, or only under a switch the
  sampler ignores: every epoch repeats epoch 0's order. 03_samplers
- set-epoch-late (defect): set_epoch after the loader's iterator exists (a persistent iterator): the epoch's
  order was already fixed, so epoch 1 repeats epoch 0's. 03_samplers
- sampler-with-shuffle (defect): DataLoader(sampler=DistributedSampler, shuffle=True) raises. 03_samplers
- no-seed (defect): an entry script that sets up DDP and never seeds, itself or through a helper: rank 0's init
  (which DDP broadcasts) differs from the single run's. 02_seeds
- seed-before-spawn (defect): seeded in the parent before mp.spawn; the workers never seed torch's CPU RNG, so
  the DDP init is unseeded while the in-process single run's is seeded. 02_seeds
- seed-per-rank (defect): rank 0's seed differs from the single run's (`seed + 1 + RANK` with RANK = -1 alone);
  (check-by-hand): a per-rank init copied (EMA) before the wrap. A per-rank seed whose rank 0 equals the single
  run is no finding: DDP broadcasts rank 0's weights, the per-rank part only changes data randomness. 02_seeds
- peek-iterator (defect): next(iter(loader)): an extra iterator draws from the global RNG. 02_seeds
- sum-loss-unscaled (defect): reduction='sum' under DDP, no x world_size: gradients x 1/world_size. 05_ddp_flags
- gather-without-grad (defect / check-by-hand): in-batch negatives through plain all_gather: the other ranks'
  features carry no gradient. 05_ddp_flags
- rank0-local-loss (defect): rank 0 logs a loss no reduction averaged (under `if rank == 0`, `if RANK in
  {-1, 0}`, or through a builtins.print override). 01_unchanged
- every-rank-prints-loss (defect): every rank prints its own unreduced loss. 01_unchanged
- save-without-module (defect): state_dict() of the DDP-wrapped model: module.-prefixed keys. 00_preflight
- save-on-every-rank (defect): a checkpoint written by every rank (no rank-0 guard, or `not
  multiprocessing_distributed or rank % ngpus == 0`, true on every rank under torchrun). 08_checkpoints
- load-without-map-location (defect): torch.load of a checkpoint without map_location in rank code: every rank
  maps to the GPU that saved it. 08_checkpoints
- eval-padding-duplicates (check-by-hand): evaluation through a padding DistributedSampler plus a reduction:
  duplicates are counted unless the set divides. 08_checkpoints
- collective-under-rank0 (defect): a collective only rank 0 (or only the others) reaches: a hang; a matched
  pair (`if rank != 0: barrier()` ... `if rank == 0: barrier()`) is no finding. 00_preflight
- ddp-forward-under-rank0 (check-by-hand): the DDP-wrapped model called by rank 0 alone: its buffer broadcast
  waits for the others if the module has buffers. 08_checkpoints
- hard-coded-master-port (check-by-hand): a fixed MASTER_PORT or tcp:// port: two jobs collide. 09_launching
- accumulation-without-no-sync (defect): N-1 extra all-reduces per step. 06_accumulation
- batch-and-accum-divided (defect): per-GPU batch and accumulation both divided by world_size. 06_accumulation
- batchnorm-without-sync (defect): BatchNorm under DDP, no SyncBatchNorm conversion. 07_batchnorm

What it cannot see: code outside the audited folder (an installed package, a config file's values), values known
only at run time (the dataset size, which branch a flag takes, whether a model has buffers), models built by name
(torchvision's resnet has BatchNorm), calls through objects it cannot type (`obj.method()` on a parameter; a
model is typed only when the script builds a project nn.Module class by name, whose forward then decides whether
the loss it returns is reduced). Two scripts in one folder are judged apart unless one imports the other. A
rank term inside a conditional expression (`seed + (rank if per_rank else 0)`) is taken as a deliberate switch.
It is a checklist, not a proof: the proof is a comparison of real runs (`ddp-lab compare` / `ddp-lab doctor`).

Exit codes of the CLI verb: 0 no finding, 1 findings, 2 bad input (no such path, not Python).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

# rule -> (chapter, what the rule claims, in one line: the help text of --json/--sarif consumers)
RULE_INFO = {
    "set-epoch-missing": ("03_samplers", "a DistributedSampler whose set_epoch is never called: every epoch repeats "
                                         "epoch 0's order"),
    "set-epoch-late": ("03_samplers", "set_epoch after the loader's iterator exists: the epoch's order was already "
                                      "fixed"),
    "sampler-with-shuffle": ("03_samplers", "DataLoader(sampler=DistributedSampler, shuffle=True) raises ValueError"),
    "no-seed": ("02_seeds", "the script never seeds torch: rank 0's init differs from the single run's"),
    "seed-before-spawn": ("02_seeds", "seeded in the parent before mp.spawn: the workers' torch RNG is unseeded"),
    "seed-per-rank": ("02_seeds", "rank 0's seed differs from the single run's, or per-rank init survives the wrap"),
    "peek-iterator": ("02_seeds", "next(iter(loader)) creates an extra iterator that draws from the global RNG"),
    "sum-loss-unscaled": ("05_ddp_flags", "reduction='sum' under DDP without x world_size: gradients x 1/world_size"),
    "gather-without-grad": ("05_ddp_flags", "plain all_gather of features: other ranks' features carry no gradient"),
    "rank0-local-loss": ("01_unchanged", "rank 0 logs its own micro-batch's loss, not the global batch's"),
    "every-rank-prints-loss": ("01_unchanged", "every rank prints its own unreduced loss"),
    "save-without-module": ("00_preflight", "state_dict() of the DDP-wrapped model: module.-prefixed keys"),
    "save-on-every-rank": ("08_checkpoints", "every rank writes the checkpoint"),
    "load-without-map-location": ("08_checkpoints", "torch.load without map_location: every rank loads onto the "
                                                    "GPU that saved the file"),
    "eval-padding-duplicates": ("08_checkpoints", "a padding DistributedSampler in evaluation plus a reduction: "
                                                  "duplicated samples are counted"),
    "collective-under-rank0": ("00_preflight", "a collective only rank 0 reaches: a hang"),
    "ddp-forward-under-rank0": ("08_checkpoints", "the DDP-wrapped model called by rank 0 alone: its buffer "
                                                  "broadcast waits for the others"),
    "hard-coded-master-port": ("09_launching", "a fixed rendezvous port: two jobs on one host collide"),
    "accumulation-without-no-sync": ("06_accumulation", "accumulation without no_sync: N-1 extra all-reduces a step"),
    "batch-and-accum-divided": ("06_accumulation", "per-GPU batch and accumulation both divided by world_size"),
    "batchnorm-without-sync": ("07_batchnorm", "BatchNorm under DDP without SyncBatchNorm"),
}
CHAPTERS = {rule: chapter for rule, (chapter, _) in RULE_INFO.items()}
RULES = tuple(RULE_INFO)
SEVERITIES = ("defect", "check-by-hand")

RANKISH = re.compile(r"(^|_)rank$|^rank|local_rank|master_process|is_main|is_master|main_process|is_rank_zero"
                     r"|^RANK$|^LOCAL_RANK$|^gpu$|^rank\d")
WORLDISH = re.compile(r"world_size|num_replicas|n_gpus|ngpus|num_gpus|get_world_size|num_processes|nprocs|WORLD_SIZE")
RANK0_NAME = re.compile(r"master|is_main|main_process|rank_zero|is_rank0|is_primary|rank0$")
BATCHISH = re.compile(r"batch_size|batch$|^bs$|b_sz")
ACCUMISH = re.compile(r"accum")
LOSSISH = re.compile(r"loss", re.I)
EVALISH = re.compile(r"val|eval|test", re.I)
REDUCEISH = re.compile(r"reduce|gather|average|allreduce|sync|mean_over|dist_mean")
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier",
               "reduce", "gather", "scatter", "reduce_scatter", "all_to_all", "reduce_scatter_tensor",
               "all_gather_into_tensor", "monitored_barrier", "gather_object", "scatter_object_list"}
LOG_CALLS = {"print", "info", "log", "write", "add_scalar", "add_scalars", "set_description", "set_postfix",
             "log_metrics", "warning", "debug"}
TORCH_SEEDS = {"torch.manual_seed", "manual_seed", "seed_everything", "set_seed", "pl.seed_everything",
               "L.seed_everything", "transformers.set_seed", "accelerate.utils.set_seed"}
CUDA_SEEDS = {"torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "cuda.manual_seed", "cuda.manual_seed_all"}
OTHER_SEEDS = {"random.seed", "np.random.seed", "numpy.random.seed"}
SEED_HELPER = re.compile(r"seed", re.I)  # an unseen helper named like a seeder (init_seeds, fix_random_seeds)
SPAWNS = {"spawn", "start_processes"}
DDP_NAMES = {"DistributedDataParallel", "DDP"}
ENTRY_CALLS = {"init_process_group", "DistributedDataParallel", "DDP", "spawn", "backward", "main", "train", "run",
               "manual_seed"}
DIST_SWITCH = re.compile(r"distributed|ddp|multigpu|multi_gpu", re.I)
ITERABLE_NOT_LOADER = {"items", "values", "keys", "parameters", "named_parameters", "buffers", "named_buffers",
                       "children", "modules", "named_modules", "state_dict"}
LOADERISH = re.compile(r"loader|train_data|val_data|test_data|^data$|^dl$|dataloader|_dl$|batches", re.I)
NOT_A_LOSS = re.compile(r"loss_?scal|loss_?fn|loss_?func|loss_?type|criterion|loss_?weight|loss_?cfg|loss_?config",
                        re.I)


class AuditError(ValueError):
    """A path cannot be audited (missing, not Python); the message names it."""


@dataclass(frozen=True)
class Finding:
    line: int
    rule: str
    message: str
    severity: str = "defect"
    path: str = ""

    @property
    def chapter(self) -> str:
        return CHAPTERS[self.rule]

    def format(self, path: str | None = None) -> str:
        where = self.path if path is None else path
        return (f"{where}:{self.line}: {self.rule} [{self.severity}] {self.message} "
                f"(notebooks/{self.chapter}.ipynb)")

    def to_dict(self) -> dict:
        return {"file": self.path, "line": self.line, "rule": self.rule, "severity": self.severity,
                "message": self.message, "chapter": f"notebooks/{self.chapter}.ipynb"}


# ---------------------------------------------------------------------------------------------- ast helpers
def dotted(node: ast.AST) -> str:
    """`torch.cuda.manual_seed` for an Attribute chain, the name for a Name, '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func) + "()"
    if isinstance(node, ast.Subscript):
        return dotted(node.value) + "[]"
    return ""


def _callee(call: ast.Call) -> str:
    return dotted(call.func).split(".")[-1].rstrip("()[]")


def _root(node: ast.AST) -> str:
    """The variable an expression reads from: `loss` for `loss.data.item()`, `self.x` for `self.x.y`."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return f"self.{node.attr}"
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _branches(v: ast.AST) -> list:
    """The values an expression can take: both arms of `a if c else b` (`DistributedSampler(d) if ddp else None`)."""
    return _branches(v.body) + _branches(v.orelse) if isinstance(v, ast.IfExp) else [v]


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_rankish_node(n: ast.AST, tainted: set[str]) -> bool:
    if isinstance(n, (ast.Name, ast.Attribute)):
        leaf = dotted(n).split(".")[-1]
        if WORLDISH.search(leaf):
            return False
        return bool(RANKISH.search(leaf)) or dotted(n) in tainted
    if isinstance(n, ast.Call) and _callee(n) in ("get_rank", "get_local_rank", "get_global_rank"):
        return True
    if isinstance(n, ast.Constant) and n.value in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID"):
        return True
    return False


def involves_rank(node: ast.AST, tainted: set[str] = frozenset(), skip_conditional: bool = False) -> bool:
    """Whether an expression depends on the rank; with skip_conditional, a rank term inside `a if c else b`
    is a deliberate switch and does not count."""
    skip = set()
    if skip_conditional:
        for n in ast.walk(node):
            if isinstance(n, ast.IfExp):
                skip |= {id(m) for m in ast.walk(n)}
    return any(_is_rankish_node(n, tainted) for n in ast.walk(node) if id(n) not in skip)


def involves(node: ast.AST, pattern: re.Pattern) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) and pattern.search(dotted(n).split(".")[-1] or "")
               for n in ast.walk(node))


# ---------------------------------------------------------------------------------------------- the project
class Module:
    """One parsed file: its tree, parent links, functions, imports, and the names that hold a rank."""

    def __init__(self, path: Path, rel: str, source: str):
        try:
            self.tree = ast.parse(source, filename=str(path))
        except SyntaxError as e:
            raise AuditError(f"{path}:{e.lineno}: not Python ({e.msg})") from None
        self.path, self.rel = path, rel
        self.parent: dict[int, ast.AST] = {}
        for n in ast.walk(self.tree):
            for c in ast.iter_child_nodes(n):
                self.parent[id(c)] = n
        self.calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
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
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Import):
                for a in n.names:
                    self.imports[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0],
                                                                      None, 0)
            elif isinstance(n, ast.ImportFrom):
                for a in n.names:
                    self.imports[a.asname or a.name] = (n.module or "", a.name, n.level)
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
                    isinstance(c, ast.Call) and (_callee(c) in ENTRY_CALLS or "DistributedDataParallel" in (
                        self.imports.get(_callee(c), ("", "", 0))[1] or "")) for c in ast.walk(n)):
                return True
        return False

    def _taint(self, seed: frozenset = frozenset()) -> set[str]:
        """Names assigned (anywhere) from an expression that involves a rank: flow-insensitive, to a fixpoint.
        `seed`: parameters that callers pass a rank (Project._taint_parameters)."""
        tainted: set[str] = set(seed)
        assigns = [n for n in ast.walk(self.tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))]
        changed = True
        while changed:
            changed = False
            for a in assigns:
                if a.value is None or not involves_rank(a.value, tainted):
                    continue
                if WORLDISH.search(dotted(a.value)) and not RANKISH.search(dotted(a.value)):
                    continue
                for t in (a.targets if isinstance(a, ast.Assign) else [a.target]):
                    for name in ([dotted(e) for e in t.elts] if isinstance(t, ast.Tuple) else [dotted(t)]):
                        if name and not WORLDISH.search(name) and name not in tainted:
                            tainted.add(name)
                            changed = True
        return tainted

    def enclosing(self, node: ast.AST, kinds=(ast.FunctionDef, ast.AsyncFunctionDef)):
        n = self.parent.get(id(node))
        while n is not None and not isinstance(n, kinds):
            n = self.parent.get(id(n))
        return n

    def class_of(self, fn: ast.AST) -> str | None:
        p = self.parent.get(id(fn))
        return p.name if isinstance(p, ast.ClassDef) else None

    def qualname(self, fn: ast.AST | None) -> str | None:
        if fn is None:
            return None
        cls = self.class_of(fn)
        return f"{cls}.{fn.name}" if cls else fn.name

    def has_main_guard(self) -> ast.If | None:
        return next((n for n in self.tree.body if isinstance(n, ast.If)
                     and "__name__" in {dotted(m) for m in ast.walk(n.test)}), None)


class Project:
    """The audited files plus the modules their imports reach inside the root folder."""

    def __init__(self, paths: list[Path], root: Path):
        self.root = root
        self.modules: dict[str, Module] = {}
        self.given: list[str] = []
        for p in paths:
            self.given.append(self._load(p).rel)
        queue = list(self.modules.values())
        while queue:  # follow imports that resolve inside root
            m = queue.pop()
            for mod, attr, level in m.imports.values():
                for target in self._candidates(m, mod, attr, level):
                    if target.exists() and str(self._rel(target)) not in self.modules:
                        queue.append(self._load(target))
        self.ddp = any(self._mentions_ddp(m) for m in self.modules.values())
        self._reach_cache: dict[tuple[str, str], set] = {}
        self._taint_parameters()

    def _taint_parameters(self):
        """A rank handed to a project function or class (`Trainer(model, data, opt, rank, ...)`) makes the
        parameter that receives it rank-holding (`self.gpu_id = gpu_id` ... `if self.gpu_id == 0:`)."""
        seeds: dict[str, set[str]] = {rel: set() for rel in self.modules}
        for _ in range(3):  # a rank passed on through two helpers
            changed = False
            for m in self.modules.values():
                for c in m.calls:
                    ranked = [i for i, a in enumerate(c.args) if involves_rank(a, m.rank_tainted)]
                    kws = {k.arg for k in c.keywords if k.arg and involves_rank(k.value, m.rank_tainted)}
                    if not ranked and not kws:
                        continue
                    for tm, tf in self.resolve(m, c, exact=True):
                        params = [a.arg for a in tf.args.args]
                        if params and params[0] in ("self", "cls") and tm.class_of(tf):
                            params = params[1:]
                        names = {params[i] for i in ranked if i < len(params)} | (kws & set(params))
                        if names - seeds[tm.rel]:
                            seeds[tm.rel] |= names
                            tm.rank_tainted = tm._taint(frozenset(seeds[tm.rel]))
                            changed = True
            if not changed:
                break

    def _rel(self, p: Path) -> str:
        try:
            return str(p.resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(p)

    def _load(self, p: Path) -> Module:
        rel = self._rel(p)
        if rel not in self.modules:
            try:
                text = p.read_text()
            except UnicodeDecodeError:
                raise AuditError(f"{p}: not a text file") from None
            self.modules[rel] = Module(p, rel, text)
        return self.modules[rel]

    def _candidates(self, m: Module, mod: str, attr: str | None, level: int) -> list[Path]:
        parts = mod.split(".") if mod else []
        if level:
            base = m.path.parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        else:  # absolute: from the importing file's folder up to the root (scripts add the root to sys.path)
            bases, b = [], m.path.parent.resolve()
            root = self.root.resolve()
            while True:
                bases.append(b)
                if b == root or root not in b.parents:
                    break
                b = b.parent
        out = []
        for b in bases:
            d = b.joinpath(*parts) if parts else b
            out += [d.with_suffix(".py") if parts else d / "__init__.py", d / "__init__.py"]
            if attr:
                out.append(d / f"{attr}.py")
        root = self.root.resolve()
        return [p for p in out if root in p.resolve().parents or p.resolve().parent == root]

    def module_for(self, m: Module, local: str) -> Module | None:
        """The project module a local import name refers to (`dist_util`, `utils`, `distrib`)."""
        if local not in m.imports:
            return None
        mod, attr, level = m.imports[local]
        for c in self._candidates(m, mod, attr, level):
            rel = self._rel(c)
            if rel in self.modules and (attr is None or c.stem == attr or c.name == "__init__.py"
                                        and c.parent.name == (attr or "")):
                return self.modules[rel]
        if attr is None:
            return None
        for c in self._candidates(m, mod, None, level):  # `from pkg.mod import name` → the module pkg/mod.py
            rel = self._rel(c)
            if rel in self.modules:
                return self.modules[rel]
        return None

    def imports_of(self, m: Module) -> set[str]:
        """The project modules `m` reaches through its imports, transitively (m excluded)."""
        if not hasattr(self, "_imports_cache"):
            self._imports_cache = {}
        if m.rel not in self._imports_cache:
            seen, todo = set(), [m]
            while todo:
                mm = todo.pop()
                for local in mm.imports:
                    t = self.module_for(mm, local)
                    if t is not None and t.rel not in seen and t is not m:
                        seen.add(t.rel)
                        todo.append(t)
            self._imports_cache[m.rel] = seen
        return self._imports_cache[m.rel]

    def related(self, m: Module) -> list[Module]:
        """The modules that run with `m`: m, what it imports, the scripts that import it and what they import.
        Two independent scripts in one folder are not related, though they share a helper."""
        users = [u for u in self.modules.values() if m.rel in self.imports_of(u)]
        rels = {m.rel} | self.imports_of(m) | {u.rel for u in users}
        for u in users:
            rels |= self.imports_of(u)
        return [self.modules[r] for r in sorted(rels)]

    @staticmethod
    def _mentions_ddp(m: Module) -> bool:
        for _mod, attr, _ in m.imports.values():
            if attr and ("DistributedDataParallel" in attr or attr == "init_process_group"):
                return True
        names = {dotted(n).split(".")[-1] for n in ast.walk(m.tree) if isinstance(n, (ast.Name, ast.Attribute))}
        return bool({"DistributedDataParallel", "init_process_group"} & names) or \
            any(_callee(c) == "DDP" for c in m.calls)

    # --- calls between functions
    def resolve(self, m: Module, call: ast.Call, exact: bool = False) -> list[tuple[Module, ast.AST]]:
        """The project functions a call may run: local defs, imported defs, `module.f`, `self.f`, `Class(...)`
        (every method of the class; with `exact`, only its __init__)."""
        f = call.func
        out: list[tuple[Module, ast.AST]] = []

        def in_module(mod: Module, name: str):
            if name in mod.functions:
                out.append((mod, mod.functions[name]))
            elif name in mod.classes:
                out.extend((mod, mod.functions[k]) for k in mod.functions if k.startswith(name + ".")
                           and (not exact or k == f"{name}.__init__"))

        if isinstance(f, ast.Name):
            if f.id in m.functions or f.id in m.classes:
                in_module(m, f.id)
            elif f.id in m.imports:
                target = self.module_for(m, f.id)
                if target is not None:
                    in_module(target, m.imports[f.id][1] or f.id)
        elif isinstance(f, ast.Attribute):
            base = f.value
            if isinstance(base, ast.Name) and base.id == "self":
                fn = m.enclosing(call)
                cls = m.class_of(fn) if fn is not None else None
                if cls and f"{cls}.{f.attr}" in m.functions:
                    out.append((m, m.functions[f"{cls}.{f.attr}"]))
            elif isinstance(base, ast.Name) and base.id in m.imports:
                target = self.module_for(m, base.id)
                if target is not None:
                    in_module(target, f.attr)
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in m.imports:
                target = self.module_for(m, base.value.id)  # pkg.utils.f() with `import pkg`
                if target is not None:
                    in_module(target, f.attr)
        return out

    def reach(self, m: Module, fn: ast.AST) -> set[tuple[str, int]]:
        """(module rel, id(function)) of every project function `fn` may run, fn included (breadth-first)."""
        key = (m.rel, id(fn))
        if key in self._reach_cache:
            return self._reach_cache[key]
        seen = {key}
        queue = [(m, fn)]
        self._reach_cache[key] = seen
        while queue:
            mod, f = queue.pop()
            for c in (n for n in ast.walk(f) if isinstance(n, ast.Call)):
                for tm, tf in self.resolve(mod, c):
                    k = (tm.rel, id(tf))
                    if k not in seen:
                        seen.add(k)
                        queue.append((tm, tf))
        return seen

    def nodes(self, keys: set[tuple[str, int]]):
        """The (module, function) pairs behind reach() keys."""
        for m in self.modules.values():
            for f in m.functions.values():
                if (m.rel, id(f)) in keys:
                    yield m, f

    def calls_in(self, keys) -> list[tuple[Module, ast.Call]]:
        return [(m, c) for m, f in self.nodes(keys) for c in ast.walk(f) if isinstance(c, ast.Call)]

    def callers(self, m: Module, fn: ast.AST) -> list[tuple[Module, ast.Call]]:
        out = []
        for cm in self.modules.values():
            for c in cm.calls:
                if any(tf is fn for _, tf in self.resolve(cm, c, exact=True)):
                    out.append((cm, c))
        return out

    def function_does(self, m: Module, fn: ast.AST, pred, depth: int = 4) -> bool:
        """Whether fn, or a project function it calls (to `depth`), has a call satisfying pred(module, call)."""
        todo, seen = [(m, fn, 0)], set()
        while todo:
            mod, f, d = todo.pop()
            if id(f) in seen:
                continue
            seen.add(id(f))
            for c in (n for n in ast.walk(f) if isinstance(n, ast.Call)):
                if pred(mod, c):
                    return True
                if d < depth:
                    todo += [(tm, tf, d + 1) for tm, tf in self.resolve(mod, c)]
        return False


# ---------------------------------------------------------------------------------------------- rank guards
class Guards:
    """Which code only rank 0 runs: `if rank == 0`, `if RANK in {-1, 0}`, `if is_main_process()`, the `else` of
    `if rank != 0`, code after `if rank > 0: return`; and the leaky guard `not mp_distributed or rank % n == 0`,
    true on every rank when torchrun starts the job."""

    def __init__(self, project: Project):
        self.p = project
        self.flags: dict[str, set[str]] = {}      # module rel -> names assigned from a rank-0 test
        self.leaky_fns: set[str] = set()          # names of functions returning a leaky rank-0 test
        self.rank0_fns: set[str] = set()
        for m in project.modules.values():
            for f in m.functions.values():
                rets = [r.value for r in ast.walk(f) if isinstance(r, ast.Return) and r.value is not None]
                if rets and all(self.classify(m, r, shallow=True) == "rank0" for r in rets):
                    self.rank0_fns.add(f.name)
                elif rets and any(self.classify(m, r, shallow=True) == "leaky" for r in rets):
                    self.leaky_fns.add(f.name)
        for m in project.modules.values():
            names = set()
            for a in ast.walk(m.tree):
                if isinstance(a, ast.Assign) and self.classify(m, a.value) == "rank0":
                    names |= {dotted(t) for t in a.targets}
            self.flags[m.rel] = names

    def classify(self, m: Module, t: ast.AST, shallow: bool = False) -> str | None:
        """'rank0' (the true branch is rank 0 only), 'not0' (it excludes rank 0), 'leaky', or None."""
        if isinstance(t, ast.BoolOp):
            kinds = [self.classify(m, v, shallow) for v in t.values]
            if isinstance(t.op, ast.And):
                return "rank0" if "rank0" in kinds else "not0" if "not0" in kinds else \
                    "leaky" if "leaky" in kinds else None
            negated = [v for v in t.values if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not)
                       and not involves_rank(v, m.rank_tainted)]
            if "rank0" in kinds and negated:
                return "leaky"
            return "rank0" if kinds and all(k == "rank0" for k in kinds) else \
                "leaky" if "leaky" in kinds or "rank0" in kinds else None
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
            if not involves_rank(left, m.rank_tainted):
                return None
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Set, ast.Tuple, ast.List)):
                has0 = any(isinstance(e, ast.Constant) and e.value == 0 for e in right.elts)
                if has0:
                    return "rank0" if isinstance(op, ast.In) else "not0"
                return None
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
            name = _callee(t)
            if not shallow and name in self.leaky_fns:
                return "leaky"
            if RANK0_NAME.search(name) or (not shallow and name in self.rank0_fns):
                return "rank0"
            return None
        if isinstance(t, (ast.Name, ast.Attribute)):
            name = dotted(t)
            if RANK0_NAME.search(name.split(".")[-1]) or (not shallow and name in self.flags.get(m.rel, ())):
                return "rank0"
            if involves_rank(t, m.rank_tainted) and not RANK0_NAME.search(name):
                return "not0"  # `if local_rank:` is true on every rank but 0
        return None

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
            body = getattr(n, "body", None)
            if isinstance(body, list) and any(child is s for s in body) and self._after_early_exit(m, body, child):
                return "rank0"
            child, n = n, m.parent.get(id(n))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and self._after_early_exit(m, n.body, child):
            return "rank0"
        return None

    def _after_early_exit(self, m: Module, body: list, child: ast.AST) -> bool:
        """`if rank != 0: return` (or continue) earlier in the same block: the rest is rank 0's alone."""
        for s in body:
            if s is child:
                return False
            if isinstance(s, ast.If) and self.classify(m, s.test) == "not0" and s.body and isinstance(
                    s.body[-1], (ast.Return, ast.Continue, ast.Break)):
                return True
        return False

    def effective(self, m: Module, node: ast.AST, depth: int = 3) -> str | None:
        """kind() through the callers: a function called only under a rank-0 guard runs on rank 0 only."""
        k = self.kind(m, node)
        if k or depth == 0:
            return k
        fn = m.enclosing(node)
        if fn is None:
            return None
        sites = self.p.callers(m, fn)
        if not sites:
            return None
        kinds = {self.effective(cm, c, depth - 1) for cm, c in sites}
        if kinds == {"rank0"}:
            return "rank0"
        if "leaky" in kinds and kinds <= {"rank0", "leaky"}:
            return "leaky"
        return None


# ---------------------------------------------------------------------------------------------- the audit
class _Audit:
    def __init__(self, project: Project):
        self.p = project
        self.g = Guards(project)
        self.found: list[Finding] = []
        self.ddp_wrapped = self._ddp_wrapped_names()
        self.print_override = any(
            isinstance(a, ast.Assign) and any(dotted(t) in ("builtins.print", "__builtin__.print") for t in a.targets)
            for m in project.modules.values() for a in ast.walk(m.tree))

    def add(self, m: Module, node: ast.AST, rule: str, msg: str, severity: str = "defect"):
        line = getattr(node, "lineno", 0) or 1
        self.found.append(Finding(line, rule, msg, severity, str(m.path)))

    # --- shared facts
    def _ddp_wrapped_names(self) -> dict[str, dict[str, int]]:
        """Per module: names assigned a DDP wrap (any import alias, or a project function returning one)."""
        wrappers = {f.name for m in self.p.modules.values() for f in m.functions.values()
                    if any(isinstance(r, ast.Return) and isinstance(r.value, ast.Call) and self.is_ddp_call(m, r.value)
                           for r in ast.walk(f))}
        out = {}
        for m in self.p.modules.values():
            names = {}
            for a in ast.walk(m.tree):
                v = a.value if isinstance(a, ast.Assign) else None
                while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in (
                        "to", "cuda", "train", "eval") and isinstance(v.func.value, ast.Call):
                    v = v.func.value  # DDP(model, ...).to(device)
                if isinstance(v, ast.Call) and (self.is_ddp_call(m, v) or _callee(v) in wrappers):
                    for t in a.targets:
                        names[dotted(t)] = a.lineno
            out[m.rel] = names
        return out

    @staticmethod
    def is_ddp_call(m: Module, c: ast.Call) -> bool:
        name = _callee(c)
        if name in DDP_NAMES:
            return True
        imp = m.imports.get(name)
        return bool(imp and imp[1] and "DistributedDataParallel" in imp[1])

    def seed_kind(self, m: Module, c: ast.Call, direct: bool = False) -> str | None:
        """'torch' (seeds torch's CPU RNG: the model init), 'cuda', 'other' (random/numpy), or None; `direct`:
        without looking into project helpers."""
        d = dotted(c.func)
        if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, (ast.Call, ast.Subscript)):
            return None  # torch.Generator().manual_seed(...)
        if d in CUDA_SEEDS:
            return "cuda"
        if d in TORCH_SEEDS:
            if d == "manual_seed" and m.imports.get("manual_seed", ("", "", 0))[0] != "torch":
                return None
            return "torch"
        if d in OTHER_SEEDS:
            return "other"
        name = _callee(c)
        if SEED_HELPER.search(name) and "." not in d.replace("self.", "") and not self.p.resolve(m, c):
            return "torch"  # an unseen helper named like a seeder (init_seeds, fix_random_seeds)
        if SEED_HELPER.search(name) and isinstance(c.func, ast.Attribute) and _root(c.func.value) in m.imports \
                and not self.p.resolve(m, c) and self.p.module_for(m, _root(c.func.value)) is None:
            return "torch"  # utils.fix_random_seeds(...) from a module outside the audited folder
        if not direct:
            for tm, tf in self.p.resolve(m, c):  # a project helper that seeds torch (fix_random_seeds(args.seed))
                if self.p.function_does(tm, tf, lambda mm, cc: self.seed_kind(mm, cc, True) == "torch", depth=3):
                    return "torch"
        return None

    def reduced_names(self, m: Module, scope: ast.AST) -> set[str]:
        """Names in `scope` that hold a value averaged over ranks (flow-insensitive, to a fixpoint)."""
        def collective_helper(c):
            return any(self.p.function_does(tm, tf, lambda mm, cc: _callee(cc) in COLLECTIVES, depth=2)
                       for tm, tf in self.p.resolve(m, c))
        red: set[str] = set()
        for c in (n for n in ast.walk(scope) if isinstance(n, ast.Call)):
            if _callee(c) in ("all_reduce", "reduce", "all_gather") and c.args:
                red.add(_root(c.args[0]))
        # a model is no reduced value: convert_sync_batchnorm(model) or DDP(model) does not make model(x)'s loss
        # an average over ranks; what the model's forward returns is judged by _forward_reduced instead
        models = self._model_names(m)
        changed = True
        nodes = list(ast.walk(scope))
        while changed:
            changed = False
            for a in nodes:
                targets, value = [], None
                if isinstance(a, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and a.value is not None:
                    targets = a.targets if isinstance(a, ast.Assign) else [a.target]
                    value = a.value
                elif isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr in (
                        "update", "append", "add_") and a.args:
                    targets, value = [a.func.value], a.args[0]
                if value is None:
                    continue
                hit = any(isinstance(n, ast.Call) and (REDUCEISH.search(_callee(n)) and "batchnorm" not in
                                                       _callee(n).lower() or collective_helper(n)
                                                       or self._forward_reduced(m, n))
                          for n in ast.walk(value)) or any(
                    _root(n) in red for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute)))
                if not hit:
                    continue
                for t in targets:
                    for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        r = _root(e)
                        if r and r not in red and r not in models:
                            red.add(r)
                            changed = True
        return red

    def _model_class(self, m: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
        """The project nn.Module class a name holds: `model = BarlowTwins(args).cuda(gpu)` (DDP(model) keeps it).
        Other project classes (an AverageMeter of reduced values) are no model."""
        found = self._any_class(m, name)
        if found and any(dotted(b).split(".")[-1] == "Module" for b in found[1].bases):
            return found
        return None

    def _any_class(self, m: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
        for a in ast.walk(m.tree):
            if not (isinstance(a, ast.Assign) and any(dotted(t) == name for t in a.targets)):
                continue
            v = a.value
            while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in (
                    "to", "cuda", "train", "eval", "float", "half") and isinstance(v.func.value, ast.Call):
                v = v.func.value
            if not isinstance(v, ast.Call) or not isinstance(v.func, ast.Name):
                continue
            if v.func.id in m.classes:
                return m, m.classes[v.func.id]
            target = self.p.module_for(m, v.func.id)
            cls = m.imports.get(v.func.id, ("", None, 0))[1] or v.func.id
            if target is not None and cls in target.classes:
                return target, target.classes[cls]
        return None

    def _model_names(self, m: Module) -> set[str]:
        if not hasattr(self, "_models_cache"):
            self._models_cache = {}
        if m.rel not in self._models_cache:
            names = set(self.ddp_wrapped.get(m.rel, {}))
            for a in ast.walk(m.tree):
                if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and (
                        "batchnorm" in _callee(a.value).lower() or self._model_class(m, dotted(a.targets[0]))):
                    names |= {dotted(t) for t in a.targets}
            self._models_cache[m.rel] = names
        return self._models_cache[m.rel]

    def _forward_reduced(self, m: Module, c: ast.Call) -> bool:
        """`loss = model(x)` or `model.forward(x)` where the model's class computes its loss from a reduced value
        (Barlow Twins all-reduces the cross-correlation before the loss): every value forward returns is
        reduced there."""
        f = c.func
        if isinstance(f, ast.Attribute) and f.attr in ("forward", "module"):
            f = f.value  # model.forward(x), model.module(x)
        found = self._model_class(m, dotted(f)) if isinstance(f, (ast.Name, ast.Attribute)) else None
        fwd = found[0].functions.get(f"{found[1].name}.forward") if found else None
        rets = [r.value for r in ast.walk(fwd) if isinstance(r, ast.Return) and r.value is not None] if fwd else []
        if not rets:
            return False
        tm = found[0]
        red = self.reduced_names(tm, fwd)
        return all(any(_root(n) in red for n in ast.walk(r) if isinstance(n, (ast.Name, ast.Attribute)))
                   for r in rets)

    def run(self) -> list[Finding]:
        for m in self.p.modules.values():
            self.samplers(m)
            self.logging(m)
            self.saving(m)
            self.collectives(m)
            self.misc(m)
        for m in self.p.modules.values():
            if m.entry and self.p.ddp:
                self.seeds(m)
        for m in self.p.modules.values():
            self.seed_per_rank(m)
        return sorted(set(self.found), key=lambda f: (f.path, f.line, f.rule))

    # --- samplers (ch03)
    def _sampler_classes(self) -> set[str]:
        out = {"DistributedSampler", "DistributedBucketSampler"}
        for m in self.p.modules.values():
            for c in m.classes.values():
                if any("DistributedSampler" in dotted(b) for b in c.bases) or "DistributedSampler" in c.name:
                    out.add(c.name)
        return out

    def samplers(self, m: Module):
        classes = self._sampler_classes()
        made = [c for c in m.calls if _callee(c) in classes and not isinstance(m.parent.get(id(c)), ast.ClassDef)]
        made = [c for c in made if not (m.enclosing(c) is not None and m.enclosing(c).name == "__init__"
                                        and "super" in dotted(c.func))]
        if not made:
            return
        if not any(mm.entry for mm in self.p.modules.values()):
            return  # a loader library audited alone: whether set_epoch is called is the training script's business
        # only the scripts that use this sampler's code count: a sibling script's set_epoch is not this one's
        set_epochs = [(mm, c) for mm in self.p.related(m) for c in mm.calls if _callee(c) == "set_epoch"]
        setters = {mm.rel for mm, _ in set_epochs}
        for c in made:
            if not set_epochs:
                self.add(m, c, "set-epoch-missing", "DistributedSampler without any sampler.set_epoch(epoch) call "
                         "in the project: every epoch repeats epoch 0's order, and the run leaves the single run at "
                         "the first epoch boundary")
                break
        else:
            self._set_epoch_switch(m, made, set_epochs)
            if m.rel in setters or True:
                self._set_epoch_late(set_epochs)
        for c in m.calls:
            if _callee(c) != "DataLoader":
                continue
            sampler, shuffle = _kw(c, "sampler"), _kw(c, "shuffle")
            if sampler is not None and isinstance(shuffle, ast.Constant) and shuffle.value is True and (
                    isinstance(sampler, ast.Call) and _callee(sampler) in classes or any(
                        isinstance(a, ast.Assign) and dotted(a.targets[0]) == dotted(sampler) and any(
                            isinstance(v, ast.Call) and _callee(v) in classes for v in _branches(a.value))
                        for a in ast.walk(m.tree))):
                self.add(m, c, "sampler-with-shuffle", "DataLoader(sampler=DistributedSampler(...), shuffle=True): "
                         "torch raises 'sampler option is mutually exclusive with shuffle'; shuffle in the sampler")

    def _switch(self, mm: Module, node: ast.AST) -> ast.AST | None:
        """The `if args.distributed:`-like test that guards `node` in its function, if any: an enclosing if, or
        an earlier `if world_size == 1: return ...` in the same block."""
        child, n = node, mm.parent.get(id(node))
        while n is not None and not isinstance(n, ast.Module):
            if isinstance(n, (ast.If, ast.IfExp)) and (involves(n.test, DIST_SWITCH) or involves(n.test, WORLDISH)):
                return n.test
            for s in getattr(n, "body", []) if isinstance(getattr(n, "body", None), list) else []:
                if s is child:
                    break
                if isinstance(s, ast.If) and (involves(s.test, DIST_SWITCH) or involves(s.test, WORLDISH)) and \
                        s.body and isinstance(s.body[-1], ast.Return):
                    return s.test
            if isinstance(n, ast.FunctionDef):
                break
            child, n = n, mm.parent.get(id(n))
        return None

    def _set_epoch_switch(self, m: Module, made: list, set_epochs: list):
        """set_epoch only `if args.distributed` while the sampler is built unconditionally."""
        if all(self._switch(mm, c) is not None for mm, c in set_epochs) and any(
                self._switch(m, c) is None and m.enclosing(c, (ast.IfExp,)) is None for c in made):
            mm, c = set_epochs[0]
            test = ast.unparse(self._switch(mm, c))
            if any(isinstance(m.parent.get(id(x)), ast.IfExp) for x in made):
                return
            self.add(mm, c, "set-epoch-missing", f"set_epoch runs only when `{test}`, but the DistributedSampler "
                     f"(line {made[0].lineno}) is built either way: without it every epoch repeats epoch 0's order")

    def _set_epoch_late(self, set_epochs: list):
        """set_epoch after the loader's iterator exists: `it = iter(loader)` before it in the same block, or one
        persistent iterator made outside the loop that calls set_epoch."""
        for mm, c in set_epochs:
            stmt = c
            while not isinstance(mm.parent.get(id(stmt)), (ast.FunctionDef, ast.Module, ast.For, ast.While, ast.If,
                                                            ast.With, ast.Try, ast.ExceptHandler)):
                stmt = mm.parent.get(id(stmt))
                if stmt is None:
                    break
            block_owner = mm.parent.get(id(stmt)) if stmt is not None else None
            block = next((b for b in (getattr(block_owner, "body", []), getattr(block_owner, "orelse", []))
                          if any(s is stmt for s in b)), [])
            before = block[:next((i for i, s in enumerate(block) if s is stmt), 0)]
            made_iter = [s for s in before if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                         and _callee(s.value) in ("iter", "cycle")]
            if made_iter:
                self.add(mm, c, "set-epoch-late", f"set_epoch after `{ast.unparse(made_iter[-1])}` (line "
                         f"{made_iter[-1].lineno}): the iterator already fixed the epoch's order, so this epoch "
                         "repeats the previous one's; call set_epoch first, then iter(loader)")
                continue
            fn = mm.enclosing(c)
            if fn is None or mm.enclosing(c, (ast.For, ast.While)) is None:
                continue
            iters = [s for s in ast.walk(fn) if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                     and _callee(s.value) in ("iter", "cycle", "sample_data", "infinite_loader")
                     and mm.enclosing(s, (ast.For, ast.While)) is None]
            nexts = any(isinstance(n, ast.Call) and _callee(n) == "next" and n.args
                        and any(dotted(n.args[0]) == dotted(t) for s in iters for t in s.targets)
                        for n in ast.walk(fn))
            if iters and nexts:
                self.add(mm, c, "set-epoch-late", f"set_epoch inside the loop, but the loader's iterator is made once "
                         f"(line {iters[0].lineno}) and never re-made: the new epoch's order never reaches it, so "
                         "epoch 1 repeats epoch 0's order")

    # --- seeds (ch02)
    def _entry_scope(self, m: Module) -> set:
        keys = {(m.rel, id(f)) for f in m.functions.values()}
        for f in list(m.functions.values()):
            keys |= self.p.reach(m, f)
        for c in (n for s in m.tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  for n in ast.walk(s) if isinstance(n, ast.Call)):
            for tm, tf in self.p.resolve(m, c):
                keys |= self.p.reach(tm, tf)
        return keys

    def _setup_line(self, m: Module) -> ast.AST:
        """Where the entry sets up the process group: its init_process_group, a call of a helper that does,
        the DDP wrap, or the main guard."""
        inits = [c for c in m.calls if _callee(c) == "init_process_group"]
        if inits:
            return min(inits, key=lambda c: c.lineno)
        helper = [c for c in m.calls if any(self.p.function_does(tm, tf, lambda mm, cc: _callee(cc) ==
                                                                 "init_process_group")
                                            for tm, tf in self.p.resolve(m, c))]
        if helper:
            return min(helper, key=lambda c: c.lineno)
        wraps = [c for c in m.calls if self.is_ddp_call(m, c)]
        return min(wraps, key=lambda c: c.lineno) if wraps else (m.has_main_guard() or m.tree.body[0])

    def seeds(self, m: Module):
        scope = self._entry_scope(m)
        calls = [(m, c) for c in m.calls] + [(mm, c) for mm, c in self.p.calls_in(scope) if mm is not m]
        if not any(_callee(c) in ("init_process_group", "spawn") or self.is_ddp_call(mm, c) for mm, c in calls):
            return  # a script that never sets up DDP (a CLI, a plotting tool): no DDP run to compare
        kinds = {self.seed_kind(mm, c) for mm, c in calls} - {None}
        if not kinds & {"torch", "other"}:
            what = "only torch.cuda is seeded" if "cuda" in kinds else "nothing seeds torch"
            self.add(m, self._setup_line(m), "no-seed", f"{what} (in this script or the helpers it calls): rank 0's "
                     "initial weights (which DDP broadcasts) and every draw differ from any single run, so the two "
                     "runs cannot be compared — torch.manual_seed(seed) before building the model")
            return
        for c in m.calls:
            if _callee(c) not in SPAWNS or not c.args:
                continue
            target = self.p.resolve(m, ast.Call(func=c.args[0], args=[], keywords=[]))
            if not target:
                continue
            tm, tf = target[0]
            inside = {self.seed_kind(mm, cc) for mm, cc in self.p.calls_in(self.p.reach(tm, tf))} - {None}
            parent = m.enclosing(c) or m.tree
            before = [cc for cc in ast.walk(parent) if isinstance(cc, ast.Call) and self.seed_kind(m, cc) == "torch"
                      and cc.lineno < c.lineno]
            if "torch" not in inside and before:
                self.add(m, c, "seed-before-spawn", f"{dotted(before[0].func)}(...) (line {before[0].lineno}) seeds "
                         f"the parent only: the processes mp.spawn starts run {tf.name}() in a fresh interpreter "
                         f"and {'only seed torch.cuda' if 'cuda' in inside else 'never seed torch'}, so the DDP "
                         "run's init (built on the CPU) is unseeded while the single run's is seeded — seed inside "
                         f"{tf.name}()")

    def _single_value(self, m: Module, name: str, depth: int = 0) -> float | None:
        """The value a rank-holding name has in the single (non-distributed) run: its non-rank assignment, the
        environment default (`os.environ.get("RANK", -1)`), the argparse default, else 0."""
        if depth > 4:
            return 0
        consts, sources = [], []
        for a in ast.walk(m.tree):
            if isinstance(a, ast.Assign) and any(dotted(t) == name for t in a.targets):
                if not involves_rank(a.value, m.rank_tainted):
                    if isinstance(a.value, ast.Constant) and isinstance(a.value.value, (int, float)):
                        consts.append(a.value.value)
                else:
                    sources.append(a.value)
        if consts:
            return consts[0]
        for v in sources:
            for n in ast.walk(v):
                if isinstance(n, ast.Call) and _callee(n) in ("get", "getenv") and len(n.args) == 2 and \
                        _const_str(n.args[0]) in ("RANK", "LOCAL_RANK"):
                    d = n.args[1]
                    d = d.value if isinstance(d, ast.Constant) else ast.literal_eval(d) if isinstance(
                        d, ast.UnaryOp) else None
                    try:
                        return float(d)
                    except (TypeError, ValueError):
                        return 0
            if isinstance(v, (ast.Name, ast.Attribute)) and dotted(v) != name:
                return self._single_value(m, dotted(v), depth + 1)
        leaf = name.split(".")[-1]
        for c in m.calls:
            if _callee(c) == "add_argument" and any(_const_str(a) in (f"--{leaf}", f"--{leaf.replace('_', '-')}")
                                                    for a in c.args):
                d = _kw(c, "default")
                if isinstance(d, ast.UnaryOp) and isinstance(d.operand, ast.Constant):
                    return -d.operand.value
                if isinstance(d, ast.Constant) and isinstance(d.value, (int, float)):
                    return d.value
        return 0

    def _seed_value(self, m: Module, expr: ast.AST, rank_value) -> float | None:
        """The seed an expression gives with every rank-holding name set by rank_value(name), other names 1000."""
        class Sub(ast.NodeTransformer):
            def visit_Name(s, n):
                return ast.Constant(rank_value(n.id) if _is_rankish_node(n, m.rank_tainted) else 1000)

            def visit_Attribute(s, n):
                return ast.Constant(rank_value(dotted(n)) if _is_rankish_node(n, m.rank_tainted) else 1000)

            def visit_Call(s, n):
                return ast.Constant(rank_value("get_rank") if _is_rankish_node(n, m.rank_tainted) else 1000)
        import warnings

        try:
            warnings.simplefilter("ignore", SyntaxWarning)
            body = Sub().visit(ast.parse(ast.unparse(expr), mode="eval").body)
            tree = ast.fix_missing_locations(ast.Expression(body))
            return eval(compile(tree, "<seed>", "eval"), {"__builtins__": {}}, {})  # noqa: S307 (constants only)
        except Exception:  # noqa: BLE001 - an expression we cannot evaluate is no finding
            return None

    @staticmethod
    def _inline(m: Module, expr: ast.AST, depth: int = 3) -> ast.AST:
        """`seed = args.seed + utils.get_rank(); torch.manual_seed(seed)`: a name that only carries a rank (it is
        no rank itself, and has one assignment) is replaced by its expression, so the rank term is judged as
        written, not the intermediate name taken for the rank."""
        if depth == 0 or not isinstance(expr, (ast.Name, ast.Attribute)) or RANKISH.search(
                dotted(expr).split(".")[-1]) or dotted(expr) not in m.rank_tainted:
            return expr
        defs = [a.value for a in ast.walk(m.tree) if isinstance(a, ast.Assign) and len(a.targets) == 1
                and dotted(a.targets[0]) == dotted(expr)]
        return _Audit._inline(m, defs[0], depth - 1) if len(defs) == 1 else expr

    def seed_per_rank(self, m: Module):
        for c in m.calls:
            if self.seed_kind(m, c) not in ("torch", "other") or not c.args:
                continue
            arg = self._inline(m, c.args[0])
            if not involves_rank(arg, m.rank_tainted, skip_conditional=True):
                continue
            at0 = self._seed_value(m, arg, lambda name: 0)
            single = self._seed_value(m, arg, lambda name: self._single_value(m, name) or 0)
            if at0 is not None and single is not None and at0 != single:
                self.add(m, c, "seed-per-rank", f"{ast.unparse(c)} seeds rank 0 with {ast.unparse(arg)} = "
                         f"seed{at0 - 1000:+g}, but the single run (rank variable {single - at0 + 0:+g} from rank 0's "
                         f"value) seeds seed{single - 1000:+g}: rank 0's init and draws are not the single run's; "
                         "make rank 0's seed equal the single run's (e.g. seed + max(rank, 0))")
                continue
            fn = m.enclosing(c) or m.tree
            wrap = min((a.lineno for a in ast.walk(fn) if isinstance(a, ast.Call) and self.is_ddp_call(m, a)),
                       default=None)
            copies = [a for a in ast.walk(fn) if isinstance(a, ast.Call) and a.lineno > c.lineno and
                      (wrap is None or a.lineno < wrap) and (_callee(a) in ("deepcopy", "ModelEMA", "ModelEmaV2",
                                                                             "ExponentialMovingAverage", "EMA")
                                                             or "ema" in _callee(a).lower())]
            if wrap is not None and copies:
                self.add(m, copies[0], "seed-per-rank", f"{ast.unparse(copies[0])} copies each rank's own init "
                         f"(seeded per rank at line {c.lineno}) before the DDP wrap (line {wrap}), which broadcasts "
                         "rank 0's weights to the wrapped model only: ranks other than 0 keep another copy — make "
                         "the copy after the wrap, or check that only rank 0's copy is ever used", "check-by-hand")

    # --- logging (ch01)
    def _trains(self, m: Module, node: ast.AST) -> bool:
        """Whether the code around `node` runs backward or an optimizer step (a training loop's loss)."""
        fn = m.enclosing(node)
        scope = [fn] if fn is not None else [s for s in m.tree.body
                                             if not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
        def steps(n):
            return isinstance(n, ast.Call) and _callee(n) in ("backward", "step") and (
                _callee(n) == "backward" or "optim" in dotted(n.func))
        if any(steps(n) for sc in scope for n in ast.walk(sc)):
            return True
        # the step in a helper this function calls (`batch_loss = self._run_batch(...)`, then print(batch_loss))
        return fn is not None and self.p.function_does(m, fn, lambda mm, cc: steps(cc), depth=2)

    def logging(self, m: Module):
        if not self.p.ddp:
            return
        per_block = set()
        for c in m.calls:
            name = _callee(c)
            if name not in LOG_CALLS or name in ("logkv", "logkv_mean"):
                continue
            values = [*c.args, *[k.value for k in c.keywords if k.arg not in ("force", "file", "flush")]]
            names = {_root(n) for v in values for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute))}
            names |= {dotted(n).split(".")[-1] for v in values for n in ast.walk(v) if isinstance(n, ast.Attribute)}
            lossy = {n for n in names if n and LOSSISH.search(n) and not NOT_A_LOSS.search(n)}
            scope = m.enclosing(c) or m.tree
            lossy |= self._packed_losses(m, scope, names - lossy)
            if not lossy or not self._trains(m, c):
                continue
            red = self.reduced_names(m, scope)
            if all(n in red or any(r and (n.startswith(r) or r.endswith("." + n)) for r in red) for n in lossy):
                continue
            kind = self.g.effective(m, c)
            forced = _kw(c, "force")
            if kind == "rank0" or (name == "print" and self.print_override and kind is None and not forced):
                block = self._guard_block(m, c)
                if (m.rel, block) in per_block:
                    continue
                per_block.add((m.rel, block))
                how = "through the builtins.print override (setup_for_distributed), " \
                    if kind is None else ""
                self.add(m, c, "rank0-local-loss", f"rank 0 logs {', '.join(sorted(lossy))} {how}which no "
                         "reduction averaged: its own micro-batch's loss, not the global batch's — "
                         "all_reduce(loss, SUM) / world_size before logging")
            elif kind is None and name == "print" and not self.print_override:
                self.add(m, c, "every-rank-prints-loss", f"every rank prints its own {', '.join(sorted(lossy))}: "
                         "world_size interleaved numbers, none of them the global batch's loss — all_reduce it, "
                         "then print on rank 0")

    @staticmethod
    def _packed_losses(m: Module, scope: ast.AST, names: set[str]) -> set[str]:
        """Losses packed into a record that is then logged: `stats = dict(epoch=epoch, loss=loss.item())` ...
        `print(json.dumps(stats))`; the loss values' own names."""
        out = set()
        for a in ast.walk(scope):
            if not (isinstance(a, ast.Assign) and any(dotted(t) in names for t in a.targets)
                    and isinstance(a.value, (ast.Call, ast.Dict))):
                continue
            v = a.value
            if isinstance(v, ast.Dict):  # {"loss": loss.item(), ...}; a **spread has no key
                pairs = [(_const_str(k), val) for k, val in zip(v.keys, v.values, strict=True)]
            else:  # dict(loss=loss.item(), ...)
                pairs = [(k.arg, k.value) for k in v.keywords] if _callee(v) == "dict" else []
            for key, val in pairs:
                if key and LOSSISH.search(key) and not NOT_A_LOSS.search(key):
                    out |= {_root(n) for n in ast.walk(val) if isinstance(n, (ast.Name, ast.Attribute))
                            and LOSSISH.search(_root(n))}
        return out

    def _guard_block(self, m: Module, c: ast.AST) -> int:
        n = m.parent.get(id(c))
        while n is not None and not isinstance(n, (ast.If, ast.FunctionDef, ast.Module)):
            n = m.parent.get(id(n))
        return getattr(n, "lineno", 0)

    # --- saving and loading (ch00, ch08)
    def saving(self, m: Module):
        if not self.p.ddp:
            return
        wrapped = self.ddp_wrapped.get(m.rel, {})
        data_parallel = {dotted(t) for a in ast.walk(m.tree) if isinstance(a, ast.Assign) and isinstance(
            a.value, ast.Call) and _callee(a.value) == "DataParallel" for t in a.targets}
        for c in m.calls:
            name = _callee(c)
            if name == "state_dict" and isinstance(c.func, ast.Attribute):
                owner = dotted(c.func.value)
                if owner in wrapped and c.lineno > wrapped[owner] and owner not in data_parallel and \
                        self._same_scope(m, c, owner, wrapped[owner]) and not self._unwrapped_between(m, c, owner) \
                        and not self._loaded_into_wrapped(m, owner, wrapped[owner]):
                    self.add(m, c, "save-without-module", f"{owner}.state_dict() after {owner} = DDP(...) (line "
                             f"{wrapped[owner]}): every key gets a 'module.' prefix and the checkpoint does not load "
                             f"into the plain model — save {owner}.module.state_dict() on rank 0")
            elif name == "load" and dotted(c.func) in ("torch.load", "th.load") and len(c.args) < 2 and (
                    Project._mentions_ddp(m) or m.rank_tainted) and re.search(
                    r"ckpt|checkpoint|resume|weight|model|pretrain|snapshot|state|\.pth?\b", ast.unparse(c), re.I) and \
                    _kw(c, "map_location") is None and not any(k.arg is None for k in c.keywords) and not (
                        c.args and isinstance(c.args[0], ast.Call) and _callee(c.args[0]) == "BytesIO"):
                self.add(m, c, "load-without-map-location", f"{ast.unparse(c)} has no map_location: every rank "
                         "maps the tensors to the device that saved them (cuda:0), so all ranks fill GPU 0 — "
                         "map_location='cpu' (or the rank's own device)")
        for c in m.calls:
            if not self._is_save(m, c):
                continue
            target = c.args[1] if dotted(c.func).endswith("save") and len(c.args) > 1 else _kw(c, "f")
            if target is not None and (involves_rank(target, m.rank_tainted) or "buf" in dotted(target).lower()
                                       or isinstance(target, ast.Call) and _callee(target) == "BytesIO"):
                continue  # per-rank file names, or an in-memory buffer
            fn = m.enclosing(c)
            kind = self.g.effective(m, c)
            if kind in ("rank0", "not0") or self._guarded_inside(m, c):
                continue
            sites = self.p.callers(m, fn) if fn is not None else []
            if fn is not None and dotted(c.func) in ("torch.save", "th.save") and sites and re.search(
                    r"save|checkpoint|serialize", fn.name.lower()):
                continue  # inside a save helper: each call of the helper is judged where it is made
            if fn is not None and not sites and not m.entry:
                continue  # a library function nobody in the audited files calls: its callers decide
            self._every_rank_save(m, c, kind)

    def _every_rank_save(self, m: Module, c: ast.AST, kind):
        if kind == "leaky":
            self.add(m, c, "save-on-every-rank", f"{ast.unparse(c.func)}(...) under a guard like `not "
                     "multiprocessing_distributed or rank % ngpus == 0`: when torchrun starts the job that flag is "
                     "off, so the guard is true on every rank and every rank writes the same file — guard with "
                     "`dist.get_rank() == 0`")
        else:
            self.add(m, c, "save-on-every-rank", f"{ast.unparse(c.func)}(...) runs on every rank: world_size "
                     "processes write one file at once (a torn or mixed checkpoint) — save on rank 0 only, then "
                     "barrier outside the if")

    def _is_save(self, m: Module, c: ast.Call) -> bool:
        """A checkpoint save: torch.save of model/optimizer state, or a project helper named like one
        (save_checkpoint(...)) that calls torch.save. A dataset caching a tensor is no checkpoint."""
        if dotted(c.func) in ("torch.save", "th.save"):
            text = ast.unparse(c).lower()
            return bool(re.search(r"state|model|optim|ckpt|checkpoint|snapshot|epoch|package|net", text))
        return any(tf.name == _callee(c) and re.search(r"save|checkpoint|serialize", tf.name.lower())
                   and self.p.function_does(tm, tf, lambda mm, cc: dotted(cc.func) in ("torch.save", "th.save"), 1)
                   for tm, tf in self.p.resolve(m, c))

    def _guarded_inside(self, m: Module, c: ast.Call) -> bool:
        """A save helper that guards itself (`def save_on_master(...): if is_main_process(): torch.save(...)`):
        calling it on every rank writes once."""
        if dotted(c.func) in ("torch.save", "th.save"):
            return False
        saves = [(tm, cc) for tm, tf in self.p.resolve(m, c) for cc in ast.walk(tf) if isinstance(cc, ast.Call)
                 and dotted(cc.func) in ("torch.save", "th.save")]
        return bool(saves) and all(self.g.kind(tm, cc) == "rank0" for tm, cc in saves)

    @staticmethod
    def _loaded_into_wrapped(m: Module, owner: str, wrap_line: int) -> bool:
        """`model.load_state_dict(ckpt["model"])` on the DDP-wrapped name after the wrap: the script resumes its
        own wrapped checkpoint, so the module. prefix round-trips (a plain model never reads that file here)."""
        return any(isinstance(c, ast.Call) and _callee(c) == "load_state_dict" and isinstance(c.func, ast.Attribute)
                   and dotted(c.func.value) == owner and c.lineno > wrap_line for c in m.calls)

    @staticmethod
    def _same_scope(m: Module, c: ast.AST, owner: str, line: int) -> bool:
        if owner.startswith("self."):
            return True
        fn = m.enclosing(c)
        return any(isinstance(a, ast.Assign) and a.lineno == line for a in ast.walk(fn or m.tree))

    @staticmethod
    def _unwrapped_between(m: Module, c: ast.AST, owner: str) -> bool:
        fn = m.enclosing(c) or m.tree
        return any(isinstance(a, ast.Assign) and any(dotted(t) == owner for t in a.targets) and
                   dotted(a.value).endswith(".module") and a.lineno < c.lineno for a in ast.walk(fn))

    # --- collectives (ch00, ch08)
    def _collective(self, m: Module, c: ast.Call) -> bool:
        if _callee(c) in COLLECTIVES and ("dist" in dotted(c.func) or dotted(c.func) in COLLECTIVES
                                          or "distributed" in dotted(c.func)):
            return not (isinstance(c.func, ast.Attribute) and _root(c.func.value) in ("MPI", "comm", "self"))
        return any(self.p.function_does(tm, tf, lambda mm, cc: _callee(cc) in COLLECTIVES and "dist" in
                                        dotted(cc.func), 2) for tm, tf in self.p.resolve(m, c))

    def collectives(self, m: Module):
        if not self.p.ddp:
            return
        wrapped = self.ddp_wrapped.get(m.rel, {})
        for c in m.calls:
            kind = self.g.kind(m, c)
            if kind not in ("rank0", "not0"):
                continue
            if self._collective(m, c):
                fn = m.enclosing(c) or m.tree
                name = _callee(c)
                other = "not0" if kind == "rank0" else "rank0"
                paired = any(isinstance(o, ast.Call) and _callee(o) == name and o is not c and
                             self.g.kind(m, o) in (other, None) for o in ast.walk(fn))
                if paired:
                    continue  # `if rank != 0: barrier()` ... `if rank == 0: barrier()`: every rank meets once
                who = "rank 0 only" if kind == "rank0" else "every rank but 0"
                self.add(m, c, "collective-under-rank0", f"{ast.unparse(c.func)}(...) runs on {who} (its guard, or "
                         "an early return of the others): the ranks that skip it never join, so the ones that call "
                         "it wait forever (a hang) — move it outside the rank branch")
                continue
            if kind != "rank0":
                continue
            if isinstance(c.func, (ast.Name, ast.Attribute)) and dotted(c.func) in wrapped and \
                    self._same_scope(m, c, dotted(c.func), wrapped[dotted(c.func)]):
                self.add(m, c, "ddp-forward-under-rank0", f"{dotted(c.func)}(...) is the DDP-wrapped model, called "
                         "by rank 0 alone: with broadcast_buffers=True (the default) and a module that has buffers "
                         "its forward broadcasts them and waits for the other ranks (a hang), and with grad on the "
                         f"next backward does — call {dotted(c.func)}.module(...) for rank-0-only evaluation",
                         "check-by-hand")

    # --- the rest: reduction, gather, eval padding, ports, accumulation, BatchNorm
    def misc(self, m: Module):
        if not self.p.ddp:
            return
        world_mults = [n for n in ast.walk(m.tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                       and (involves(n.left, WORLDISH) or involves(n.right, WORLDISH))]
        for c in m.calls:
            if not world_mults and any(k.arg == "reduction" and _const_str(k.value) == "sum" for k in c.keywords):
                self.add(m, c, "sum-loss-unscaled", "reduction='sum' under DDP without a x world_size: DDP averages "
                         "the gradients over ranks, so each step is 1/world_size of the single run's (AdamW hides "
                         "it in the loss; the grad norm shows it)")
            if dotted(c.func) in ("dist.all_gather", "torch.distributed.all_gather", "all_gather") and \
                    len(c.args) == 2 and "nn" not in dotted(c.func):
                self._gather(m, c)
        self._eval_padding(m)
        loaders = {dotted(t) for a in ast.walk(m.tree) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                   and _callee(a.value) == "DataLoader" for t in a.targets}
        for c in m.calls:
            if _callee(c) == "next" and c.args and isinstance(c.args[0], ast.Call) and _callee(c.args[0]) == "iter" \
                    and c.args[0].args:
                src = c.args[0].args[0]
                if isinstance(src, ast.Call) and _callee(src) in ITERABLE_NOT_LOADER:
                    continue  # next(iter(d.items())), next(iter(model.parameters())): no loader, no RNG draw
                if isinstance(src, ast.Call) and _callee(src) != "DataLoader" or not (
                        dotted(src) in loaders or LOADERISH.search(dotted(src).split(".")[-1] or "")
                        or isinstance(src, ast.Call)):
                    continue
                self.add(m, c, "peek-iterator", f"{ast.unparse(c)} creates an extra iterator over the loader, which "
                         "draws a seed from the global RNG (even with num_workers=0) and shifts every later draw; give "
                         "the DataLoader generator=torch.Generator().manual_seed(...), or read loader.batch_size")
        for a in ast.walk(m.tree):
            if isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) and _const_str(t.slice) == "MASTER_PORT"
                                                 for t in a.targets) and _const_str(a.value) is not None:
                self.add(m, a, "hard-coded-master-port", f"MASTER_PORT fixed to {a.value.value!r}: a second job on "
                         "this host (or a stale one) collides on the port — torchrun --standalone, or a free port",
                         "check-by-hand")
        urls = {dotted(_kw(c, "init_method")) for mm in self.p.modules.values() for c in mm.calls
                if _callee(c) == "init_process_group" and isinstance(_kw(c, "init_method"), (ast.Name, ast.Attribute))}
        for c in m.calls:
            url = _kw(c, "init_method") if _callee(c) == "init_process_group" else None
            if _const_str(url) and re.search(r"tcp://[^:]+:\d+", url.value):
                self.add(m, url, "hard-coded-master-port", f"init_method={url.value!r} fixes the rendezvous port: a "
                         "second job on this host collides — torchrun --standalone, or env://", "check-by-hand")
        for a in ast.walk(m.tree):  # args.dist_url = 'tcp://localhost:58472' ... init_method=args.dist_url
            if isinstance(a, ast.Assign) and any(dotted(t) in urls for t in a.targets) and self._fixed_port(a.value):
                self.add(m, a, "hard-coded-master-port", f"{ast.unparse(a.value)} (passed as init_method) fixes the "
                         "rendezvous port: a second job on this host collides — torchrun --standalone, or env://",
                         "check-by-hand")
        self._accumulation(m)
        bns = [c for c in m.calls if re.fullmatch(r"BatchNorm[123]d", _callee(c))]
        all_names = {dotted(n).split(".")[-1] for mm in self.p.modules.values() for n in ast.walk(mm.tree)
                     if isinstance(n, (ast.Name, ast.Attribute))}
        if bns and m.entry and not ({"SyncBatchNorm", "convert_sync_batchnorm"} & all_names):
            self.add(m, bns[0], "batchnorm-without-sync", "BatchNorm under DDP without SyncBatchNorm: each rank "
                     "normalises with its own micro-batch's statistics — nn.SyncBatchNorm.convert_sync_batchnorm"
                     "(model) before DDP")

    @staticmethod
    def _fixed_port(v: ast.AST) -> bool:
        """A tcp:// URL whose port is written in the code: 'tcp://localhost:58472' or f'tcp://{host}:58472'."""
        if _const_str(v) is not None:
            return bool(re.search(r"tcp://[^:]+:\d+", v.value))
        if isinstance(v, ast.JoinedStr):
            parts = [p.value if isinstance(p, ast.Constant) else "{}" for p in v.values]
            return bool(re.search(r"tcp://[^:]+:\d+", "".join(map(str, parts))))
        return False

    def _gather(self, m: Module, c: ast.Call):
        fn = m.enclosing(c) or m.tree
        lst, x = dotted(c.args[0]), c.args[1]
        if "detach" in ast.unparse(x) or m.enclosing(c, (ast.With,)) is not None and any(
                "no_grad" in dotted(i.context_expr) for i in m.enclosing(c, (ast.With,)).items):
            return
        if isinstance(fn, ast.FunctionDef) and any("no_grad" in dotted(d) for d in fn.decorator_list):
            return
        catted = any(isinstance(n, ast.Call) and _callee(n) in ("cat", "stack") and n.args and
                     dotted(n.args[0]) == lst for n in ast.walk(fn))
        if not catted:
            return
        own = any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) and dotted(t.value) == lst and
                                                    involves_rank(t.slice, m.rank_tainted) for t in a.targets)
                  for a in ast.walk(fn))
        if own:
            self.add(m, c, "gather-without-grad", f"{ast.unparse(c)} then {lst}[rank] = {ast.unparse(x)}: only the "
                     "rank's own slice keeps its gradient; the other ranks' features enter the loss as constants, "
                     "so the model gets 1/world_size of the single run's gradient for those terms — "
                     "torch.distributed.nn.functional.all_gather keeps the gradient")
        else:
            self.add(m, c, "gather-without-grad", f"{ast.unparse(c)} returns tensors without a gradient: if the "
                     "gathered features enter a loss (in-batch negatives), that loss's gradient reaches no rank's "
                     "features but through its own rows — torch.distributed.nn.functional.all_gather keeps it",
                     "check-by-hand")

    def _eval_padding(self, m: Module):
        classes = self._sampler_classes()
        for c in m.calls:
            if _callee(c) not in classes or not c.args:
                continue
            assigned = m.parent.get(id(c))
            while isinstance(assigned, ast.IfExp):
                assigned = m.parent.get(id(assigned))
            label = dotted(c.args[0]) + " " + (" ".join(dotted(t) for t in assigned.targets)
                                               if isinstance(assigned, ast.Assign) else "")
            drop = _kw(c, "drop_last")
            if not EVALISH.search(label) or (isinstance(drop, ast.Constant) and drop.value):
                continue
            if self._eval_loop_reduces():
                self.add(m, c, "eval-padding-duplicates", f"{_callee(c)}({ast.unparse(c.args[0])}) pads the set to a "
                         "multiple of world_size with repeated samples, and the evaluation loop reduces its metrics "
                         "over ranks: the duplicates are counted, so the metric is not the single run's unless "
                         "len(dataset) % world_size == 0 — shard without padding, or drop the padded tail",
                         "check-by-hand")

    def _eval_loop_reduces(self) -> bool:
        for mm in self.p.modules.values():
            for f in mm.functions.values():
                # an evaluation loop: over a val/test loader, or any loop of a function named so (evaluate(),
                # validate(), whose loader parameter is a plain `data_loader`)
                loops = [n for n in ast.walk(f) if isinstance(n, ast.For) and (
                    EVALISH.search(ast.unparse(n.iter)) or EVALISH.search(f.name))]
                if not loops:
                    continue
                red = [n for n in ast.walk(f) if isinstance(n, ast.Call) and (
                    _callee(n) in ("all_reduce", "reduce", "all_gather") and "dist" in dotted(n.func) or
                    any(self.p.function_does(tm, tf, lambda m2, cc: _callee(cc) in ("all_reduce", "reduce"), 1)
                        for tm, tf in self.p.resolve(mm, n)))]
                if red:
                    return True
        return False

    def _accumulation(self, m: Module):
        accum = {n.id for n in ast.walk(m.tree) if isinstance(n, ast.Name) and ACCUMISH.search(n.id)} | {
            n.attr for n in ast.walk(m.tree) if isinstance(n, ast.Attribute) and ACCUMISH.search(n.attr)}
        used = [n for n in ast.walk(m.tree) if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mod, ast.Div))
                and involves(n.right, ACCUMISH)]
        all_names = {dotted(n).split(".")[-1] for mm in self.p.modules.values() for n in ast.walk(mm.tree)
                     if isinstance(n, (ast.Name, ast.Attribute))}
        if accum and used and m.entry and not ({"no_sync", "require_backward_grad_sync"} & all_names):
            self.add(m, used[0], "accumulation-without-no-sync", "gradient accumulation under DDP without "
                     "model.no_sync(): every micro-batch all-reduces (same result, N-1 extra all-reduces per step); "
                     "run all but the last micro-batch inside `with model.no_sync():`")
        divided = {"batch": None, "accum": None}
        for n in ast.walk(m.tree):
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
        if divided["batch"] is not None and divided["accum"] is not None:
            self.add(m, divided["accum"], "batch-and-accum-divided", f"both the per-GPU batch (line "
                     f"{divided['batch'].lineno}) and the accumulation steps are divided by world_size: the global "
                     "batch shrinks by world_size (article §7.2's table) — divide one of them, and check "
                     "global = micro x accum x world_size")


# ---------------------------------------------------------------------------------------------- public API
def _expand(paths) -> tuple[list[Path], Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise AuditError(f"{p}: no such file")
        if p.is_dir():
            files += sorted(q for q in p.rglob("*.py") if ".venv" not in q.parts and "__pycache__" not in q.parts)
        elif p.is_file():
            files.append(p)
        else:
            raise AuditError(f"{p}: not a file")
    if not files:
        raise AuditError(f"{', '.join(map(str, paths))}: no Python files")
    dirs = [p.resolve() if p.is_dir() else p.resolve().parent for p in map(Path, paths)]
    root = dirs[0]
    for d in dirs[1:]:
        while root not in (d, *d.parents):
            root = root.parent
    return files, root


def audit_paths(paths) -> list[Finding]:
    """Audit files and folders as one project: imports between them (and into the folder) are followed."""
    files, root = _expand(paths)
    project = Project(files, root)
    given = {str(f) for f in files}
    return [f for f in _Audit(project).run() if f.path in given]


def audit_file(path: str | Path) -> list[Finding]:
    """One file, plus the modules it imports from its own folder."""
    return audit_paths([path])


def audit_source(source: str, filename: str = "<script>") -> list[Finding]:
    """One script given as text (no imports are followed)."""
    project = Project.__new__(Project)
    project.root, project.given = Path("."), [filename]
    project.modules = {filename: Module(Path(filename), filename, source)}
    project.ddp = Project._mentions_ddp(project.modules[filename])
    project._reach_cache = {}
    project._taint_parameters()
    return _Audit(project).run()


def format_findings(findings: list[Finding], path: str | None = None) -> str:
    where = path or "the audited files"
    if not findings:
        return f"{where}: no findings ({len(RULES)} rules; a static check — prove the port with ddp-lab compare)"
    one_file = path is not None and len({f.path for f in findings}) == 1  # name it as the caller did
    lines = [f.format(path) if one_file or not f.path else f.format() for f in findings]
    n_defect = sum(f.severity == "defect" for f in findings)
    return "\n".join(lines) + (f"\n{len(findings)} finding(s) in {where} ({n_defect} defect, "
                               f"{len(findings) - n_defect} check-by-hand)")


def to_json(findings: list[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=1)


def to_sarif(findings: list[Finding]) -> str:
    """SARIF 2.1.0, one run, one rule per audit rule (GitHub code scanning reads it)."""
    rules = [{"id": r, "shortDescription": {"text": RULE_INFO[r][1]},
              "helpUri": f"notebooks/{RULE_INFO[r][0]}.ipynb"} for r in RULES]
    results = [{"ruleId": f.rule, "level": "error" if f.severity == "defect" else "warning",
                "message": {"text": f.message},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path},
                                                    "region": {"startLine": f.line}}}]} for f in findings]
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
                       "runs": [{"tool": {"driver": {"name": "ddp-lab audit", "rules": rules}},
                                 "results": results}]}, indent=1)
