"""`ddp-lab audit` scored on a labelled corpus of public DDP code (tests/outside/corpus_labels.json): each project
folder is audited as a project, each finding is matched against the hand labels (written before the audit ran on
the file), and precision and recall must stay above their floors. Per-rule numbers are printed (pytest -s).

The corpus files themselves are other people's code, committed with their licences: tests/outside/README.md lists
each file's source at its commit. Every labelled file must be present with the labelled bytes (sha256), because the
labels name lines; a missing or changed file fails the test rather than skipping it."""

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import pytest

from lab_utils.analysis import audit

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "outside" / "corpus"
LABELS = json.loads((REPO / "tests" / "outside" / "corpus_labels.json").read_text())
PRECISION_FLOOR, RECALL_FLOOR = 0.9, 0.8


def score(projects: dict = LABELS["projects"], root: Path = CORPUS) -> dict:
    """Per-rule counts: findings, findings matching a label (correct), labels, labels recalled; plus lists.
    A finding matches a label of its rule at any of its places: its own line or a related one (one defect
    reported once, in the script, naming the helper's line: Finding.related)."""
    per = defaultdict(lambda: {"findings": 0, "correct": 0, "labels": 0, "recalled": 0, "unsure": 0})
    false_alarms, misses = [], []
    for name, project in projects.items():
        base = (root / name).resolve()
        found = audit.audit_paths([root / name])
        labels = [(rel, lab) for rel, entry in project["files"].items() for lab in entry["expect"]]
        unsure = [(rel, u) for rel, entry in project["files"].items() for u in entry.get("unsure", [])]
        hit = set()
        for _, lab in labels:
            per[lab["rule"]]["labels"] += 1
        for f in found:
            places = {(str(Path(path).resolve().relative_to(base)), line)
                      for path, line in ((f.path, f.line), *f.related)}
            match = [i for i, (rel, lab) in enumerate(labels)
                     if lab["rule"] == f.rule and any((rel, line) in places for line in lab["lines"])]
            if not match and any(u["rule"] == f.rule and (rel, line) in places
                                 for rel, u in unsure for line in u["lines"]):
                per[f.rule]["unsure"] += 1  # labelled 'unsure' before the audit ran: not scored
                continue
            per[f.rule]["findings"] += 1
            if match:
                per[f.rule]["correct"] += 1
                hit.update(match)
            else:
                rel = str(Path(f.path).resolve().relative_to(base))
                false_alarms.append(f"{name}/{rel}:{f.line} {f.rule}: {f.message}")
        for i, (rel, lab) in enumerate(labels):
            if i in hit:
                per[lab["rule"]]["recalled"] += 1
            else:
                misses.append(f"{name}/{rel}:{lab['lines']} {lab['rule']}: {lab['why']}")
    tot = {k: sum(r[k] for r in per.values()) for k in ("findings", "correct", "labels", "recalled")}
    return {"per_rule": dict(per), "total": tot, "false_alarms": false_alarms, "misses": misses,
            "precision": tot["correct"] / tot["findings"] if tot["findings"] else 1.0,
            "recall": tot["recalled"] / tot["labels"] if tot["labels"] else 1.0}


def report(s: dict) -> str:
    t = s["total"]
    lines = [f"precision {t['correct']}/{t['findings']} = {s['precision']:.2f}, "
             f"recall {t['recalled']}/{t['labels']} = {s['recall']:.2f}",
             f"{'rule':28s} {'findings':>8s} {'correct':>8s} {'labels':>7s} {'recalled':>9s}"]
    for rule, r in sorted(s["per_rule"].items()):
        lines.append(f"{rule:28s} {r['findings']:8d} {r['correct']:8d} {r['labels']:7d} {r['recalled']:9d}")
    by_chapter = defaultdict(lambda: [0, 0, 0, 0])
    for rule, r in s["per_rule"].items():
        row = by_chapter[audit.CHAPTERS.get(rule, "?")]
        for i, k in enumerate(("findings", "correct", "labels", "recalled")):
            row[i] += r[k]
    lines.append("per chapter (class of defect): findings correct labels recalled")
    lines += [f"  {ch:26s} {a:8d} {b:8d} {c:7d} {d:9d}" for ch, (a, b, c, d) in sorted(by_chapter.items())]
    lines += ["false alarms:", *[f"  {x}" for x in s["false_alarms"]], "misses:", *[f"  {x}" for x in s["misses"]]]
    return "\n".join(lines)


def _missing() -> list[str]:
    return [f"{name}/{rel}" for name, p in LABELS["projects"].items() for rel in p["files"]
            if not (CORPUS / name / rel).exists()]



def test_labels_name_known_rules_and_real_lines():
    """Bad labels would make the score meaningless: every rule exists, every line is inside its file."""
    for name, project in LABELS["projects"].items():
        assert {"repo", "commit", "licence", "files"} <= set(project), name
        assert list(CORPUS.joinpath(name).glob("LICENSE*")), f"{name}: no licence file beside the copy"
        for rel, entry in project["files"].items():
            assert len(entry.get("commit", "")) == 40 and entry.get("labels", "new") in ("new", "dev-corpus"), rel
            for lab in entry["expect"]:
                assert lab["rule"] in audit.RULES, (name, rel, lab["rule"])
                assert lab["lines"] and all(isinstance(x, int) and x >= 1 for x in lab["lines"]), (name, rel)
                assert lab["why"].strip(), (name, rel)
            path = CORPUS / name / rel
            if path.exists():
                assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], f"{name}/{rel} changed"
                n = len(path.read_text().splitlines())
                assert all(x <= n for lab in entry["expect"] for x in lab["lines"]), (name, rel)


def test_corpus_spans_enough_sources():
    files = sum(len(p["files"]) for p in LABELS["projects"].values())
    repos = {p["repo"] for p in LABELS["projects"].values()}
    assert files >= 25 and len(repos) >= 12, (files, sorted(repos))


@pytest.mark.slow
def test_precision_and_recall_floors():
    assert not _missing(), f"corpus files absent (tests/outside/README.md lists their sources): {_missing()}"
    s = score()
    print("\n" + report(s))
    assert s["precision"] >= PRECISION_FLOOR, report(s)
    assert s["recall"] >= RECALL_FLOOR, report(s)


def test_score_counts_a_false_alarm_and_a_miss(tmp_path):
    """The scorer itself: a finding off its label's lines is a false alarm and leaves the label missed."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "train.py").write_text(
        "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\nfor s in range(3):\n"
        "    torch.save(model.state_dict(), 'ckpt.pt')\n")
    labels = {"p": {"files": {"train.py": {"expect": [
        {"rule": "no-seed", "lines": [2], "why": "never seeds"},
        {"rule": "save-on-every-rank", "lines": [99], "why": "a deliberately wrong line"}]}}}}
    s = score(labels, tmp_path)
    assert s["per_rule"]["no-seed"] == {"findings": 1, "correct": 1, "labels": 1, "recalled": 1, "unsure": 0}
    assert s["per_rule"]["save-on-every-rank"] == {"findings": 1, "correct": 0, "labels": 1, "recalled": 0, "unsure": 0}
    assert s["precision"] == 0.5 and s["recall"] == 0.5
