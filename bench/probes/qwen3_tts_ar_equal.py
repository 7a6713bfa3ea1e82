"""Does the AR talker's fast path (decode graphs, the code predictor's graphs with compiled
layers) give qwen-tts's codes? Greedy, float32, one device.

Runs in the qwen3-tts environment on a CustomVoice release (default: the tiny fixture):
qwen-tts's ``generate_custom_voice`` per text (its codes, read from the model's generate),
then the feedback AR engine (omni/models/qwen3_tts_talker.py) with its default options on
the same texts at once (one batch), and prints, per text, how many frames match exactly.
CPU tests cover the same comparison without graphs (tests/http/test_qwen3_tts_ar.py); on a
GPU this is the check that graphs and compile keep the codes.

    python bench/probes/qwen3_tts_ar_equal.py [--model DIR] [--device cuda] [--frames 24]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

JOBS = [("Hello there, how are you today?", "vivian"),
        ("The ship sailed north across the cold sea.", "ryan"),
        ("Carrying wheat, wool, iron and passengers.", "aiden")]


def reference_codes(model_dir: str, device: str, frames: int) -> list[list[list[int]]]:
    import torch
    from qwen_tts import Qwen3TTSModel

    tts = Qwen3TTSModel.from_pretrained(model_dir, dtype=torch.float32)
    tts.model.to(device)
    tts.device = tts.model.speech_tokenizer.device = torch.device(device)
    tts.model.speech_tokenizer.model.to(device)
    codes, generate = [], tts.model.generate

    def record(*args, **kwargs):
        out = generate(*args, **kwargs)
        codes.append(out[0][0].tolist())
        return out

    tts.model.generate = record
    for text, speaker in JOBS:
        tts.generate_custom_voice(text, speaker=speaker, do_sample=False,
                                  subtalker_dosample=False, max_new_tokens=frames)
    return codes


def engine_codes(model_dir: str, device: str, frames: int) -> list[list[list[int]]]:
    from omni.engines.ar.feedback import FeedbackAREngine
    from omni.engines.base import EngineRequest

    engine = FeedbackAREngine("qwen3_tts_ar_talker", model_dir, dtype="float32", device=device,
                              options={"subtalker_dosample": False, "kv_cache_mb": 64})
    for i, (text, speaker) in enumerate(JOBS):
        engine.add(EngineRequest(str(i), {"text": text},
                                 {"voice": speaker, "temperature": 0, "max_tokens": frames - 1}))
    got: dict[str, list[list[int]]] = {str(i): [] for i in range(len(JOBS))}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            if "codes" in out.data:
                got[out.request_id].append([c[0] for c in out.data["codes"]])
    graphs = engine.graphs is not None and engine.feed.graphs is not None
    print(f"[qwen3_tts_ar_equal] decode graphs and predictor graphs: {graphs}, predictor "
          f"layers compiled: {bool(graphs and engine.feed.graphs.compiled)}")
    return [got[str(i)] for i in range(len(JOBS))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--frames", type=int, default=24)
    args = parser.parse_args()
    model = args.model
    if not model:
        from bench.qwen3_tts import fixture_dir

        model = fixture_dir("", False, "tiny")
    expected = reference_codes(model, args.device, args.frames)
    served = engine_codes(model, args.device, args.frames)
    bad = 0
    for (text, _), want, got in zip(JOBS, expected, served, strict=True):
        same = sum(a == b for a, b in zip(want, got, strict=False))
        distinct = len({tuple(f) for f in want})
        print(f"[qwen3_tts_ar_equal] {text[:30]!r}: {same}/{len(want)} frames equal "
              f"(engine gave {len(got)}; {distinct} distinct frames in the reference)")
        bad += same != len(want) or len(got) != len(want)
    print(f"[qwen3_tts_ar_equal] {'EQUAL' if not bad else f'{bad} texts differ'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
