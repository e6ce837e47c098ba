"""The rule registry, in the manner of ruff's or flake8-bugbear's rules: one rule = an id, the chapter that
measures it, the defect and its consequence in one sentence, and its recogniser. A recogniser is a function
`check(facts, module)` that yields `(node, message)` or `(node, message, severity)`, with a project module first
when the line it names lies in another file; the registry turns each into a
`Finding` with the rule's id, so a rule's id, chapter and summary are written once, here.

    @rule("set-epoch-missing", "03_samplers", "a DistributedSampler whose set_epoch is never called: ...")
    def set_epoch_missing(f, m): ...

`scope`: "module" (every project module), "entry" (scripts only). `needs_ddp`: the rule speaks only when the
project sets up DDP somewhere (a DDP wrap, init_process_group, or FSDP's fully_shard)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .hierarchy import never_called, replaced_where_built
from .none_arms import untaken_none_arm
from .scripts import demo_block, off_the_default_path, one_process_only, shadowed, unchosen, undistributed_script

SEVERITIES = ("defect", "check-by-hand")


@dataclass(frozen=True)
class Rule:
    id: str
    chapter: str
    summary: str
    check: Callable[..., Iterable[tuple]]
    scope: str = "module"
    needs_ddp: bool = True


REGISTRY: dict[str, Rule] = {}


class Hit(NamedTuple):
    """What a recogniser yields (a plain `(node, message[, severity])` tuple works too); `module`: the project
    file the node lies in, when it is not the module being checked; `related`: ((module, node), ...), the other
    places of the same defect (the helper that builds the sampler whose set_epoch the script never calls): one
    defect is one finding, shown where the fix goes, naming the rest (SARIF's relatedLocations)."""
    node: object
    message: str
    severity: str = "defect"
    module: object = None
    related: tuple = ()


def rule(rule_id: str, chapter: str, summary: str, scope: str = "module", needs_ddp: bool = True):
    """Register a recogniser under an id (each id once)."""
    assert scope in ("module", "entry"), scope

    def register(fn):
        if rule_id in REGISTRY:
            raise ValueError(f"audit rule {rule_id} registered twice")
        REGISTRY[rule_id] = Rule(rule_id, chapter, summary, fn, scope, needs_ddp)
        return fn
    return register


@dataclass(frozen=True)
class Finding:
    line: int
    rule: str
    message: str
    severity: str = "defect"
    path: str = ""
    related: tuple[tuple[str, int], ...] = ()  # (path, line) of the defect's other places (Hit.related)

    @property
    def chapter(self) -> str:
        return REGISTRY[self.rule].chapter

    def format(self, path: str | None = None) -> str:
        where = self.path if path is None else path
        return (f"{where}:{self.line}: {self.rule} [{self.severity}] {self.message} "
                f"(notebooks/{self.chapter}.ipynb)")

    def to_dict(self) -> dict:
        return {"file": self.path, "line": self.line, "rule": self.rule, "severity": self.severity,
                "message": self.message, "chapter": f"notebooks/{self.chapter}.ipynb",
                "related": [{"file": path, "line": line} for path, line in self.related]}


def run_rules(facts, modules) -> list[Finding]:
    """Every registered rule on every module it applies to; one finding per (file, line, rule): two recognisers
    of one rule that meet on a line report one defect."""
    found: dict[tuple, Finding] = {}
    for r in REGISTRY.values():
        if r.needs_ddp and not facts.p.ddp:
            continue
        for m in modules:
            if r.scope == "entry" and not m.entry or r.needs_ddp and undistributed_script(facts.p, m):
                continue  # (a one-process script beside the DDP ones: no rank runs it)
            for hit in r.check(facts, m):
                related = ()
                if isinstance(hit, Hit):
                    node, message, severity, where = hit.node, hit.message, hit.severity, hit.module or m
                    related = tuple((str(mm.path), getattr(n, "lineno", 0) or 1) for mm, n in hit.related)
                else:
                    where = m
                    if hasattr(hit[0], "tree"):  # (module, node, message...): a finding in another project file
                        where, hit = hit[0], hit[1:]
                    node, message, severity = (*hit, "defect")[:3]
                assert isinstance(message, str) and severity in SEVERITIES, (r.id, message, severity)
                if demo_block(facts, where, node) or shadowed(where, node) or unchosen(facts, where, node) or \
                        off_the_default_path(facts, where, node) or replaced_where_built(
                            facts.p, where, where.enclosing(node)) or never_called(facts.p, where, node) or (
                            r.id != "collective-outside-switch" and one_process_only(facts, where, node)) or \
                        untaken_none_arm(facts.p, where, node):
                    continue  # a library's own demo under its main guard, a function the module defines again
                    # later, a class the default settings never pick, a function called only in arms they
                    # skip, a base class's method every subclass the project builds replaces, or a function
                    # nothing calls, or one called only on the one-process path, or the None arm of a parameter
                    # every caller fills: the default DDP run never executes it
                line = getattr(node, "lineno", 0) or 1
                found.setdefault((str(where.path), line, r.id),
                                 Finding(line, r.id, message, severity, str(where.path), related))
    return _named_elsewhere(sorted(found.values(), key=lambda f: (f.path, f.line, f.rule)))


def _named_elsewhere(found: list[Finding]) -> list[Finding]:
    """One defect, one finding: a finding whose line another finding of its rule already names as a related place
    (SwinFace's `callback_logging(...)` in train.py, named by the helper's own rank-0 log that prints what it is
    handed) is part of that finding. When two name each other, the first in file order stays."""
    order = {id(f): i for i, f in enumerate(found)}
    dropped: set[int] = set()
    for f in found:
        if any(g is not f and id(g) not in dropped and g.rule == f.rule and (f.path, f.line) in g.related
               and not ((g.path, g.line) in f.related and order[id(g)] > order[id(f)]) for g in found):
            dropped.add(id(f))
    return [f for f in found if id(f) not in dropped]
