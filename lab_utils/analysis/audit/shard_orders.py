"""Orders that differ between ranks under a sampler's shards. A DistributedSampler hands each rank positions in
one list; every rank must hold that list, and the permutation it cuts, in the same order. Two ways lose that:

- a list shuffled or split with a global generator that differs between ranks before the dataset over it is sharded
  (CLaMP 2's `split_data` runs `random.shuffle(files)` after `random.seed(42 + global_rank)`): each rank takes its
  positions in another order, so the shards overlap, some samples are never seen, and one rank's held-out items
  are another's training items;
- a project sampler that permutes with a global generator (`torch.randperm(n)` with no `generator=`,
  `random.shuffle`) and then takes its rank's positions: the same overlap, unless every rank's generator is in
  the same state.

A global generator differs between ranks when it is seeded with the rank, or, for Python's `random` and numpy's,
when it is never seeded (each process seeds them from the OS); torch's unseeded CPU generator starts at the same
default seed in every process, so only a seed with the rank moves it apart."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .syntax import callee, dotted, involves_rank, kw

LIBRARIES = ("random", "numpy", "torch")
_DRAWS = {"random": {"shuffle", "sample"}, "numpy.random": {"shuffle", "permutation"},
          "torch": {"randperm", "random_split"}, "torch.utils.data": {"random_split"},
          "torch.utils.data.dataset": {"random_split"}}
_SEEDERS = {"random": {"seed"}, "numpy.random": {"seed"}, "torch": {"manual_seed"}, "torch.random": {"manual_seed"}}
_OWNER = {"random": "random", "numpy.random": "numpy", "torch": "torch", "torch.utils.data": "torch",
          "torch.utils.data.dataset": "torch", "torch.random": "torch"}
SAMPLERISH = re.compile(r"Sampler$")


def _qualified(m: Module, c: ast.Call) -> tuple[str, str] | None:
    """(module, function) of a call to a library function, through the module's imports (`np.random.shuffle`,
    `from random import shuffle`)."""
    d = dotted(c.func)
    if not d or isinstance(c.func, ast.Attribute) and not isinstance(c.func.value, (ast.Name, ast.Attribute)):
        return None
    head, _, rest = d.partition(".")
    mod, attr, level = m.imports.get(head, (head, None, 0))
    if level:
        return None
    path = ".".join(x for x in (mod, attr, rest) if x) if attr or rest else mod
    if "." not in path:
        return None
    return path.rsplit(".", 1)[0], path.rsplit(".", 1)[1]


def global_draw(m: Module, c: ast.Call) -> str | None:
    """The global generator ('random', 'numpy', 'torch') a shuffle, sample, permutation or split draws from, or
    None (not such a call, or handed its own generator)."""
    q = _qualified(m, c)
    if q is None or q[1] not in _DRAWS.get(q[0], ()) or kw(c, "generator") is not None:
        return None
    return _OWNER[q[0]]


def _direct_seeds(m: Module, c: ast.Call) -> set[str]:
    q = _qualified(m, c)
    return {_OWNER[q[0]]} if q is not None and q[1] in _SEEDERS.get(q[0], ()) else set()


def seeds(f: Facts, m: Module, c: ast.Call) -> dict[str, bool]:
    """{library: whether the seed differs between ranks} for a call that seeds global generators: directly,
    through a project helper (its body's seeds; a rank added there counts), or an unseen helper named like a
    seeder (taken to seed all three)."""
    arg = c.args[0] if c.args else kw(c, "seed")
    ranked = arg is not None and involves_rank(arg, m.rank_tainted)
    out = dict.fromkeys(_direct_seeds(m, c), ranked)
    if out:
        return out
    if f.seed_kind(m, c) is None:
        return {}
    targets = f.p.resolve(m, c)
    if not targets:
        return dict.fromkeys(LIBRARIES, ranked)
    for tm, tf in targets:
        for x in (n for n in ast.walk(tf) if isinstance(n, ast.Call)):
            inner = x.args[0] if x.args else kw(x, "seed")
            for lib in _direct_seeds(tm, x):
                out[lib] = out.get(lib, False) or ranked or inner is not None and involves_rank(inner, tm.rank_tainted)
    return out


def _project_seeds(f: Facts, lib: str) -> list[bool]:
    """Whether each seed of `lib` the project sets outside sampler classes differs between ranks."""
    cache = f.cache.setdefault("shard_order_seeds", {})
    if lib not in cache:
        cache[lib] = [d[lib] for mm in f.p.modules.values() for c in mm.calls
                      if not SAMPLERISH.search(mm.class_of(mm.enclosing(c)) or "") and lib in (d := seeds(f, mm, c))]
    return cache[lib]


def differs_between_ranks(f: Facts, lib: str, scope_seeds: list[bool]) -> bool:
    """Whether the global generator `lib` is in another state on each rank: the last seed before the draw in its own
    scope decides; else every seed the project sets has the rank (none at all: Python's and numpy's generators are
    seeded from the OS in each process)."""
    if scope_seeds:
        return scope_seeds[-1]
    project = _project_seeds(f, lib)
    return all(project) if project else lib != "torch"


def _statement(m: Module, node: ast.AST) -> ast.AST:
    while not isinstance(node, ast.stmt) and m.parent.get(id(node)) is not None:
        node = m.parent[id(node)]
    return node


def _names(node: ast.AST) -> set[str]:
    return {dotted(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n)}


def _helper_draw(f: Facts, m: Module, x: ast.Call) -> tuple[str, Module, ast.Call] | None:
    """A project function, or a class's __init__, whose own body shuffles or splits with a global generator
    (CLaMP's `split_data(data)`: `random.shuffle(data)`): (the generator, where, the draw)."""
    for tm, tf in f.p.resolve(m, x, exact=True):
        own = sorted((n for n in ast.walk(tf) if isinstance(n, ast.Call) and tm.enclosing(n) is tf),
                     key=lambda n: (n.lineno, n.col_offset))
        for y in own:
            if (lib := global_draw(tm, y)) is None or f.off_in_default_run(tm, y):
                continue  # (ePALM's `random.sample(data, k)` only under a fractional --topk)
            reseeded = [d[lib] for z in own if z.lineno < y.lineno and lib in (d := seeds(f, tm, z))]
            if reseeded and not reseeded[-1]:
                continue  # reseeded alike on every rank first (RapFlow-TTS's dataset: `random.seed(cfg.seed)`)
            return lib, tm, y
    return None


def _reaches(m: Module, scope: ast.AST, draw: ast.Call, sampler: ast.Call, data: ast.AST) -> bool:
    """Whether what the draw shuffles or returns reaches the sampler's dataset through the scope's assignments
    (`train_files, eval_files = split_data(train_files)` ... `train_set = Dataset(train_files)` ...
    `DistributedSampler(train_set)`)."""
    stmt = _statement(m, draw)
    held = {dotted(a) for a in draw.args[:1] if isinstance(a, (ast.Name, ast.Attribute))}  # shuffled in place
    if isinstance(stmt, ast.Assign):
        held |= {dotted(e) for t in stmt.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])}
    later = sorted((n for n in m.nodes if isinstance(n, (ast.Assign, ast.Expr)) and m.enclosing(n) is scope
                    and stmt.lineno < n.lineno < sampler.lineno), key=lambda n: n.lineno)
    for n in later:
        if isinstance(n, ast.Assign) and _names(n.value) & held:
            held |= {dotted(e) for t in n.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])}
        elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute) \
                and n.value.func.attr in ("append", "extend") and any(_names(a) & held for a in n.value.args):
            held.add(dotted(n.value.func.value))
    return bool(_names(data) & held)


def shuffled_before_the_sampler(f: Facts, m: Module):
    """Each sampler built over a list that a global generator, in another state on each rank, shuffled or split
    first: (the draw's call here, the message)."""
    told = set()  # one finding per scope: the train and eval lists shuffled side by side are one defect
    for c in m.calls:
        data = (c.args[0] if c.args else kw(c, "dataset")) if callee(c) in f.sampler_classes() else None
        scope = m.enclosing(c)
        if data is None or id(scope) in told:
            continue
        before = sorted((x for x in m.calls if m.enclosing(x) is scope and x.lineno < c.lineno),
                        key=lambda x: (x.lineno, x.col_offset))
        for x in before:
            found = (global_draw(m, x), m, x) if global_draw(m, x) else _helper_draw(f, m, x)
            if found is None or f.off_in_default_run(m, x) or not _reaches(m, scope, x, c, data):
                continue
            lib, where = found[0], "" if found[1] is m else f" ({found[1].rel}:{found[2].lineno})"
            seeded = [d[lib] for y in before if y.lineno < x.lineno and lib in (d := seeds(f, m, y))]
            if differs_between_ranks(f, lib, seeded):
                state = "seeded with the rank" if seeded or _project_seeds(f, lib) else "never seeded, so seeded " \
                    "from the OS in each process"
                yield x, (f"{ast.unparse(x)}{where} shuffles or splits with the global {lib} generator, {state}, "
                          f"before {callee(c)}({ast.unparse(data)}) shards it: each rank holds the list in another "
                          "order, so the shards overlap, some samples are never seen and one rank's held-out items "
                          "are another's training items — shuffle with a generator seeded alike on every rank "
                          "(random.Random(seed), torch.Generator().manual_seed(seed))")
                told.add(id(scope))
                break


def _rank_reads(cd: ast.ClassDef) -> list[ast.AST]:
    return [n for n in ast.walk(cd) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
            and dotted(n).startswith("self.") and re.search(r"rank", n.attr)]


def sampler_drawing_globally(f: Facts, m: Module):
    """A project sampler class that shards by rank and permutes with a global generator in another state on each
    rank, drawn before it takes its rank's positions: (the draw, the message, the module it lies in)."""
    for name, cd in m.classes.items():
        reads = _rank_reads(cd)
        if not (SAMPLERISH.search(name) or any(SAMPLERISH.search(dotted(b)) for b in cd.bases)) or not reads or \
                not any(callee(c) == name for mm in f.p.modules.values() for c in mm.calls):
            continue
        classes = [(m, cd)] + [(bm, bm.classes[b]) for bm, b in f.p.bases_of(m, name) if b in bm.classes]
        for cm, k in classes:
            draws = [x for x in ast.walk(k) if isinstance(x, ast.Call) and global_draw(cm, x) is not None]
            for x in draws:
                fn = cm.enclosing(x)
                if k is cd and any(cm.enclosing(r) is fn and r.lineno <= x.lineno for r in reads):
                    continue  # drawn after the rank's positions were taken: a shuffle within the rank's own shard
                lib = global_draw(cm, x)
                own = [d[lib] for y in ast.walk(k) if isinstance(y, ast.Call) and lib in (d := seeds(f, cm, y))]
                if differs_between_ranks(f, lib, own):
                    yield x, (f"{name} draws its permutation with {ast.unparse(x)} from the global {lib} generator, "
                              "which is in another state on each rank, then takes its rank's positions: each rank "
                              "cuts another permutation, so the shards overlap and some samples are never seen "
                              "in the epoch — draw from torch.Generator().manual_seed(seed + epoch), alike on "
                              "every rank, as DistributedSampler does"), cm
                    break
            else:
                continue
            break
