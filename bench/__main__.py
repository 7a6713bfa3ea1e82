"""``python -m bench <benchmark> [flags]``: the command-line entry of the benchmarks."""

from __future__ import annotations

import os

# Before anything imports a numeric library (and before engine processes are spawned:
# they inherit the environment), pin BLAS/OpenMP pools to one thread.
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402

# subcommand -> (module, one-line help); each module has DESCRIPTION, add_arguments, run
BENCHMARKS = {
    "core": ("core_overhead", "orchestrator overhead per hop (echo pipelines vs in-process, "
             "Unix socket, ZeroMQ and engine-process baselines)"),
    "startup": ("startup", "time to READY and memory of a 3-stage tiny-model pipeline, "
                "parallel vs sequential stage start"),
    "tts": ("tts", "speech: audio-seconds/s and time to first audio, omni (fused, split) vs "
            "piper called directly"),
    "qwen3_tts": ("qwen3_tts", "Qwen3-TTS: audio-seconds/s at concurrency c and time to first "
                  "audio, omni's server (fused stage, qwen3-tts environment)"),
    "assistant": ("assistant", "the default spoken assistant: time to first audio (asked by "
                  "text and by voice) vs its critical path"),
    "default": ("default", "good answers by default: the default server's answers to 20 "
                "factual questions at its defaults, share correct, tokens, audio seconds"),
    "sessions": ("sessions", "realtime sessions: a turn with history vs a plain request, many "
                 "sessions on one replica, voice turns vs their critical path"),
    "robots": ("robots", "robot policies: OpenPI round trip and chunks/s at N robots, omni's "
               "server vs the policy in-process"),
    "worlds": ("worlds", "world sessions (Cosmos 3): steps/s and frames/s at N sessions, "
               "omni's server vs the diffusers pipeline per step"),
    "asr": ("asr", "speech recognition: Whisper real-time factor, omni's server vs "
            "faster-whisper direct"),
    "vlm": ("vlm", "image chat (Qwen2.5-VL / Qwen3-VL) and Whisper in the HF layout, tiny or "
            "at the release's shapes: omni's server and engine vs transformers generate()"),
    "ar": ("ar", "text generation: tokens/s, TTFT and decode step vs the HBM roofline, omni "
           "(HTTP, in-process) vs transformers generate (sequential, batched)"),
    "diffusion": ("diffusion", "images: denoising steps/s and latency, omni's step-level "
                  "engine vs diffusers (per request, batched) and the bare transformer"),
    "videos": ("videos", "videos (Wan 2.2, LTX-Video): denoising steps/s and latency, omni's "
               "step-level engine vs the diffusers pipeline per request"),
    "omni": ("omni", "spoken answers (Qwen3-Omni): TTFT, TTFP, RTF, E2EL, underrun, stream "
             "vs full delivery, against the critical path"),
    "soak": ("soak", "reliability: many clients on mixed workloads for a set time, replicas "
             "killed at random, every answer checked, memory watched, drain under load"),
    "distributed": ("distributed", "two hosts as network namespaces: link round trip, control "
                    "hop (local vs cross-host with CURVE), payload transfer (zmq, mooncake) vs "
                    "a raw TCP copy"),
}


def main(argv: list[str] | None = None) -> int:
    import importlib

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="omni benchmarks. Each subcommand runs on this machine and writes a "
                    "Markdown report and a JSON file of raw numbers.")
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    modules = {}
    for name, (module_name, help_text) in BENCHMARKS.items():
        module = modules[name] = importlib.import_module(f"bench.{module_name}")
        module.add_arguments(sub.add_parser(
            name, help=help_text, description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    return modules[args.bench].run(args, argv)


if __name__ == "__main__":
    sys.exit(main())
