#!/usr/bin/env python3
"""Low-communication training (DiLoCo-style) over gloo, set up by env://.

For links like home uplinks, where an all-reduce of the gradients at every
step (DDP) spends most of the time waiting on the network. Every rank keeps a
copy of the shared ("global") parameters and trains its own copy for
--inner-steps H steps on its own data with AdamW, talking to nobody. Then the
ranks all-reduce the change of their copies (global - local, the "outer
gradient"), average it, and apply it to the global parameters with an outer
optimizer (SGD with Nesterov momentum); every rank starts the next round from
the new global parameters. The network carries one parameter-sized
all-reduce every H steps instead of one per step.
(Douillard et al., "DiLoCo: Distributed Low-Communication Training of
Language Models", 2023.)

Same environment and conventions as ddp.py: MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK (GLOO_SOCKET_IFNAME when set); synthetic data from
fixed seeds; --output (default $GN_OUTPUT or /output) gets a checkpoint every
--ckpt-every steps (a multiple of H: checkpoints are taken right after an
outer step) and a restart resumes from the latest; rank 0 prints each step's
time and the bytes this rank sent (counted: the all-reduced buffer times
2*(W-1)/W, the ring all-reduce's share per rank; --iface adds the
interface's tx bytes); every rank prints the SHA-256 of the final global
parameters, identical on all ranks. The last step is always an outer step.
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
from torch.nn.utils import parameters_to_vector


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100, help="inner steps in all (default 100)")
    p.add_argument("--inner-steps", type=int, default=10, help="H: local steps between outer steps (default 10)")
    p.add_argument("--ckpt-every", type=int, default=20, help="checkpoint every K steps (a multiple of H), 0 = never")
    p.add_argument("--output", default=os.environ.get("GN_OUTPUT", "/output"), help="checkpoints go here")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    p.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    p.add_argument("--depth", type=int, default=2, help="hidden layers of the MLP")
    p.add_argument("--lr", type=float, default=1e-3, help="inner AdamW learning rate")
    p.add_argument("--outer-lr", type=float, default=0.7, help="outer SGD learning rate")
    p.add_argument("--outer-momentum", type=float, default=0.9, help="outer SGD Nesterov momentum")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--iface", default=os.environ.get("GLOO_SOCKET_IFNAME", ""), help="interface whose tx bytes to show")
    p.add_argument("--timeout", type=float, default=300, help="seconds a collective may wait for the others")
    p.add_argument("--log-every", type=int, default=1, help="print every Nth step on rank 0")
    p.add_argument("--exit-after", type=int, default=0, help="testing: exit hard (status 75) after this step")
    a = p.parse_args()
    if a.steps < 1 or a.inner_steps < 1 or a.batch < 1 or a.width < 1 or a.depth < 1 or a.log_every < 1:
        p.error("--steps, --inner-steps, --batch, --width, --depth, --log-every must be >= 1")
    if a.ckpt_every < 0 or a.ckpt_every % a.inner_steps:
        p.error("--ckpt-every must be 0 or a multiple of --inner-steps")
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
    """The samples of one rank at one step (same task as ddp.py)."""
    t = torch.Generator().manual_seed(seed)
    teacher = torch.randn(IN, OUT, generator=t)
    g = torch.Generator().manual_seed(seed * 1000003 + step * 1009 + rank)
    x = torch.randn(n, IN, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def sha256(params):
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def copy_into(vec, params):
    """Copies a flat vector into the parameters (torch's
    vector_to_parameters would make them views of it instead)."""
    i = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(vec[i : i + n].view_as(p))
            i += n


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
    """Agrees on the latest checkpointed step any rank holds. Returns (step,
    state, own): a rank that holds that step loads its own checkpoint (its
    inner optimizer state is its own); one that does not (a replacement)
    gets the lowest holder's over the process group and must start its inner
    optimizer afresh (own False). (0, None, True): no checkpoint anywhere."""
    mine = local_steps(out, rank)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    step = max((s for steps in everyone for s in steps), default=0)
    if step == 0:
        return 0, None, True
    holders = [r for r in range(world) if step in everyone[r]]
    own = None
    if step in mine:
        with open(ckpt_path(out, rank, step), "rb") as f:
            own = f.read()
    box = [own if rank == holders[0] else None]
    if len(holders) < world:
        dist.broadcast_object_list(box, src=holders[0])
    data = own if own is not None else box[0]
    return step, torch.load(io.BytesIO(data)), own is not None


def main():
    a = parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.makedirs(a.output, exist_ok=True)

    model = make_model(a.width, a.depth)  # the local copy; same seed: same start everywhere
    params = list(model.parameters())
    global_vec = parameters_to_vector(params).detach().clone()
    dist.broadcast(global_vec, src=0)  # the ranks start from rank 0's parameters whatever their seeds
    # The outer optimizer updates the global parameters, one flat vector;
    # its .grad is the averaged outer gradient.
    global_p = nn.Parameter(global_vec)
    outer = torch.optim.SGD([global_p], lr=a.outer_lr, momentum=a.outer_momentum, nesterov=True)
    inner = torch.optim.AdamW(params, lr=a.lr)

    start, state, own = resume_state(a.output, rank, world)
    if state is not None:
        with torch.no_grad():
            global_p.copy_(state["global"])
        outer.load_state_dict(state["outer"])
        if own:
            inner.load_state_dict(state["inner"])
        else:
            print(f"rank {rank}: no checkpoint of step {start} here: global state from another rank, inner optimizer afresh", flush=True)
    copy_into(global_p.detach(), params)

    ring = 2 * (world - 1) / world
    nparam = global_p.numel()
    if rank == 0:
        print(
            f"diloco: world {world} local_rank {local_rank} params {nparam} ({nparam * 4} bytes) "
            f"steps {a.steps} inner_steps {a.inner_steps} start {start} iface {a.iface or '-'} "
            f"bytes=counted ring all-reduce payload",
            flush=True,
        )

    loss_fn = nn.CrossEntropyLoss()
    times, total_sent, iface0 = [], 0, tx_bytes(a.iface)
    for step in range(start + 1, a.steps + 1):
        t0 = time.perf_counter()
        sent = 0
        x, y = batch(a.seed, step, rank, a.batch)
        inner.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        inner.step()
        if step % a.inner_steps == 0 or step == a.steps:
            # Outer step: average (global - local) over the ranks, let the
            # outer optimizer apply it, restart the local copy from the result.
            with torch.no_grad():
                delta = global_p.detach() - parameters_to_vector(params)
                delta.div_(world)
            dist.all_reduce(delta)
            sent = int(delta.numel() * delta.element_size() * ring)
            global_p.grad = delta
            outer.step()
            outer.zero_grad(set_to_none=True)
            copy_into(global_p.detach(), params)
        dt = time.perf_counter() - t0
        times.append(dt)
        total_sent += sent
        if rank == 0 and (step % a.log_every == 0 or step == a.steps):
            print(f"step {step} loss {loss.item():.6f} time_ms {dt * 1e3:.2f} sent_bytes {sent}", flush=True)
        if a.ckpt_every and step % a.ckpt_every == 0:
            save_ckpt(
                a.output,
                rank,
                step,
                {"step": step, "global": global_p.detach().clone(), "outer": outer.state_dict(), "inner": inner.state_dict()},
            )
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
    print(f"rank {rank} final_params_sha256 {sha256(params)}", flush=True)
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
