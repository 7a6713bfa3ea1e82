"""``python -m bench <benchmark> [flags]``: the command-line entry of the benchmarks."""

from __future__ import annotations

import os

# Before anything imports a numeric library (and before engine processes are spawned:
# they inherit the environment), pin BLAS/OpenMP pools to one thread.
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from bench import (
        ar,
        asr,
        assistant,
        core_overhead,
        diffusion,
        omni,
        robots,
        sessions,
        startup,
        tts,
        worlds,
    )

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="omni benchmarks. Each subcommand runs on this machine and writes a "
                    "Markdown report and a JSON file of raw numbers.")
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    core = sub.add_parser(
        "core", help="orchestrator overhead per hop (echo pipelines vs in-process, Unix socket, "
                     "ZeroMQ and engine-process baselines)",
        description=core_overhead.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    core_overhead.add_arguments(core)
    startup_parser = sub.add_parser(
        "startup", help="time to READY and memory of a 3-stage tiny-model pipeline, "
                        "parallel vs sequential stage start",
        description=startup.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    startup.add_arguments(startup_parser)
    tts_parser = sub.add_parser(
        "tts", help="speech: audio-seconds/s and time to first audio, omni (fused, split) vs "
                    "piper called directly", description=tts.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    tts.add_arguments(tts_parser)
    assistant_parser = sub.add_parser(
        "assistant", help="the default spoken assistant: time to first audio (asked by text "
                          "and by voice) vs its critical path", description=assistant.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    assistant.add_arguments(assistant_parser)
    sessions_parser = sub.add_parser(
        "sessions", help="realtime sessions: a turn with history vs a plain request, many "
                         "sessions on one replica, voice turns vs their critical path",
        description=sessions.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sessions.add_arguments(sessions_parser)
    robots_parser = sub.add_parser(
        "robots", help="robot policies: OpenPI round trip and chunks/s at N robots, omni's "
                       "server vs the policy in-process", description=robots.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    robots.add_arguments(robots_parser)
    worlds_parser = sub.add_parser(
        "worlds", help="world sessions (Cosmos 3): steps/s and frames/s at N sessions, omni's "
                       "server vs the diffusers pipeline per step", description=worlds.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    worlds.add_arguments(worlds_parser)
    asr_parser = sub.add_parser(
        "asr", help="speech recognition: Whisper real-time factor, omni's server vs "
                    "faster-whisper direct", description=asr.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    asr.add_arguments(asr_parser)
    ar_parser = sub.add_parser(
        "ar", help="text generation: tokens/s, TTFT and decode step vs the HBM roofline, omni "
                   "(HTTP, in-process) vs transformers generate (sequential, batched)",
        description=ar.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    ar.add_arguments(ar_parser)
    diffusion_parser = sub.add_parser(
        "diffusion", help="images: denoising steps/s and latency, omni's step-level engine vs "
                          "diffusers (per request, batched) and the bare transformer",
        description=diffusion.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    diffusion.add_arguments(diffusion_parser)
    omni_parser = sub.add_parser(
        "omni", help="spoken answers (Qwen3-Omni): TTFT, TTFP, RTF, E2EL, underrun, stream vs "
                     "full delivery, against the critical path", description=omni.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    omni.add_arguments(omni_parser)
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.bench == "startup":
        return startup.run(args, argv)
    if args.bench == "tts":
        return tts.run(args, argv)
    if args.bench == "assistant":
        return assistant.run(args, argv)
    if args.bench == "sessions":
        return sessions.run(args, argv)
    if args.bench == "robots":
        return robots.run(args, argv)
    if args.bench == "worlds":
        return worlds.run(args, argv)
    if args.bench == "asr":
        return asr.run(args, argv)
    if args.bench == "ar":
        return ar.run(args, argv)
    if args.bench == "diffusion":
        return diffusion.run(args, argv)
    if args.bench == "omni":
        return omni.run(args, argv)
    return core_overhead.run(args, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
