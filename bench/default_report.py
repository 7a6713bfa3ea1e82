"""The "good answers by default" section of default.md, from every default-LABEL.json in
the results directory (bench/default.py). default.md also holds the default server's other
measurements (python -m bench assistant, ar, asr): only the section between the markers is
rewritten, appended when it is not there yet."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ORDER = ("before", "after-v1", "after")  # known labels first, then any other in name order
BEGIN = "<!-- python -m bench default: begin (generated) -->"
END = "<!-- python -m bench default: end -->"


def _runs(out: Path) -> list[dict[str, Any]]:
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("default-*.json"))]
    rank = {label: i for i, label in enumerate(ORDER)}
    return sorted(runs, key=lambda r: (rank.get(r["label"], len(ORDER)), r["label"]))


def _row(r: dict[str, Any]) -> str:
    s = r["summary"]
    share = 100 * s["text_correct"] / s["text_total"]
    return (f"| {r['label']} ({r['commit']}) | {s['text_correct']}/{s['text_total']} "
            f"({share:.0f}%) | {s['text_tokens']['median']} / {s['text_tokens']['max']} | "
            f"{s['spoken_correct']}/{s['spoken_total']} | "
            f"{s['spoken_tokens']['median']} / {s['spoken_tokens']['max']} | "
            f"{s['audio_s']['median']} / {s['audio_s']['max']} | "
            f"{s['readme_paris']}/{s['readme_total']}, max {s['readme_audio_max_s']} s | "
            f"{'met' if s['bar_met'] else '**missed**'} |")


def _samples(r: dict[str, Any]) -> list[str]:
    spoken = r["spoken"][:3]
    return [f"- {r['label']}, spoken ({x['audio_s']:.1f} s): "
            f"\"{' '.join(x['text'].split())[:300]}\"" for x in spoken]


def write_report(out: Path) -> None:
    runs = _runs(out)
    if not runs:
        return
    hw = runs[-1]["hardware"]
    from bench.default import DESCRIPTION, QUESTIONS

    lines = [
        "## Good answers by default: the default server at its default settings", "",
        f"Machine: {hw['cpu_model']}, {hw['cores']} cores, Python {hw['python']}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", "",
        *(f"- {r['label']}: `{r['command']}` (server from {r['tree']}, commit {r['commit']}; "
          f"wall {r['wall_s']['text']} s text, {r['wall_s']['spoken']} s spoken)"
          + (f"; {r['note']}" if r.get("note") else "") for r in runs),
        "", DESCRIPTION.split("\n\n", 1)[1].strip(), "",
        "| run | text correct | text tokens median / max | spoken correct | spoken tokens "
        "median / max | audio s median / max | README command: Paris, longest audio | bar |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        *(_row(r) for r in runs), "",
        "Wall times include whatever else ran on the machine's shared cores: they are not a "
        "latency measure (`python -m bench assistant` is). A text answer's tokens are "
        "bounded by the stage's max_tokens (512 for assistant's text answers).", "",
        "Correct answers per question (text, of " + str(runs[-1]["rounds"]) + "):", "",
        "| question | " + " | ".join(r["label"] for r in runs) + " |",
        "|---|" + "---:|" * len(runs),
        *(f"| {q} | " + " | ".join(str(r["summary"]["per_question"].get(q, "")) for r in runs)
          + " |" for q, _ in QUESTIONS), "",
        "First spoken answers of the README's question:", "",
        *(line for r in runs for line in _samples(r)), ""]
    _replace_section(out / "default.md", "\n".join(lines))


def _replace_section(path: Path, section: str) -> None:
    text = path.read_text() if path.is_file() else ""
    block = f"{BEGIN}\n{section}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block
    path.write_text(text)
