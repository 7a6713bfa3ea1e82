"""FP8 weights on CUDA: greedy tokens of eager vs CUDA graphs without and with
compile_decode, on the tiny Qwen3 (tests/gpu/test_fp8_cuda.py's fixture). Says which
difference splits them when the graphs' tokens differ from eager's.

    python bench/probes/fp8_graph_tokens.py [fp8] [none]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3

PROMPTS = ["Hello world, this is", "Tell me a story about a robot who", "One"]


def greedy(engine: AREngine) -> list[list[int]]:
    for i, p in enumerate(PROMPTS):
        engine.add(EngineRequest(f"g{i}", {"prompt": p},
                                 {"temperature": 0, "max_tokens": 12, "ignore_eos": True}))
    out: dict[str, list[int]] = {}
    while engine.has_work():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.data["token_ids"])
    return [out[f"g{i}"] for i in range(len(PROMPTS))]


def main() -> int:
    model = str(build_tiny_qwen3(Path(tempfile.mkdtemp()) / "qwen3", initializer_range=0.5))
    sides = {"eager": {"cuda_graphs": False, "compile_decode": False},
             "graphs": {"compile_decode": False},
             "graphs+compile": {}}
    for quant in sys.argv[1:] or ["fp8"]:
        got = {}
        for name, opts in sides.items():
            engine = AREngine(model, device="cuda", dtype="bfloat16",
                              options={"quantization": quant, **opts})
            got[name] = greedy(engine)
            del engine
        for name in sides:
            same = got[name] == got["eager"]
            print(f"{quant:5s} {name:15s} equal to eager: {same} {got[name] if not same else ''}")
        print(f"{quant:5s} eager: {got['eager']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
