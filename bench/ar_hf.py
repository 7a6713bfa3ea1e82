"""The transformers baselines of `python -m bench ar`, and the copy-bandwidth probe.

Both run in the benchmark's own process, after our sides have stopped (so the GPU holds
one model at a time, and CUDA is first touched here, never before an engine starts).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from bench.common import say


def copy_bandwidth(device: str) -> dict[str, Any]:
    """A large device-to-device tensor copy: (bytes read + bytes written) / time."""
    import torch

    cuda = device.startswith("cuda")
    size = (4 if cuda else 0.25) * 2**30
    src = torch.ones(int(size), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    iters = 20 if cuda else 5
    for _ in range(3):
        dst.copy_(src)
    if cuda:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        seconds = time.perf_counter() - t0
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    gbps = 2 * size * iters / seconds / 1e9
    say(f"[ar] copy bandwidth on {device}: {gbps:.1f} GB/s ({size / 2**30:g} GiB tensor, "
        f"read + write, {iters} copies)")
    return {"device": device, "tensor_gib": size / 2**30, "copies": iters,
            "gb_per_s": round(gbps, 1)}


class _TokenTimes:
    """A generate() streamer (transformers' BaseStreamer protocol: put/end) that keeps
    when each step's new tokens reached the host. The first put() is the prompt."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


class HFRunner:
    """AutoModelForCausalLM.generate, greedy, exactly `new_tokens` new tokens per row."""

    def __init__(self, model_dir: str, device: str, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a tqdm bar per load garbles the progress log
        hf_logging.set_verbosity_error()  # "generation flags not valid": we pass our own
        started = time.perf_counter()
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
        if device != "cpu":
            kwargs["device_map"] = device  # loads straight onto the GPU
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs).eval()
        self.device = device
        self.implementation = {  # what transformers picked (attention, MoE experts)
            "attention": getattr(self.model.config, "_attn_implementation", None),
            "experts": getattr(self.model.config, "_experts_implementation", None)}
        eos = self.model.generation_config.eos_token_id
        self.pad = (eos[0] if isinstance(eos, list) else eos) or 0
        self._config = GenerationConfig
        say(f"[ar] transformers loaded {model_dir} on {device} ({dtype}) in "
            f"{time.perf_counter() - started:.1f} s; implementations {self.implementation}")

    def generate(self, prompts: list[list[int]], new_tokens: int) -> tuple[list[float], int]:
        """One generate() over all prompts (equal lengths: no padding needed); returns the
        host times of each step's tokens and the new tokens per row."""
        import torch

        ids = torch.tensor(prompts, device=self.device)
        config = self._config(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=self.pad,
                              eos_token_id=self.model.generation_config.eos_token_id)
        streamer = _TokenTimes()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=config, streamer=streamer)
        return streamer.times, int(out.shape[1] - ids.shape[1])

    def close(self) -> None:
        import torch

        del self.model
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _record(times: list[float], tokens: int, start: float, done: float) -> dict[str, Any]:
    itl = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return {"ttft": times[0] - start, "itl": itl, "done": done - start, "tokens": tokens,
            "gaps": [b - a for a, b in zip(times, times[1:], strict=False)]}


def sequential_burst(hf: HFRunner, prompts: list[list[int]],
                     new_tokens: int) -> tuple[list[dict[str, Any]], float]:
    """The burst's requests one after another; times count from the burst's start."""
    start, runs = time.perf_counter(), []
    for prompt in prompts:
        times, n = hf.generate([prompt], new_tokens)
        runs.append(_record(times, n, start, time.perf_counter()))
    return runs, time.perf_counter() - start


def batched_burst(hf: HFRunner, prompts: list[list[int]],
                  new_tokens: int) -> tuple[list[dict[str, Any]], float]:
    """All the burst's prompts in one generate(): every row shares the batch's times."""
    start = time.perf_counter()
    times, n = hf.generate(prompts, new_tokens)
    done = time.perf_counter()
    return [_record(times, n, start, done) for _ in prompts], done - start


BURSTS: dict[str, Callable[..., tuple[list[dict[str, Any]], float]]] = {
    "hf-sequential": sequential_burst, "hf-batched": batched_burst}
