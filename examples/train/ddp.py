#!/usr/bin/env python3
"""Data-parallel training with PyTorch DDP over gloo, set up by env://.

An ordinary DDP script, as a user would bring it to `gpunet train`: it reads
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK from the
environment (gloo itself picks up GLOO_SOCKET_IFNAME when it is set), trains
a small MLP on synthetic data made from fixed seeds (nothing downloads), and
writes to --output (default $GN_OUTPUT or /output):

  - a checkpoint every --ckpt-every steps (ckpt-r<RANK>-<STEP>.pt, written
    atomically, the last two kept), and on start it resumes from the latest
    step whose checkpoint some rank holds: a rank that lacks it (a
    replacement on a new provider) gets it from one that has it;
  - one line per step on rank 0: the step time and the bytes this rank sent;
  - at the end, on every rank, the SHA-256 of the final parameters (float32,
    in parameter order), which must be identical on all ranks.

Bytes sent are counted, not measured: a DDP communication hook adds up the
size of every gradient bucket it all-reduces, times 2*(W-1)/W, which is what
each rank sends in a ring all-reduce of that buffer (reduce-scatter, then
all-gather). With --iface IF (default: $GLOO_SOCKET_IFNAME) the transmitted
bytes of that interface (/sys/class/net/IF/statistics/tx_bytes) are printed
beside it; that counts headers and every process using the interface, so on
a shared loopback it is the sum of all ranks.
"""
import argparse
import datetime
import hashlib
import io
import os
import re
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100, help="training steps in all (default 100)")
    p.add_argument("--ckpt-every", type=int, default=20, help="checkpoint every K steps, 0 = never (default 20)")
    p.add_argument("--output", default=os.environ.get("GN_OUTPUT", "/output"), help="checkpoints go here")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    p.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    p.add_argument("--depth", type=int, default=2, help="hidden layers of the MLP")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--iface", default=os.environ.get("GLOO_SOCKET_IFNAME", ""), help="interface whose tx bytes to show")
    p.add_argument("--timeout", type=float, default=300, help="seconds a collective may wait for the others")
    p.add_argument("--log-every", type=int, default=1, help="print every Nth step on rank 0")
    p.add_argument("--exit-after", type=int, default=0, help="testing: exit hard (status 75) after this step")
    a = p.parse_args()
    if a.steps < 1 or a.ckpt_every < 0 or a.batch < 1 or a.width < 1 or a.depth < 1 or a.log_every < 1:
        p.error("--steps, --batch, --width, --depth, --log-every must be >= 1, --ckpt-every >= 0")
    return a


IN, OUT = 32, 10


def make_model(width, depth):
    layers, d = [], IN
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, OUT))
    return nn.Sequential(*layers)


def batch(seed, step, rank, n):
    """The samples of one rank at one step: inputs, and labels from a fixed
    random teacher, so the loss can fall. Same (seed, step, rank), same data."""
    t = torch.Generator().manual_seed(seed)
    teacher = torch.randn(IN, OUT, generator=t)
    g = torch.Generator().manual_seed(seed * 1000003 + step * 1009 + rank)
    x = torch.randn(n, IN, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def params_sha256(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def tx_bytes(iface):
    if not iface:
        return None
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None


CKPT = re.compile(r"^ckpt-r(\d+)-(\d{8})\.pt$")


def local_steps(out, rank):
    try:
        names = os.listdir(out)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(2)) for m in map(CKPT.match, names) if m and int(m.group(1)) == rank)


def ckpt_path(out, rank, step):
    return os.path.join(out, f"ckpt-r{rank}-{step:08d}.pt")


def save_ckpt(out, rank, step, state, keep=2):
    path = ckpt_path(out, rank, step)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for s in local_steps(out, rank)[:-keep]:
        try:
            os.unlink(ckpt_path(out, rank, s))
        except FileNotFoundError:
            pass


def resume_state(out, rank, world):
    """Agrees on the latest checkpointed step any rank holds and returns
    (step, state): the rank's own checkpoint when it has that step, else the
    lowest such rank's, sent over the process group. (0, None): none."""
    mine = local_steps(out, rank)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    step = max((s for steps in everyone for s in steps), default=0)
    if step == 0:
        return 0, None
    holders = [r for r in range(world) if step in everyone[r]]
    own = None
    if step in mine:
        with open(ckpt_path(out, rank, step), "rb") as f:
            own = f.read()
    box = [own if rank == holders[0] else None]
    if len(holders) < world:
        dist.broadcast_object_list(box, src=holders[0])
    data = own if own is not None else box[0]
    return step, torch.load(io.BytesIO(data))


def main():
    a = parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.makedirs(a.output, exist_ok=True)

    model = make_model(a.width, a.depth)  # same seed: same start on every rank
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    start, state = resume_state(a.output, rank, world)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])

    sent = [0]
    ring = 2 * (world - 1) / world

    def counting_hook(pg, bucket):
        sent[0] += int(bucket.buffer().numel() * bucket.buffer().element_size() * ring)
        return default_hooks.allreduce_hook(pg, bucket)

    ddp = DDP(model)  # broadcasts rank 0's parameters to all
    ddp.register_comm_hook(None, counting_hook)
    loss_fn = nn.CrossEntropyLoss()
    # DDP lays its gradient buckets out anew after the first backward (in the
    # order gradients arrive), and a ring all-reduce adds each element's
    # parts in an order that depends on where the element lies in the
    # bucket. One backward whose gradients are thrown away makes every run,
    # fresh or resumed, use the same layout from its first step on, so a
    # resumed run ends bit for bit where an uninterrupted one does.
    x, y = batch(a.seed, 0, rank, a.batch)
    loss_fn(ddp(x), y).backward()
    opt.zero_grad(set_to_none=True)
    nparam = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(
            f"ddp: world {world} local_rank {local_rank} params {nparam} "
            f"({nparam * 4} bytes) steps {a.steps} start {start} "
            f"iface {a.iface or '-'} bytes=counted ring all-reduce payload",
            flush=True,
        )

    times, total_sent, iface0 = [], 0, tx_bytes(a.iface)
    for step in range(start + 1, a.steps + 1):
        t0 = time.perf_counter()
        sent[0] = 0
        x, y = batch(a.seed, step, rank, a.batch)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        total_sent += sent[0]
        if rank == 0 and (step % a.log_every == 0 or step == a.steps):
            print(f"step {step} loss {loss.item():.6f} time_ms {dt * 1e3:.2f} sent_bytes {sent[0]}", flush=True)
        if a.ckpt_every and step % a.ckpt_every == 0:
            save_ckpt(a.output, rank, step, {"step": step, "model": model.state_dict(), "opt": opt.state_dict()})
        if a.exit_after and step == a.exit_after:
            print(f"rank {rank} exiting after step {step} (--exit-after)", flush=True)
            sys.stdout.flush()
            os._exit(75)

    n = len(times)
    # A rank can finish its last all-reduce while its own last sends still
    # sit in the interface's queue: read the counter once all ranks are done.
    dist.barrier()
    iface1 = tx_bytes(a.iface)
    iface = f" iface_tx_bytes_per_step {(iface1 - iface0) / n:.0f}" if n and iface0 is not None and iface1 is not None else ""
    if n:
        print(
            f"rank {rank} summary steps {n} mean_step_ms {sum(times) / n * 1e3:.3f} "
            f"sent_bytes_per_step {total_sent / n:.0f}{iface}",
            flush=True,
        )
    print(f"rank {rank} final_params_sha256 {params_sha256(model)}", flush=True)
    dist.barrier()
    # Every rank is past its last collective. Leave without running
    # destructors: torch 1.13's ProcessGroupGloo destructor, run at
    # interpreter exit, joins its worker threads while holding the GIL, and
    # a worker freeing a tensor waits for the GIL: the rank would hang (seen
    # over shaped links, where ranks finish at different moments).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
