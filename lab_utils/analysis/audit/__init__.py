"""`ddp-lab audit PATH ...`: a static check of a DDP training project against the corrected checklist
(docs/checklist.md; taught in notebooks/10_workflow.ipynb).

It parses every file with `ast` (nothing is imported or run), follows the imports that stay inside the audited
folder, and judges seeds, samplers, logging, saving and collectives across files: a helper that seeds, a loader
library whose `set_epoch` call sits in the training script, a `save_checkpoint` helper called on every rank.
Each finding names the defect it claims (what differs at two ranks from the single run, or which hazard), its
severity (`defect`: the code shows it; `check-by-hand`: it depends on something the audit cannot see), the real
line, the fix, and the chapter that measures it.

The package:
- `syntax`: name patterns and `ast` helpers;
- `project`: the parsed files, imports resolved inside the folder, calls resolved to project functions;
- `ranks`: which code runs on which rank (rank-0 guards, distributed switches);
- `facts`: the project model the rules query (the wrapped model, seeding, reduced values, saves, collectives);
- `options`, `scripts`: the default run (option and config defaults, launch-script flags; the classes and
  functions it never reaches);
- `registry`: one rule = id, chapter, the defect and its consequence in one sentence, its recogniser;
- `rules/`: the recognisers, one module per chapter group (`python -m lab_utils audit --sarif` lists them);
- `launch_scripts`: the shell scripts and JSON configs that decide how a run starts;
- `report`: text, JSON and SARIF output.

What it cannot see: code outside the audited folder (an installed package; a config file's values, but for a
rendezvous address in the folder's JSON files, a port or a flag in its shell launch scripts), values known
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
from pathlib import Path

from . import rules  # noqa: F401  (registers every rule)
from .entries import unlaunched_lines
from .facts import Facts
from .files import shell_scripts
from .launch_scripts import fixed_ports_in_launch_scripts
from .project import AuditError, Module, Project
from .registry import REGISTRY, SEVERITIES, Finding, Rule, run_rules
from .report import format_findings, to_json, to_sarif
from .syntax import callee, kw

RULES = tuple(REGISTRY)
RULE_INFO = {r.id: (r.chapter, r.summary) for r in REGISTRY.values()}
CHAPTERS = {r.id: r.chapter for r in REGISTRY.values()}

__all__ = ["AuditError", "CHAPTERS", "Finding", "REGISTRY", "RULES", "RULE_INFO", "Rule", "SEVERITIES", "audit_file",
           "audit_paths", "audit_source", "format_findings", "to_json", "to_sarif"]


def _expand(paths) -> tuple[list[Path], Path, frozenset[Path]]:
    files: list[Path] = []
    named: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise AuditError(f"{p}: no such file")
        if p.is_dir():
            files += sorted(q for q in p.rglob("*.py") if ".venv" not in q.parts and "__pycache__" not in q.parts)
        elif p.is_file():
            files.append(p)
            named.add(p)
        else:
            raise AuditError(f"{p}: not a file")
    if not files:
        raise AuditError(f"{', '.join(map(str, paths))}: no Python files")
    dirs = [p.resolve() if p.is_dir() else p.resolve().parent for p in map(Path, paths)]
    root = dirs[0]
    for d in dirs[1:]:
        while root not in (d, *d.parents):
            root = root.parent
    return files, root, frozenset(named)


def audit_paths(paths, skipped: list[str] | None = None) -> list[Finding]:
    """Audit files and folders as one project: imports between them (and into the folder) are followed. A file the
    user named that is not Python raises AuditError; one found in a folder or through an import is left out and
    its reason appended to `skipped` (the CLI prints them), so one broken file does not stop the project's audit."""
    files, root, named = _expand(paths)
    project = Project(files, root, named)
    if skipped is not None:
        skipped += project.skipped
    if not project.modules:
        raise AuditError(f"{', '.join(map(str, paths))}: no file that parses as Python ({project.skipped[0]})")
    given = {str(f) for f in files}
    # (a second entry point the project's launch scripts never run, beside one they do, is not the documented run)
    aside = unlaunched_lines(project, shell_scripts(project.root) if project.on_disk else [])
    found = [f for f in run_rules(Facts(project), project.modules.values())
             if f.path in given and not any(f.line in r for r in aside.get(f.path, ()))]
    # a folder: its launch scripts too, unless the Python code sets MASTER_PORT itself over the launcher's (VoCo's
    # `os.environ['MASTER_PORT'] = '28890'`): the script's --master_port is then not the port used
    overridden = any(f.rule == "hard-coded-master-port" and f.message.startswith("MASTER_PORT") for f in found)
    if project.ddp and any(Path(p).is_dir() for p in paths) and not overridden:
        # (a `--dist-url tcp://...:1235` the script hands in is used where init_process_group reads its init_method
        # from a variable: those calls are the finding's related places)
        sites = tuple((str(mm.path), c.lineno) for mm in project.modules.values() for c in mm.calls
                      if callee(c) == "init_process_group" and isinstance(
                          kw(c, "init_method") or (c.args[1] if len(c.args) > 1 else None), (ast.Name, ast.Attribute)))
        found += [f for p in paths if Path(p).is_dir() for f in fixed_ports_in_launch_scripts(Path(p), sites)]
    return sorted(found, key=lambda f: (f.path, f.line, f.rule))


def audit_file(path: str | Path) -> list[Finding]:
    """One file, plus the modules it imports from its own folder."""
    return audit_paths([path])


def audit_source(source: str, filename: str = "<script>") -> list[Finding]:
    """One script given as text (no imports are followed)."""
    project = Project.single(Module(Path(filename), filename, source))
    return run_rules(Facts(project), project.modules.values())
