#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# One rank of scripts/gpu_check.sh: an unchanged torch.distributed program, run by that
# script once per rank with the usual environment (RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT) plus NCCL's and Vigil's variables. It knows nothing of Vigil: what it checks
# is what a user's job would see. Results go to --out (JSON), never to stdout, which NCCL's
# INFO log may share.
#
#   usage: torch_check.py CASE --out FILE [--device cuda|cpu] [--seconds S] [--ranks-note X]
#   CASE:
#     collectives  every torch.distributed collective, fp32/bf16/int32, 1 to 16 M elements,
#                  each result compared with the exact value computed on the CPU
#     ddp          30 steps of DistributedDataParallel (a 23 M-parameter MLP, fixed seeds):
#                  the loss of every step and a digest of the final parameters
#     timing       AllReduce, Broadcast, ReduceScatter, AllGather from 4 B to 256 MiB, five
#                  calls each, synchronised, each timed with CUDA events
#     bandwidth    AllReduce of 64 and 256 MiB, bus bandwidth (nccl-tests' definition)
#     loop         a validated 16 MiB all-reduce loop for --seconds, every iteration's end
#                  time and duration (the ranks agree when to stop through the all-reduce);
#                  rank 0 writes --mark after the first iteration
#     tuner        AllReduce of 1 KiB to 4 MiB (a tuner rules file may change NCCL's choice;
#                  the profiler's summary says what NCCL chose)
import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int32": torch.int32}


def pattern(n, seed, dtype, device):
    """Small non-negative integers (0..3): sums over 4 ranks stay exact in bf16 too."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (n,), generator=g, dtype=torch.int32).to(dtype).to(device)


class Checker:
    def __init__(self, device):
        self.device = device
        # gloo (the --device cpu dry run) has no bf16 reductions nor reduce_scatter.
        self.full = device.type == "cuda"
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.cases = []

    def data(self, n, dtype, rank, salt):
        return pattern(n, 1000003 * salt + 7919 * rank + n, dtype, "cpu")

    def expect(self, name, dtype, n, got, want):
        ok = torch.equal(got.cpu(), want.cpu())
        bad = 0 if ok else int((got.cpu() != want.cpu()).sum())
        self.cases.append({"case": name, "dtype": dtype, "elements": n, "ok": ok, "wrong": bad})

    def run(self, sizes):
        dev, r, w = self.device, self.rank, self.world
        for dname, dtype in DTYPES.items():
            # (every input below is a copy: on the CPU, .to(dev) would return the tensor itself
            # and the in-place collectives would change the reference data)
            if not self.full and dname == "bf16":
                continue
            for n in sizes:
                salt = n % 9973
                mine = self.data(n, dtype, r, salt)
                every = [self.data(n, dtype, k, salt) for k in range(w)]
                total = torch.stack([e.to(torch.float64) for e in every]).sum(0).to(dtype)
                # all_reduce: sum, max, min
                t = mine.to(dev, copy=True)
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
                self.expect("all_reduce_sum", dname, n, t, total)
                t = mine.to(dev, copy=True)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                self.expect("all_reduce_max", dname, n, t, torch.stack(every).max(0).values)
                t = mine.to(dev, copy=True)
                dist.all_reduce(t, op=dist.ReduceOp.MIN)
                self.expect("all_reduce_min", dname, n, t, torch.stack(every).min(0).values)
                # broadcast from the last rank
                t = mine.to(dev, copy=True)
                dist.broadcast(t, src=w - 1)
                self.expect("broadcast", dname, n, t, every[w - 1])
                # reduce to rank 0
                t = mine.to(dev, copy=True)
                dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
                if r == 0:
                    self.expect("reduce", dname, n, t, total)
                # all_gather (list and tensor forms)
                outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(w)]
                dist.all_gather(outs, mine.to(dev, copy=True))
                self.expect("all_gather", dname, n, torch.cat(outs), torch.cat(every))
                if self.full:
                    out = torch.empty(n * w, dtype=dtype, device=dev)
                    dist.all_gather_into_tensor(out, mine.to(dev, copy=True))
                    self.expect("all_gather_into_tensor", dname, n, out, torch.cat(every))
                    # reduce_scatter: rank k gets block k of the element-wise sum
                    inp = torch.cat([self.data(n, dtype, r, salt + 1 + k) for k in range(w)]).to(dev)
                    out = torch.empty(n, dtype=dtype, device=dev)
                    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
                    want = torch.stack([self.data(n, dtype, q, salt + 1 + r).to(torch.float64)
                                        for q in range(w)]).sum(0).to(dtype)
                    self.expect("reduce_scatter_tensor", dname, n, out, want)
                # all_to_all: block k of my input goes to rank k
                inp = torch.cat([self.data(n, dtype, r, salt + 100 + k) for k in range(w)]).to(dev)
                out = torch.empty(n * w, dtype=dtype, device=dev)
                dist.all_to_all_single(out, inp)
                want = torch.cat([self.data(n, dtype, q, salt + 100 + r) for q in range(w)])
                self.expect("all_to_all_single", dname, n, out, want)
                # send/recv around the ring (even ranks send first: no deadlock)
                nxt, prv = (r + 1) % w, (r - 1) % w
                got = torch.empty(n, dtype=dtype, device=dev)
                ops = [dist.P2POp(dist.isend, mine.to(dev, copy=True), nxt), dist.P2POp(dist.irecv, got, prv)]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
                self.expect("send_recv", dname, n, got, every[prv])
                # gather and scatter (rank 0)
                t = mine.to(dev, copy=True)
                lst = [torch.empty(n, dtype=dtype, device=dev) for _ in range(w)] if r == 0 else None
                dist.gather(t, gather_list=lst, dst=0)
                if r == 0:
                    self.expect("gather", dname, n, torch.cat(lst), torch.cat(every))
                out = torch.empty(n, dtype=dtype, device=dev)
                src = [self.data(n, dtype, k, salt + 200).to(dev) for k in range(w)] if r == 0 else None
                dist.scatter(out, scatter_list=src, src=0)
                self.expect("scatter", dname, n, out, self.data(n, dtype, r, salt + 200))
        return self.cases


def case_collectives(a, dev):
    sizes = [1, 1023, 1 << 20, 16 << 20] if a.device == "cuda" else [1, 1023, 1 << 16]
    cases = Checker(dev).run(sizes)
    return {"cases": len(cases), "failed": [c for c in cases if not c["ok"]],
            "ok": all(c["ok"] for c in cases)}


def case_ddp(a, dev):
    torch.manual_seed(1234)
    # Deterministic kernels, so two transports can be compared bit for bit.
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    width = 2048
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, width), torch.nn.ReLU(),
        *[m for _ in range(5) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())],
        torch.nn.Linear(width, 10)).to(dev)
    params = sum(p.numel() for p in model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[0] if a.device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(99 + dist.get_rank())
    losses = []
    for _ in range(a.steps):
        x = torch.randn(64, 1024, generator=g).to(dev)
        y = torch.randint(0, 10, (64,), generator=g).to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return {"ok": True, "parameters": params, "steps": a.steps, "losses": losses,
            "param_sha256": h.hexdigest()}


TIMED = [("all_reduce", "AllReduce"), ("broadcast", "Broadcast"),
         ("reduce_scatter", "ReduceScatter"), ("all_gather", "AllGather")]


def one_call(kind, buf, out, w):
    if kind == "all_reduce":
        dist.all_reduce(buf)
    elif kind == "broadcast":
        dist.broadcast(buf, src=0)
    elif kind == "reduce_scatter":
        dist.reduce_scatter_tensor(out, buf)
    else:
        dist.all_gather_into_tensor(out, buf)


def case_timing(a, dev):
    """Each call synchronised and timed with CUDA events around it; `bytes` is the size the
    profiler's summary reports (nccl-tests: the whole buffer for ReduceScatter/AllGather)."""
    w = dist.get_world_size()
    calls = []
    sizes = [4, 1 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20, 256 << 20]
    if a.device != "cuda":
        sizes = sizes[:4]
    for kind, nccl in TIMED:
        for nbytes in sizes:
            n = max(1, nbytes // 4)
            if kind in ("reduce_scatter", "all_gather"):
                n = max(w, n - n % w)
            per = n // w
            if kind == "all_gather":
                buf = torch.ones(per, dtype=torch.float32, device=dev)
                out = torch.empty(per * w, dtype=torch.float32, device=dev)
            elif kind == "reduce_scatter":
                buf = torch.ones(n, dtype=torch.float32, device=dev)
                out = torch.empty(per, dtype=torch.float32, device=dev)
            else:
                buf, out = torch.ones(n, dtype=torch.float32, device=dev), None
            for k in range(1 + a.calls):  # the first is a warm-up, not compared
                if a.device == "cuda":
                    torch.cuda.synchronize()
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    one_call(kind, buf, out, w)
                    e1.record()
                    torch.cuda.synchronize()
                    us = e0.elapsed_time(e1) * 1000.0
                else:
                    t0 = time.perf_counter()
                    one_call(kind, buf, out, w)
                    us = (time.perf_counter() - t0) * 1e6
                calls.append({"func": nccl, "bytes": (per * w if kind in ("reduce_scatter", "all_gather")
                                                      else n) * 4, "cuda_us": us, "warmup": k == 0})
    return {"ok": True, "calls": calls}


def case_bandwidth(a, dev):
    w = dist.get_world_size()
    out = []
    for nbytes in (64 << 20, 256 << 20):
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        for _ in range(3):
            dist.all_reduce(buf)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(buf)
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / a.iters
        out.append({"bytes": nbytes, "seconds": dt, "busbw_GBps": nbytes / dt / 1e9 * 2 * (w - 1) / w})
    return {"ok": True, "results": out}


def case_loop(a, dev):
    """A validated all-reduce loop. Every rank's contribution is (rank + 1) * (i % 7 + 1) in
    every element, so the sum is known; the last element carries the stop vote."""
    w, r = dist.get_world_size(), dist.get_rank()
    n = (16 << 20) // 4
    want_base = sum(range(1, w + 1))
    iters, wrong, t_start = [], 0, time.time()
    i = 0
    mark = a.mark if r == 0 else None
    while True:
        k = i % 7 + 1
        buf = torch.full((n,), float((r + 1) * k), dtype=torch.float32, device=dev)
        stop = 1.0 if (r == 0 and time.time() - t_start > a.seconds) else 0.0
        buf[-1] = stop
        t0 = time.time()
        dist.all_reduce(buf)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t1 = time.time()
        wrong += int((buf[:-1] != float(want_base * k)).sum().item())
        iters.append([round(t1, 6), round((t1 - t0) * 1e3, 3)])
        i += 1
        if mark:  # the orchestrator times its faults from the first iteration
            with open(mark, "w") as f:
                f.write(f"{t1}\n")
            mark = None
        if buf[-1].item() > 0:
            break
    return {"ok": wrong == 0, "iterations": len(iters), "wrong": wrong, "iters": iters}


def case_tuner(a, dev):
    for nbytes in (1 << 10, 64 << 10, 1 << 20, 4 << 20):
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        for _ in range(4):
            dist.all_reduce(buf)
    if a.device == "cuda":
        torch.cuda.synchronize()
    return {"ok": True}


CASES = {"collectives": case_collectives, "ddp": case_ddp, "timing": case_timing,
         "bandwidth": case_bandwidth, "loop": case_loop, "tuner": case_tuner}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--mark", help="loop: file rank 0 writes after its first iteration")
    a = p.parse_args()
    backend = "nccl" if a.device == "cuda" else "gloo"
    dev = torch.device("cuda:0") if a.device == "cuda" else torch.device("cpu")
    if a.device == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU, each its own "host"
    t0 = time.time()
    res = {"case": a.case, "ok": False}
    try:
        dist.init_process_group(backend, timeout=__import__("datetime").timedelta(seconds=120))
        res = CASES[a.case](a, dev)
        res["case"] = a.case
    except Exception as e:  # reported in the JSON: the orchestrator decides
        res["error"] = f"{type(e).__name__}: {e}"
    res.update({"rank": int(os.environ.get("RANK", -1)), "world": int(os.environ.get("WORLD_SIZE", -1)),
                "torch": torch.__version__, "seconds": round(time.time() - t0, 3)})
    if a.device == "cuda" and hasattr(torch.cuda, "nccl"):
        try:
            res["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            pass
    with open(a.out, "w") as f:
        json.dump(res, f)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
