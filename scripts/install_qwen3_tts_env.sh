#!/usr/bin/env bash
# The `qwen3-tts` stage environment: Qwen3-TTS's own model code (the `qwen-tts` package),
# which pins transformers 4.57.3 and does not import under the server's 5.x
# (docs/models.md). Built by scripts/make_stage_env.sh as $OMNI_ENVS_DIR/qwen3-tts (default
# ~/.cache/omni/envs/qwen3-tts); a stage with `env: qwen3-tts` runs in it.
#   bash scripts/install_qwen3_tts_env.sh
# What goes in: scripts/qwen3_tts_env.txt (transformers 4.57.3 and the libraries qwen-tts's
# modules import at import time), then qwen-tts and torchaudio WITHOUT their requirements:
#   - qwen-tts's declared ones include gradio (its demo) and accelerate (unused here);
#   - torchaudio: qwen-tts's 25 Hz tokenizer (imported by the package, used by no 12 Hz
#     release) does `import torchaudio.compliance.kaldi`, pure Python; PyPI's torchaudio is
#     a CUDA build pinned to another torch, so only its Python part is kept: its compiled
#     libraries are removed, and torchaudio then imports without them (it treats missing
#     library files as "not built", torchaudio/_extension/utils.py _load_lib).
set -euo pipefail
cd "$(dirname "$0")/.."
envs=${OMNI_ENVS_DIR:-$HOME/.cache/omni/envs}
py=$envs/qwen3-tts/bin/python
stamp=$envs/qwen3-tts/omni-qwen3-tts.txt
want=$(cat scripts/qwen3_tts_env.txt "$0" | sha256sum | cut -c1-16)
if [[ -x $py && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  # built from these files already: only omni itself is brought up to this checkout
  $py -m pip install -q --no-deps --force-reinstall . 2>&1 | grep -v WARNING || true
else
  bash scripts/make_stage_env.sh qwen3-tts scripts/qwen3_tts_env.txt
  $py -m pip install -q --no-deps qwen-tts==0.1.1 torchaudio==2.11.1 2>&1 | grep -v WARNING || true
  rm -f "$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"/torchaudio/lib/*.so
  echo "$want" >"$stamp"
fi
$py -c "import qwen_tts, omni.engines.proc.main; from qwen_tts import Qwen3TTSModel" 2>/dev/null \
  || { $py -c "import qwen_tts; from qwen_tts import Qwen3TTSModel"; exit 1; }
echo "install_qwen3_tts_env: $py ($($py -c 'import transformers, importlib.metadata as m; print("qwen-tts", m.version("qwen-tts"), "transformers", transformers.__version__)' 2>/dev/null))"
