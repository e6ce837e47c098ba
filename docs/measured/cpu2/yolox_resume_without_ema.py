"""YOLOX's Trainer (Megvii-BaseDetection/YOLOX 6ddff48, yolox/core/trainer.py) with `exp.ema = False`: save_ckpt
writes `save_model.state_dict()` where `save_model = self.ema_model.ema if self.use_model_ema else self.model`
(401-405), and self.model is the DDP wrapper whenever world_size > 1 (169); resume_train loads ckpt["model"]
into the plain model before the wrap (321). A lab-written reproduction of that sequence (not YOLOX's code): the
same steps at world_size 1 (no wrap) and at 2 gloo ranks on CPU. Prints what the resume does in each case."""

import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                               torch.nn.LazyLinear(2))


def run(rank, world, port, path, out):
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build()
    model(torch.zeros(1, 3, 8, 8))  # materialise the lazy layer
    use_model_ema = False  # exp.ema = False
    if world > 1:
        model = DDP(model)  # trainer.py 169: only when is_distributed
    save_model = None if use_model_ema else model  # trainer.py 401, the ema arm not taken
    if rank == 0:
        torch.save({"model": save_model.state_dict()}, path)  # trainer.py 403-410, rank 0 only
    if world > 1:
        dist.barrier()
    # the resume (a new run): the model is built, then loaded before the wrap (trainer.py 147, 321)
    fresh = build()
    fresh(torch.zeros(1, 3, 8, 8))
    ckpt = torch.load(path, map_location="cpu")
    keys = list(ckpt["model"])[:2]
    try:
        fresh.load_state_dict(ckpt["model"])
        result = "loads"
    except RuntimeError as e:
        result = "RuntimeError: " + str(e).splitlines()[1].strip()[:110]
    if rank == 0:
        out.put(f"world_size {world}: checkpoint keys {keys} ... -> resume into the plain model: {result}")
    if world > 1:
        dist.destroy_process_group()


def main():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        run(0, 1, 0, os.path.join(d, "one.pth"), out)
        print(out.get())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [ctx.Process(target=run, args=(r, 2, port, os.path.join(d, "two.pth"), out)) for r in range(2)]
        for p in procs:
            p.start()
        print(out.get())
        for p in procs:
            p.join()


if __name__ == "__main__":
    main()
