"""Issue 35, held-out batches 99-104 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_batch99..104.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit


def test_one_finding_for_the_gathers_of_one_loss():
    """LAION-CLAP's ClipLoss gathers the audio and the text features (and their MLP projections) the same way,
    `dist.all_gather(gathered, feats)` then `gathered[rank] = feats`: one defect in one loss, one finding with the
    other gathers as related places; a second loss function is a second finding."""
    loss = ("def {name}(a, t):\n    ga = [torch.zeros_like(a) for _ in range(world_size)]\n"
            "    gt = [torch.zeros_like(t) for _ in range(world_size)]\n    dist.all_gather(ga, a)\n"
            "    dist.all_gather(gt, t)\n    ga[rank] = a\n    gt[rank] = t\n"
            "    return (torch.cat(ga) @ torch.cat(gt).T).logsumexp(1).mean()\n")
    run = ("model = DDP(Net())\nfor x, y in loader:\n    {calls}.backward()\n")
    one = DDP_HEAD + "torch.manual_seed(0)\n" + loss.format(name="clip_loss") + run.format(
        calls="clip_loss(model(x), model(y))")
    hits = [f for f in audit.audit_source(one) if f.rule == "gather-without-grad"]
    # (one finding; among its places the other gather, and, since round 282, the step's call of the loss)
    gathers = [i for i, text in enumerate(one.splitlines(), 1) if "dist.all_gather(" in text]
    assert len(hits) == 1 and [line for _, line in hits[0].related if line in gathers] == gathers[1:], [
        (h.line, h.related) for h in hits]
    two = DDP_HEAD + "torch.manual_seed(0)\n" + loss.format(name="clip_loss") + loss.format(name="mlp_loss") + \
        run.format(calls="(clip_loss(model(x), model(y)) + mlp_loss(model(x), model(y)))")
    assert len([f for f in audit.audit_source(two) if f.rule == "gather-without-grad"]) == 2


def test_a_model_file_that_builds_its_own_class_under_its_main_guard(tmp_path):
    """CoCLR's backbone/s3dg.py ends in `if __name__ == '__main__': model = S3D(num_classes=400)`, and the file
    that imports it is not among these copies: a model trying itself out is no training script (its BatchNorm
    is judged where the model is wrapped). A main block that builds another module's class and wraps it is a
    script (one that distributes nothing is one process's: no rank finding belongs to it)."""
    model = ("import torch, torch.nn as nn\nclass S3D(nn.Module):\n    def __init__(self, num_classes):\n"
             "        super().__init__()\n        self.bn = nn.BatchNorm3d(8)\n    def forward(self, x):\n"
             "        return self.bn(x)\nif __name__ == '__main__':\n    model = {built}(num_classes=400)\n"
             "    print(model)\n")
    train = DDP_HEAD + "torch.manual_seed(0)\nmodel = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(Net()))\n"
    quiet = _project(tmp_path / "quiet", {"backbone/s3dg.py": model.format(built="S3D"), "train.py": train})
    wrapped = model.format(built="OtherNet").replace("print(model)",
                                                     "model = nn.parallel.DistributedDataParallel(model)")
    loud = _project(tmp_path / "loud", {"backbone/s3dg.py": wrapped, "train.py": train})
    assert not [f for f in audit.audit_paths([quiet]) if f.path.endswith("s3dg.py")]
    assert [f for f in audit.audit_paths([loud]) if f.path.endswith("s3dg.py")]
