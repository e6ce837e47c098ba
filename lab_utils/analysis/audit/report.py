"""How findings are shown: text for a terminal, JSON, SARIF 2.1.0 (GitHub code scanning)."""

from __future__ import annotations

import json
import os

from .registry import REGISTRY, Finding


def format_findings(findings: list[Finding], path: str | None = None) -> str:
    where = path or "the audited files"
    if not findings:
        return f"{where}: no findings ({len(REGISTRY)} rules; a static check — prove the port with ddp-lab compare)"
    # a file given by the user: its findings named as the caller did; a folder's findings by their own file
    one_file = path is not None and os.path.isfile(path) and len({f.path for f in findings}) == 1
    lines = [f.format(path) if one_file or not f.path else f.format() for f in findings]
    n_defect = sum(f.severity == "defect" for f in findings)
    return "\n".join(lines) + (f"\n{len(findings)} finding(s) in {where} ({n_defect} defect, "
                               f"{len(findings) - n_defect} check-by-hand)")


def to_json(findings: list[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=1)


def _location(path: str, line: int) -> dict:
    return {"physicalLocation": {"artifactLocation": {"uri": path}, "region": {"startLine": line}}}


def to_sarif(findings: list[Finding]) -> str:
    """SARIF 2.1.0, one run, one rule per audit rule (GitHub code scanning reads it)."""
    rules = [{"id": r.id, "shortDescription": {"text": r.summary}, "helpUri": f"notebooks/{r.chapter}.ipynb"}
             for r in REGISTRY.values()]
    results = [{"ruleId": f.rule, "level": "error" if f.severity == "defect" else "warning",
                "message": {"text": f.message},
                "locations": [_location(f.path, f.line)],
                **({"relatedLocations": [dict(_location(path, line), id=i) for i, (path, line) in
                                         enumerate(f.related)]} if f.related else {})} for f in findings]
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
                       "runs": [{"tool": {"driver": {"name": "ddp-lab audit", "rules": rules}},
                                 "results": results}]}, indent=1)
