"""Issue 35: classes of round 396-401's first look (docs/measured/cpu2/audit_heldout_round396.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (95593a7)."""

from test_audit import _project
from test_audit_classes246 import SEED_ONLY, _rules


def test_a_store_true_flag_turned_on_by_set_defaults(tmp_path):
    """EfficientFormer (and DeiT's parser it copies): `parser.add_argument('--sync-bn', action='store_true')`, then
    `parser.set_defaults(sync_bn=True)`: the flag is on unless turned off, so `if args.sync_bn:
    convert_sync_batchnorm(model)` runs in the default run (no batchnorm-without-sync). Without the set_defaults
    the default run goes without SyncBatchNorm: found."""
    train = SEED_ONLY + ("import argparse\nparser = argparse.ArgumentParser()\n"
                         "parser.add_argument('--sync-bn', action='store_true')\n"
                         "parser.add_argument('--no-sync-bn', action='store_false', dest='sync_bn')\nDEFAULTS"
                         "args = parser.parse_args()\ndist.init_process_group('gloo')\n"
                         "model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3))\n"
                         "if args.sync_bn:\n    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
                         "model = DDP(model)\n")
    on = _project(tmp_path / "on", {"train.py": train.replace("DEFAULTS", "parser.set_defaults(sync_bn=True)\n")})
    assert not _rules(on, "batchnorm-without-sync")
    off = _project(tmp_path / "off", {"train.py": train.replace("DEFAULTS", "")})
    assert _rules(off, "batchnorm-without-sync")
