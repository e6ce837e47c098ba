"""Issue 35: classes found after round 165-170's fixes and in round 171-176's first look
(docs/measured/cpu2/audit_heldout_round171.txt), fixed after it, each quiet and loud."""

from pathlib import Path

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes147 import METER

from lab_utils.analysis import audit


def _places(finding) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for p, line in ((finding.path, finding.line), *finding.related)}


def test_a_meter_feed_names_the_call_that_prints_it(tmp_path):
    """SpikingResformer-style engines (ESR-SNN's engine_finetune.py): `metric_logger.update(loss=...)` sits in one
    of two arms (an option's arm first, the default's second), and `for ... in metric_logger.log_every(...)` in
    the loop header prints it on rank 0. The message says log_every prints what the feed hands it, so the finding
    carries log_every's line as one of its places: a reader (or a label) pointing at the printing line or at the
    other arm's feed is pointing at this defect."""
    train = (SEEDED + "from logger import MetricLogger\nmodel = DDP(Net())\nlogger = MetricLogger()\n"
             "for x, y in logger.log_every(loader, 10):\n    loss = criterion(model(x), y)\n"
             "    loss.backward()\n    opt.step()\n"
             "    if args.suppress:\n        logger.update(loss=loss.item(), extra=0.0)\n"
             "    else:\n        logger.update(loss=loss.item())\n")
    found = audit.audit_paths([_project(tmp_path, {"train.py": train, "logger.py": METER})])
    hits = [f for f in found if f.rule == "rank0-local-loss"]
    header = next(i for i, line in enumerate(train.splitlines(), 1) if "log_every(loader" in line)
    assert len(hits) == 1 and ("train.py", header) in _places(hits[0]), [(f.rule, f.line, f.related) for f in found]
