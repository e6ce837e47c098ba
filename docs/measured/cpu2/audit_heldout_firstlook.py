"""Batch 4's first look, project by project: `pytest tests/analysis/test_audit_heldout.py -s` stopped on the first
project the audit raised on (AuditError), so this calls the same score()/report() per project, counts the
labelled defects of a project it raised on as missed, and prints the rest as the test would. Run from the
repository root with the held-out copies in tests/outside/heldout/."""

import json
import sys
from pathlib import Path

sys.path.insert(0, "tests/analysis")
from test_audit_corpus import report, score  # noqa: E402

from lab_utils.analysis.audit.project import AuditError  # noqa: E402

L = json.loads(Path("tests/outside/heldout_labels.json").read_text())
HELD = Path("tests/outside/heldout")
part = {k: p for k, p in L["projects"].items() if p.get("batch") == 4}
ok, crashed = {}, {}
for k, p in part.items():
    try:
        score({k: p}, HELD)
        ok[k] = p
    except AuditError as e:
        crashed[k] = str(e).replace(str(HELD.resolve()) + "/", "")
print("batch 4: the audit raised on:", crashed or "none")
print(f"\nbatch 4 without the projects it raised on ({', '.join(ok)}):\n" + report(score(ok, HELD)))
n = sum(len(e["expect"]) for k in crashed for e in part[k]["files"].values())
print(f"\n(the projects it raised on hold {n} labelled defects: counted as missed in the batch-4 totals below)")


def line(title: str, s: dict, extra: int) -> str:
    t = s["total"]
    return (f"{title}: precision {t['correct']}/{t['findings']}, "
            f"recall {t['recalled']}/{t['labels'] + extra} = {t['recalled'] / (t['labels'] + extra):.2f}")


print(line("batch 4, all 6 projects", score(ok, HELD), n))
rest = score({k: p for k, p in L["projects"].items() if k not in crashed}, HELD)
print("\n" + line(f"all batches (the raised-on projects' {n} defects counted missed)", rest, n))
print("\nall batches without the raised-on projects:\n" + report(rest))
