"""Issue 35: classes left by rounds up to 264-269 (the closing note's "left" list), fixed before round 270's first
look; each quiet and loud, and each failing at a8332e0."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, _rules


def test_torchvision_get_model_by_name(tmp_path):
    """ParQ: `from torchvision.models import get_model`, `model = get_model(args.arch)` with `--arch` defaulting to
    resnet34, wrapped in DDP with no SyncBatchNorm: BatchNorm per rank. A ViT by the same factory has none."""
    train = SEED_ONLY + ("import argparse\nfrom torchvision.models import get_model\np = argparse.ArgumentParser()\n"
                         "p.add_argument('--arch', default='ARCH')\nargs = p.parse_args()\n"
                         "dist.init_process_group('gloo')\nmodel = get_model(args.arch, num_classes=10)\n"
                         "model = DDP(model)\n")
    loud = train.replace("ARCH", "resnet34")
    hits = _rules(_project(tmp_path / "loud", {"train.py": loud}), "batchnorm-without-sync")
    assert [h.line for h in hits] == [_line(loud, "model = DDP(")]
    quiet = train.replace("ARCH", "vit_b_16")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "batchnorm-without-sync")
