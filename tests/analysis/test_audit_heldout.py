"""`ddp-lab audit` on issue 35's held-out addition (tests/outside/heldout_labels.json): public DDP code labelled
before the audit ever ran on it. The bytes are not in the repository; put a copy of each project at
tests/outside/heldout/PROJECT/ (the labels name repository, commit, path and sha256; the folder is git-ignored)
and this test scores it. Without the copies it is skipped, saying so. The first look (the audit at the commit that
added the labels) and the final score are recorded in docs/results.md; `pytest -s` prints the current one."""

import hashlib
import json
from pathlib import Path

import pytest
from test_audit_corpus import report, score

REPO = Path(__file__).resolve().parents[2]
HELD = REPO / "tests" / "outside" / "heldout"
LABELS = json.loads((REPO / "tests" / "outside" / "heldout_labels.json").read_text())


def _present() -> bool:
    for name, project in LABELS["projects"].items():
        for rel, entry in project["files"].items():
            path = HELD / name / rel
            if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
                return False
    return True


def test_heldout_labels_are_well_formed():
    from lab_utils.analysis import audit
    for name, project in LABELS["projects"].items():
        assert {"repo", "commit", "licence", "files"} <= set(project), name
        for rel, entry in project["files"].items():
            assert len(entry["commit"]) == 40 and len(entry["sha256"]) == 64, (name, rel)
            for lab in entry["expect"] + entry.get("unsure", []):
                assert lab["rule"] in audit.RULES and lab["lines"] and lab["why"].strip(), (name, rel, lab)


@pytest.mark.skipif(not _present(), reason="held-out copies absent (tests/outside/heldout/, see heldout_labels.json)")
def test_heldout_score():
    """Each batch apart (its own first look is in docs/results.md), then all of them."""
    for batch in sorted({p.get("batch", 1) for p in LABELS["projects"].values()}):
        part = {k: p for k, p in LABELS["projects"].items() if p.get("batch", 1) == batch}
        print(f"\nbatch {batch} ({', '.join(part)}):\n" + report(score(part, HELD)))
    s = score(LABELS["projects"], HELD)
    print("\nall batches:\n" + report(s))
    assert s["total"]["labels"] > 0
