"""Score the audit on held-out batches: `python docs/measured/cpu2/audit_heldout_score.py 63 64` (the batches' first
look when run at the commit before their round's fixes), or with no argument every batch (audit_heldout_final.txt);
`--present` scores only the projects whose copies are present (audit_heldout_final_subset.txt).
Calls test_audit_corpus.score()/report() on the projects of tests/outside/heldout_labels.json whose `batch` is given.
Run from the repository root with the held-out copies in tests/outside/heldout/ (git-ignored; see that file's
`about`)."""

import json
import sys
from pathlib import Path

sys.path[:0] = [".", "tests/analysis"]
from test_audit_corpus import report, score  # noqa: E402

LABELS = json.loads(Path("tests/outside/heldout_labels.json").read_text())
HELD = Path("tests/outside/heldout")
present = "--present" in sys.argv  # only the projects whose copies are here (a machine that restored some of them)
want = {int(a) for a in sys.argv[1:] if a != "--present"}
part = {k: p for k, p in LABELS["projects"].items() if not want or p.get("batch", 1) in want}
if present:
    part = {k: p for k, p in part.items() if (HELD / k).is_dir()}
    print(f"{len(part)} projects present: {', '.join(part)}")
elif want:
    print(f"batches {sorted(want)} ({', '.join(part)}):")
print(report(score(part, HELD)))
