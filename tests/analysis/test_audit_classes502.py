"""Issue 35: classes of round 502-507's first look (docs/measured/cpu2/audit_heldout_round502.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (9bf42d7)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_memory_bank_filled_by_a_gather_leaves_the_handed_models_loss_local(tmp_path):
    """CaCo's init_memory(train_loader, model, Memory_Bank, ...): handed the DDP wrapper main_worker built, it
    computes the loss from `model(...)` and `Memory_Bank(q)`, and later in the loop fills the bank from
    concat_all_gather(k): the loss is still rank 0's own, and rank 0 prints its meter (rank0-local-loss). When the
    loss itself is all-reduced before the meter takes it, nothing is reported."""
    memory = ("import torch, torch.distributed as dist\nfrom meters import AverageMeter\n"
              "def concat_all_gather(t):\n    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]\n"
              "    dist.all_gather(out, t)\n    return torch.cat(out)\n"
              "def init_memory(loader, model, Memory_Bank, opt, rank):\n    losses = AverageMeter('Loss')\n"
              "    for i, x in enumerate(loader):\n        q, k = model(x)\n        l_neg = Memory_Bank(q)\n"
              "        logits = torch.cat([(q * k).sum(1, keepdim=True), l_neg], 1)\n"
              "        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long))\n"
              "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n        REDUCE"
              "losses.update(loss.item())\n        if rank == 0:\n            print('init loss', losses.avg)\n"
              "        output = concat_all_gather(k)\n        Memory_Bank.W.data[:, :len(output)] = output.T\n")
    main = (DDP + "from init_memory import init_memory\ndef main_worker(rank):\n"
            "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = torch.nn.Linear(2, 2)\n"
            "    model = DDP(model)\n    bank = torch.nn.Linear(2, 4)\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    init_memory([torch.ones(4, 2)] * 4, model, bank, opt, rank)\n"
            "if __name__ == '__main__':\n    main_worker(0)\n")
    own = {"main.py": main, "init_memory.py": memory.replace("REDUCE", "")}
    assert _rules(_project(tmp_path / "own", own), "rank0-local-loss")
    reduced = {"main.py": main, "init_memory.py": memory.replace(
        "REDUCE", "dist.all_reduce(loss)\n        loss = loss / dist.get_world_size()\n        ")}
    assert not _rules(_project(tmp_path / "reduced", reduced), "rank0-local-loss")


def test_a_return_in_rank_0s_own_block_of_a_training_loop(tmp_path):
    """ToucanTTS: `if rank == 0: save ...; if step_counter > steps: return` inside the training loop, then a
    barrier every rank reaches: at the last checkpoint rank 0 leaves the function, the other ranks wait at the
    barrier forever (collective-under-rank0). The same return outside rank 0's block is every rank's."""
    train = (DDP + "def train_loop(rank, steps):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "    step_counter = 0\n    while True:\n        loss = model(torch.ones(2)).sum()\n"
             "        loss.backward()\n        opt.step()\n        step_counter += 1\n"
             "        if step_counter % 10 == 0:\n            GUARD\n"
             "                torch.save(model.module.state_dict(), 'ckpt.pt')\n"
             "                if step_counter > steps:\n                    return\n"
             "            dist.barrier()\nif __name__ == '__main__':\n    train_loop(0, 100)\n")
    rank0 = train.replace("GUARD", "if rank == 0:")
    assert _rules(_project(tmp_path / "rank0", {"train.py": rank0}), "collective-under-rank0")
    every = train.replace("GUARD", "if True:")
    assert not _rules(_project(tmp_path / "every", {"train.py": every}), "collective-under-rank0")


def test_an_lr_helper_that_returns_a_product_with_the_world_size(tmp_path):
    """EfficientNetV2: `def lr(args): return 0.256 * args.batch_size * args.world_size / 4096`, handed to the
    optimizer (lr-grows-with-world-size). The same helper without the world size is the single run's lr."""
    train = (DDP + "import os, argparse\ndef lr(args):\n    return 0.256 * args.batch_size * FACTOR / 4096\n"
             "def main(args):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = torch.nn.Linear(2, 2)\n    optimizer = torch.optim.RMSprop(model.parameters(), lr(args))\n"
             "    model = DDP(model)\n    model(torch.ones(2)).sum().backward()\n    optimizer.step()\n"
             "if __name__ == '__main__':\n    args = argparse.Namespace(batch_size=128)\n"
             "    args.world_size = int(os.getenv('WORLD_SIZE', 1))\n    main(args)\n")
    grows = train.replace("FACTOR", "args.world_size")
    assert _rules(_project(tmp_path / "grows", {"main.py": grows}), "lr-grows-with-world-size")
    fixed = train.replace("FACTOR", "1")
    assert not _rules(_project(tmp_path / "fixed", {"main.py": fixed}), "lr-grows-with-world-size")

