"""How far two blind labellers agree on the same held-out files, and where the audit stands against each.

`python docs/measured/cpu2/label_agreement.py 99 100` (batches; none = every batch with second labels), from the
repository root. Labeller A's labels are tests/outside/heldout_labels.json (the ones the audit is scored on); labeller
B's are tests/outside/heldout_second_labels.json, written later by another helper who saw neither A's labels nor the
audit's output, for the same files and the same run (A's `kind`). B is scored exactly as the audit is
(test_audit_corpus.score's matching): a B label is a "finding" that matches an A label of the same rule in the same file
when their lines meet; B labels on A's `unsure` places are not scored. B's precision and recall against A is the ceiling
a tool can expect against one labeller: the bar (0.9 / 0.8) means something only next to it.

With `--audit` the audit of this checkout is scored too, against A, against B, and against both together: a finding is
right when either labeller called that place a defect (union), and a defect counts for recall when both did
(agreed). Run it at the commit of a round's first look for numbers about code the audit was not tuned on."""

import json
import sys
from collections import Counter
from pathlib import Path

sys.path[:0] = [".", "tests/analysis"]
from test_audit_corpus import score  # noqa: E402

A = json.loads(Path("tests/outside/heldout_labels.json").read_text())["projects"]
B = json.loads(Path("tests/outside/heldout_second_labels.json").read_text())["projects"]
ROOT = Path("tests/outside/heldout")


def meets(x: dict, y: dict) -> bool:
    return x["rule"] == y["rule"] and bool(set(x["lines"]) & set(y["lines"]))


def labels(project: dict, kind: str = "expect") -> list[tuple[str, dict]]:
    return [(rel, lab) for rel, entry in project["files"].items() for lab in entry.get(kind, [])]


def agree(a: dict, b: dict) -> dict:
    """B's labels scored as findings against A's (precision), A's recalled by B's (recall), with the lists."""
    la, lb, ua = labels(a), labels(b), labels(a, "unsure")
    scored = [(rel, x) for rel, x in lb
              if any(r == rel and meets(x, y) for r, y in la)
              or not any(r == rel and meets(x, u) for r, u in ua)]
    b_ok = [(rel, x) for rel, x in scored if any(r == rel and meets(x, y) for r, y in la)]
    a_hit = [(rel, y) for rel, y in la if any(r == rel and meets(x, y) for r, x in lb)]
    return {"b": len(scored), "b_ok": len(b_ok), "a": len(la), "a_hit": len(a_hit),
            "only_a": [(rel, y) for rel, y in la if (rel, y) not in a_hit],
            "only_b": [(rel, x) for rel, x in scored if (rel, x) not in b_ok]}


def with_labels(project: dict, files: dict) -> dict:
    return {**project, "files": {rel: {**e, "expect": files.get(rel, {}).get("expect", []),
                                       "unsure": files.get(rel, {}).get("unsure", [])}
                                 for rel, e in project["files"].items()}}


def pair(x: int, n: int) -> str:
    return f"{x}/{n} = {x / n:.2f}" if n else f"{x}/0"


def main(argv: list[str]) -> None:
    run_audit = "--audit" in argv
    want = {int(a) for a in argv if a != "--audit"}
    names = [k for k in B if k in A and (not want or A[k]["batch"] in want)]
    missing = [k for k in B if k not in A]
    if missing:
        raise SystemExit(f"second labels for folders labeller A never labelled: {missing}")
    batches = sorted({A[k]["batch"] for k in names})
    print(f"batches {batches}: {len(names)} projects, both labellers blind to each other and to the audit")
    tot, rules = Counter(), Counter()
    only_a, only_b = [], []
    for name in names:
        r = agree(A[name], B[name])
        for k in ("b", "b_ok", "a", "a_hit"):
            tot[k] += r[k]
        for _rel, y in labels(A[name]):
            rules[(y["rule"], "A")] += 1
        for _rel, x in labels(B[name]):
            rules[(x["rule"], "B")] += 1
        only_a += [f"{name}/{rel}:{y['lines']} {y['rule']}: {y['why']}" for rel, y in r["only_a"]]
        only_b += [f"{name}/{rel}:{x['lines']} {x['rule']}: {x['why']}" for rel, x in r["only_b"]]
    print(f"labeller B against labeller A: precision {pair(tot['b_ok'], tot['b'])}, "
          f"recall {pair(tot['a_hit'], tot['a'])}")
    print(f"{'rule':30s} {'A':>4s} {'B':>4s}")
    for rule in sorted({r for r, _ in rules}):
        print(f"{rule:30s} {rules[(rule, 'A')]:4d} {rules[(rule, 'B')]:4d}")
    if run_audit:
        audit_scores(names)
    print("labelled by A only:", *[f"  {x}" for x in only_a], sep="\n")
    print("labelled by B only:", *[f"  {x}" for x in only_b], sep="\n")


def audit_scores(names: list[str]) -> None:
    vs_a = score({k: A[k] for k in names}, ROOT)
    vs_b = score({k: with_labels(A[k], B[k]["files"]) for k in names}, ROOT)
    print(f"audit against A: precision {pair(vs_a['total']['correct'], vs_a['total']['findings'])}, "
          f"recall {pair(vs_a['total']['recalled'], vs_a['total']['labels'])}")
    print(f"audit against B: precision {pair(vs_b['total']['correct'], vs_b['total']['findings'])}, "
          f"recall {pair(vs_b['total']['recalled'], vs_b['total']['labels'])}")
    # Union for precision (a place either labeller called a defect), agreement for recall (both did).
    union, agreed = {}, {}
    for k in names:
        files = {}
        for rel in A[k]["files"]:
            fa, fb = A[k]["files"][rel], B[k]["files"].get(rel, {})
            files[rel] = {"expect": fa["expect"] + fb.get("expect", []),
                          "unsure": fa.get("unsure", []) + fb.get("unsure", [])}
        union[k] = with_labels(A[k], files)
        agreed[k] = with_labels(A[k], {rel: {"expect": [y for y in A[k]["files"][rel]["expect"]
                                                        if any(meets(x, y) for x in
                                                               B[k]["files"].get(rel, {}).get("expect", []))]}
                                       for rel in A[k]["files"]})
    u, g = score(union, ROOT), score(agreed, ROOT)
    print(f"audit against either labeller (precision) {pair(u['total']['correct'], u['total']['findings'])}; "
          f"against the defects both labelled (recall) {pair(g['total']['recalled'], g['total']['labels'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
