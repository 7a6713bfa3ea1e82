"""One decode step's attention on the CPU: the in-place C++ kernel vs gather + SDPA.

    OMP_NUM_THREADS=1 python bench/probes/cpu_decode_attention.py [--trials N]
        [--batch 1,8,32] [--context 192,1024] [--heads 4] [--kv-heads 2] [--dim 64]
        [--dtype float32] [--isa baseline|avx2]

Each cell: the minimum over N trials (the box is shared and noisy) of one call of
omni/engines/ar/cpu_decode_kernel.paged_decode and of paged_attention._sdpa_decode on the
same random cache, scattered blocks of 16, every sequence at the full context; the
shape defaults to the tiny Qwen3's (4 heads, 2 KV heads x 64, float32), one layer.
Also prints the largest difference of the two outputs. --isa runs one vector version of
the kernel's loops (default: the widest this CPU runs).
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from omni.engines.ar import cpu_decode_kernel
from omni.engines.ar.paged_attention import _sdpa_decode, padded_context_slots

BLOCK = 16


def _case(batch: int, context: int, heads: int, kv_heads: int, dim: int,
          dtype: torch.dtype) -> tuple:
    blocks = batch * -(-context // BLOCK) + 1
    k = torch.randn(blocks * BLOCK, kv_heads, dim).to(dtype)
    v = torch.randn(blocks * BLOCK, kv_heads, dim).to(dtype)
    order = torch.randperm(blocks - 1).add(1).tolist()  # scattered, as after churn
    per = -(-context // BLOCK)
    tables = [order[i * per:(i + 1) * per] for i in range(batch)]
    lens = [context] * batch
    slots, valid = padded_context_slots(tables, lens, BLOCK, context)
    # q (H, B, D) as the model hands it: a transposed view of (B, H, D)
    q = torch.randn(batch, heads, dim).to(dtype).transpose(0, 1)
    return q, k, v, slots, valid, torch.tensor(lens)


def _min_time(fn, trials: int) -> float:
    fn()
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--context", default="192,1024")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--isa", choices=sorted(cpu_decode_kernel.ISAS))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    if not cpu_decode_kernel.available():
        raise SystemExit(f"kernel unavailable: {cpu_decode_kernel.unavailable_reason()}")
    cpu_decode_kernel.force_isa(args.isa)
    print(f"kernel ready in {time.perf_counter() - start:.2f} s; torch threads "
          f"{torch.get_num_threads()}; {args.heads} heads / {args.kv_heads} KV x {args.dim}, "
          f"{args.dtype}; ISA {args.isa or 'widest'}; min of {args.trials}, one layer")
    print("| batch | context | kernel us | gather+SDPA us | speedup | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for batch in map(int, args.batch.split(",")):
        for context in map(int, args.context.split(",")):
            q, k, v, slots, valid, lens = _case(batch, context, args.heads, args.kv_heads,
                                                args.dim, dtype)
            ours_call = functools.partial(cpu_decode_kernel.paged_decode, q, k, v, slots,
                                          lens, None, 0)
            sdpa_call = functools.partial(_sdpa_decode, q, k, v, slots, valid, lens, None, 0)
            ours, sdpa = _min_time(ours_call, args.trials), _min_time(sdpa_call, args.trials)
            diff = (ours_call().float() - sdpa_call().float()).abs().max()
            print(f"| {batch} | {context} | {ours:.1f} | {sdpa:.1f} | {sdpa / ours:.2f}x "
                  f"| {diff.item():.1e} |")


if __name__ == "__main__":
    main()
