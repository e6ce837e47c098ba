"""Issue 35, held-out batches 129-134 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_round129.txt), fixed as a class, quiet and loud."""

from pathlib import Path

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def _rules(found, path_end: str = "") -> list[str]:
    return [f.rule for f in found if f.path.endswith(path_end)]


def _places(finding) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for p, line in ((finding.path, finding.line), *finding.related)}


def test_a_meter_fed_over_several_lines_names_the_loss_line(tmp_path):
    """Segmenter: `logger.update(\\n loss=loss.item(),\\n lr=...)` feeds the meter rank 0's log_every prints; the
    finding names the line that holds the loss, not only the call's first line."""
    logger = ("class MetricLogger:\n    def update(self, **kw):\n        self.meters = kw\n"
              "    def log_every(self, it, n):\n        for x in it:\n            yield x\n"
              "            print(self.meters)\n")
    train = (SEEDED + "import builtins\nfrom logger import MetricLogger\nif rank != 0:\n"
             "    builtins.print = lambda *a, **k: None\nmodel = DDP(Net())\nlogger = MetricLogger()\n"
             "for x in logger.log_every(loader, 10):\n    loss = model(x).mean()\n    loss.backward()\n"
             "    logger.update(\n        loss=loss.item(),\n        lr=0.1,\n    )\n")
    found = [f for f in audit.audit_paths([_project(tmp_path, {"logger.py": logger, "train.py": train})])
             if f.rule == "rank0-local-loss"]
    assert found and ("train.py", 18) in _places(found[0]), found


def test_a_missing_seed_names_where_the_model_is_built(tmp_path):
    """StableTTS: nothing seeds torch; the finding names `model = StableTTS(...)`, where the unseeded init happens
    (and the seed goes before it), beside the wrap. Seeded, nothing to report."""
    train = (DDP_HEAD + "{seed}model = Net().to(rank)\n\nmodel = DDP(model, device_ids=[rank])\n")
    loud = [f for f in audit.audit_paths([_project(tmp_path / "l", {"train.py": train.format(seed="")})])
            if f.rule == "no-seed"]
    assert loud and ("train.py", 7) in _places(loud[0]), loud
    quiet = _project(tmp_path / "q", {"train.py": train.format(seed="torch.manual_seed(0)\n")})
    assert "no-seed" not in _rules(audit.audit_paths([quiet]))


def test_a_step_count_the_rank_reaches_is_no_rank_test(tmp_path):
    """ml-mdm: `batch_num` starts from a partition the rank picks, so the rank taint reaches it; `if batch_num %
    args.save_freq == 0:` inside `if global_rank == 0:` is a step count, not the leaky `rank % ngpus == 0`: the
    save is rank 0's alone. Without the rank-0 guard, every rank saves."""
    head = (SEEDED + "model = DDP(Net())\npartition_id = rank\nbatch_num = partition_id * 0\n"
            "for x in loader:\n    batch_num += 1\n    model(x).mean().backward()\n")
    quiet = _project(tmp_path / "q", {"train.py": head + (
        "    if rank == 0:\n        if batch_num % args.save_freq == 0:\n"
        "            torch.save(model.module.state_dict(), 'ckpt.pth')\n")})
    loud = _project(tmp_path / "l", {"train.py": head + (
        "    if batch_num % args.save_freq == 0:\n        torch.save(model.module.state_dict(), 'ckpt.pth')\n")})
    assert "save-on-every-rank" not in _rules(audit.audit_paths([quiet]))
    assert "save-on-every-rank" in _rules(audit.audit_paths([loud]))


def test_a_port_written_as_str_of_a_number_and_a_load_straight_into_the_model(tmp_path):
    """Segmenter: `os.environ["MASTER_PORT"] = str(12345)`, a fixed port; and sync_model's
    `model.load_state_dict(torch.load(sync_path))` on the ranks but 0, with no map_location. An environment
    fallback and map_location='cpu' leave nothing."""
    util = ("import os, torch, torch.distributed as dist\ndef init_process():\n"
            "    os.environ['MASTER_PORT'] = {port}\n    dist.init_process_group('nccl')\n"
            "def sync_model(sync_path, model, rank):\n    if rank == 0:\n"
            "        torch.save(model.state_dict(), sync_path)\n    dist.barrier()\n    if rank > 0:\n"
            "        model.load_state_dict(torch.load(sync_path{loc}))\n    return model\n")
    train = ("import os, torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "from dist_util import init_process, sync_model\ninit_process()\nrank = int(os.environ['RANK'])\n"
             "torch.manual_seed(0)\nmodel = sync_model('m.pkl', Net(), rank)\nmodel = DDP(model)\n")
    loud = _project(tmp_path / "l", {"dist_util.py": util.format(port="str(12345)", loc=""), "train.py": train})
    quiet = _project(tmp_path / "q", {"dist_util.py": util.format(
        port="os.environ.get('MASTER_PORT', '12345')", loc=", map_location='cpu'"), "train.py": train})
    assert {"hard-coded-master-port", "load-without-map-location"} <= set(_rules(audit.audit_paths([loud])))
    assert not {"hard-coded-master-port", "load-without-map-location"} & set(_rules(audit.audit_paths([quiet])))


def test_a_status_line_built_as_a_list_of_texts(tmp_path):
    """EDM / Patch-Diffusion: `fields += [f"loss {loss.mean().item():<9.3f}"]`, then `dist.print0(' '.join(fields))`
    prints rank 0's own loss. The same line without the loss is no loss log."""
    util = "import torch.distributed as dist\ndef print0(*args, **kwargs):\n    if dist.get_rank() == 0:\n" \
           "        print(*args, **kwargs)\n"
    train = (SEEDED + "import util\nmodel = DDP(Net())\nfor x in loader:\n    loss = model(x)\n"
             "    loss.sum().backward()\n    fields = []\n    fields += [f\"tick {{x}}\"]\n{line}"
             "    util.print0(' '.join(fields))\n")
    loud = _project(tmp_path / "l", {"util.py": util, "train.py": train.format(
        line="    fields += [f\"loss {loss.mean().item():<9.3f}\"]\n")})
    quiet = _project(tmp_path / "q", {"util.py": util, "train.py": train.format(line="")})
    assert "rank0-local-loss" in _rules(audit.audit_paths([loud]))
    assert "rank0-local-loss" not in _rules(audit.audit_paths([quiet]))


def test_an_inner_loop_of_micro_batches_before_one_step(tmp_path):
    """I2SB: `for it in range(num_itr): for _ in range(n_inner_loop): ... loss.backward()`, then
    `optimizer.step()` once per iteration: the inner passes accumulate without no_sync. Stepping inside the inner
    loop is no accumulation; under no_sync, none to report."""
    train = (SEEDED + "model = DDP(Net())\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "for it in range(100):\n    opt.zero_grad()\n    for _ in range(n_inner_loop):\n"
             "        loss = model(next(data)).mean()\n        loss.backward()\n{inner}    {outer}\n")
    loud = _project(tmp_path / "l", {"train.py": train.format(inner="", outer="opt.step()")})
    quiet = _project(tmp_path / "q", {"train.py": train.format(inner="        opt.step()\n", outer="pass")})
    assert "accumulation-without-no-sync" in _rules(audit.audit_paths([loud]))
    assert "accumulation-without-no-sync" not in _rules(audit.audit_paths([quiet]))


def test_an_inner_loop_that_is_no_micro_batch_loop(tmp_path):
    """AttentiveNAS trains several subnets on the same batch (`for arch_id in range(n): model.module.sample_...();
    loss.backward()`, then one step): no micro-batches drawn. EDM draws `next(it)` per round but runs each under
    `with misc.ddp_sync(ddp, last_round):`, its own no_sync. Drawing per pass with neither, it accumulates."""
    train = (SEEDED + "import misc\nmodel = DDP(Net())\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "for x in loader:\n    for i in range(4):\n{body}    opt.step()\n")
    same = "        model.module.sample_subnet(i)\n        model(x).mean().backward()\n"
    synced = ("        with misc.ddp_sync(model, i == 3):\n            y = next(it)\n"
              "            model(y).mean().backward()\n")
    drawn = "        y = next(it)\n        model(y).mean().backward()\n"
    for name, body in (("same", same), ("synced", synced)):
        quiet = _project(tmp_path / name, {"train.py": train.format(body=body)})
        assert "accumulation-without-no-sync" not in _rules(audit.audit_paths([quiet])), name
    loud = _project(tmp_path / "drawn", {"train.py": train.format(body=drawn)})
    assert "accumulation-without-no-sync" in _rules(audit.audit_paths([loud]))
