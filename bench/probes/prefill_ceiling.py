"""The plain-PyTorch prefill ceiling of a dense decoder (issue #44): the model's layers run
unpaged, as one batch of equal-length prompts, nothing else.

`python bench/probes/prefill_ceiling.py [--layers 36] [OUT_JSON]` (CUDA, bf16): the Qwen3-8B
shape (hidden 4096, 32 query / 8 KV heads of 128, MLP 12288, vocab 151936) with random
weights; each layer is RMSNorm, one fused q/k/v matmul, per-head q/k RMSNorm, rotary
embeddings, SDPA causal attention (flash), the output projection, RMSNorm and the gated
MLP (fused gate/up), and the step ends with the final norm and the LM head on each
sequence's last row, as a serving engine's prefill does. Timed with CUDA events (median of
5 after 2 warm-ups) for 8 x 2,048, 4 x 2,048, 1 x 8,192 and 2 x 4,096 tokens, beside the
measured bf16 matmul peak (8192^3), so a server's prompt tokens/s can be read against it.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, DIM, MLP, VOCAB = 4096, 32, 8, 128, 12288, 151936
SHAPES = [(8, 2048), (4, 2048), (1, 8192), (2, 4096)]


def _weights(layers: int) -> list[dict[str, torch.Tensor]]:
    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 0.02
    return [{"qkv": w((HEADS + 2 * KV_HEADS) * DIM, HIDDEN), "o": w(HIDDEN, HEADS * DIM),
             "gate_up": w(2 * MLP, HIDDEN), "down": w(HIDDEN, MLP)} for _ in range(layers)]


def _rotary(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (1e6 ** (torch.arange(0, DIM, 2, device="cuda").float() / DIM))
    freqs = torch.outer(torch.arange(length, device="cuda").float(), inv)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _layer(x: torch.Tensor, w: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    b, n, _ = x.shape
    h = F.rms_norm(x, (HIDDEN,))
    q, k, v = F.linear(h, w["qkv"]).split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1)
    q = F.rms_norm(q.view(b, n, HEADS, DIM), (DIM,)).transpose(1, 2)
    k = F.rms_norm(k.view(b, n, KV_HEADS, DIM), (DIM,)).transpose(1, 2)
    v = v.view(b, n, KV_HEADS, DIM).transpose(1, 2)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(attn.transpose(1, 2).reshape(b, n, HEADS * DIM), w["o"])
    gate, up = F.linear(F.rms_norm(x, (HIDDEN,)), w["gate_up"]).chunk(2, -1)
    return x + F.linear(F.silu(gate) * up, w["down"])


def _timed(fn, reps: int = 5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _matmul_peak() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = _timed(lambda: a @ a, reps=10)
    return 2 * 8192 ** 3 / (ms / 1e3) / 1e12


def main() -> None:
    args = sys.argv[1:]
    layers = int(args[args.index("--layers") + 1]) if "--layers" in args else 36
    out_path = next((a for a in args if a.endswith(".json")), None)
    weights = _weights(layers)
    head = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    peak = _matmul_peak()
    print(f"[ceiling] {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"bf16 matmul peak {peak:.0f} TFLOP/s; {layers} layers")
    rows = []
    for batch, length in SHAPES:
        x0 = torch.randn(batch, length, HIDDEN, device="cuda", dtype=torch.bfloat16)
        cos, sin = _rotary(length)

        @torch.inference_mode()
        def step(x0=x0, cos=cos, sin=sin):
            x = x0
            for w in weights:
                x = _layer(x, w, cos, sin)
            return F.linear(F.rms_norm(x[:, -1], (HIDDEN,)), head)
        ms = _timed(step)
        tokens = batch * length
        params = sum(t.numel() for w in weights for t in w.values())
        flops = 2 * params * tokens + 4 * layers * HEADS * DIM * batch * length ** 2 / 2
        row = {"batch": batch, "length": length, "ms": round(ms, 2),
               "tok_s": round(tokens / (ms / 1e3)), "pct_of_peak": round(
                   100 * flops / (ms / 1e3) / 1e12 / peak, 1)}
        print(f"[ceiling] {json.dumps(row)}", flush=True)
        rows.append(row)
        del x0
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "peak_tflops": round(peak), "layers": layers, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
