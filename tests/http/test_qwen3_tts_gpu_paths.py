"""Qwen3-TTS's GPU-side paths, run eagerly on the CPU in the qwen3-tts environment (each
script runs there; qwen-tts pins transformers 4.57.3): the graphed code predictor where
the predictor is narrower than its talker (the 1.7B release: 1024 vs 2048, so qwen-tts
projects its inputs; the tiny fixture's widths are equal), and the chunk decodes padded to
a few fixed shapes (omni/models/qwen3_tts_stream.py's decode_chunks on a GPU).

Without the qwen3-tts environment (bash scripts/install_qwen3_tts_env.sh) it skips,
saying so; with OMNI_REQUIRE_QWEN3_TTS_ENV=1 (.ci/run, which builds it) it fails."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import qwen3_tts_layouts as layouts

PYTHON = layouts.PYTHON
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREDICTOR = """\
import json
import torch
from qwen_tts.core.models.configuration_qwen3_tts import (
    Qwen3TTSTalkerCodePredictorConfig, Qwen3TTSTalkerConfig)
from qwen_tts.core.models.modeling_qwen3_tts import (
    Qwen3TTSTalkerCodePredictorModelForConditionalGeneration)
from omni.models.qwen3_tts_predictor import GraphedPredictor
torch.manual_seed(0)
groups, width = 4, 48
cfg = Qwen3TTSTalkerCodePredictorConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_code_groups=groups,
    initializer_range=0.5)
cp = Qwen3TTSTalkerCodePredictorModelForConditionalGeneration(
    cfg, Qwen3TTSTalkerConfig(hidden_size=width, num_code_groups=groups)).eval()
embeds = torch.randn(3, 2, width)
with torch.inference_mode():
    theirs = cp.generate(inputs_embeds=embeds, max_new_tokens=groups - 1, do_sample=False,
                         output_hidden_states=True, return_dict_in_generate=True).sequences
    ours = GraphedPredictor(cp, width, groups, {}, 4, capture=False).generate(embeds).sequences
    cached = GraphedPredictor(cp, width, groups, {}, 4, capture=False,
                              kv_cache=True).generate(embeds).sequences
print(json.dumps({"theirs": theirs.tolist(), "ours": ours.tolist(), "cached": cached.tolist(),
                  "projected": not isinstance(cp.small_to_mtp_projection, torch.nn.Identity)}))
"""
DECODER = """\
import json, sys
import torch
from qwen_tts import Qwen3TTSModel
from omni.models.qwen3_tts_stream import decode_chunks, fixed_frames, warm_decoder
tts = Qwen3TTSModel.from_pretrained(sys.argv[1], dtype=torch.float32)
decoder = tts.model.speech_tokenizer.model.decoder
groups = tts.model.config.talker_config.num_code_groups
torch.manual_seed(0)
chunks = [(torch.randint(0, 64, (n, groups)), ctx) for n, ctx in ((5, 0), (7, 2), (12, 4))]
with torch.inference_mode():
    plain = decode_chunks(decoder, chunks)
    fixed = decode_chunks(decoder, chunks, fixed_upto=16)  # every call padded
    part = decode_chunks(decoder, chunks, fixed_upto=8)  # the 12-frame call keeps its length
calls = warm_decoder(decoder, groups, "cpu", fixed_frames(6), 3)
# the split layouts' Code2Wav stage: rows and (a causal decoder) frames padded
from omni.models.qwen3_tts_codec import Qwen3TTSCode2Wav, Qwen3TTSCode2WavRunner
c2w = Qwen3TTSCode2Wav(tts.model.speech_tokenizer, "cpu", sys.argv[1])
opts = {"first_chunk_frames": 4, "chunk_frames": 25, "left_context": 25}
runners = [Qwen3TTSCode2WavRunner(c2w, {**opts, "fixed_shapes": fixed})
           for fixed in (False, True)]
runners[1].prepare_calls(4, 0)
batch = torch.randint(0, 64, (3, groups, 9))
stage = [r.run(batch, [0, 2, 4]) for r in runners]
print(json.dumps({"lengths": [len(a) for a in plain], "fixed_lengths": [len(a) for a in fixed],
                  "part_lengths": [len(a) for a in part],
                  "diff": max(float((a - b).abs().max())
                              for a, b in zip(plain + plain, fixed + part)),
                  "peak": max(float(a.abs().max()) for a in plain), "calls": calls,
                  "stage_shape": runners[1].shapes.padded(3, 9),
                  "stage_lengths": [[len(a) for a in wavs] for wavs in stage],
                  "stage_diff": max(float((a - b).abs().max()) for a, b in zip(*stage)),
                  "stage_peak": max(float(a.abs().max()) for a in stage[0])}))
"""

MASKS = """\
import json, sys
import torch
from qwen_tts import Qwen3TTSModel
from omni.models.qwen3_tts_codec import CachedMaskDecoder
tts = Qwen3TTSModel.from_pretrained(sys.argv[1], dtype=torch.float32)
decoder = tts.model.speech_tokenizer.model.decoder
cached = CachedMaskDecoder(decoder)
groups = tts.model.config.talker_config.num_code_groups
window = decoder.config.sliding_window
torch.manual_seed(0)
diffs, peaks, built = [], [], []
with torch.inference_mode():
    for rows, frames in ((1, 1), (2, window - 1), (3, window + 5), (2, 50), (5, window + 5)):
        codes = torch.randint(0, 64, (rows, groups, frames))
        theirs, ours = decoder(codes), cached(codes)
        diffs.append(float((theirs - ours).abs().max()))
        peaks.append(float(theirs.abs().max()))
        built.append(cached.masks_built)
    # mask builders that refuse these arguments (another transformers): the model's own
    refused = CachedMaskDecoder(decoder)
    def refuse(embeds):
        raise TypeError("unexpected keyword argument 'input_embeds'")
    refused._build_masks = refuse
    codes = torch.randint(0, 64, (2, groups, window + 5))
    fallback = float((refused(codes) - decoder(codes)).abs().max())
print(json.dumps({"diffs": diffs, "peaks": peaks, "built": built, "window": window,
                  "fallback": fallback, "own_masks": refused.own_masks}))
"""

TRIM = """\
import json, sys
import torch
from qwen_tts import Qwen3TTSModel
from omni.models.qwen3_tts_codec import Qwen3TTSCode2Wav, Qwen3TTSCode2WavRunner
tts = Qwen3TTSModel.from_pretrained(sys.argv[1], dtype=torch.float32)
codec = tts.model.speech_tokenizer
# the layer scales of the fixture's ConvNeXt blocks are 1e-6 (their init): at 1 the conv
# stack's whole reach shows, so too few frames of stack context change the samples (the
# farthest frame's share is small: one frame short differs by ~1e-5, two by ~6e-4)
for module in codec.model.decoder.modules():
    if hasattr(module, "gamma"):
        torch.nn.init.ones_(module.gamma)
c2w = Qwen3TTSCode2Wav(codec, "cpu", sys.argv[1])
spf, reach = c2w.samples_per_frame, c2w.stack_context_frames
groups = tts.model.config.talker_config.num_code_groups
torch.manual_seed(0)
codes = torch.randint(0, 64, (3, groups, 40))
context = 25  # the chunk after it: frames 25..39
full = c2w.decode(codes)[:, context * spf:]
def kept(stack_context):
    skip = context - stack_context
    return c2w.decode(codes, skip)[:, stack_context * spf:]
runners = [Qwen3TTSCode2WavRunner(c2w, {"chunk_frames": 25, "left_context": 25,
                                        "trim_stack": trim}) for trim in (True, False)]
served = [r.run(codes, [context, context + 3, context + 5]) for r in runners]
# padded calls (the GPU default) trim no more than their window was warmed with: a last
# chunk of 3 frames after 25 pads to the 28-frame window (warmed after 12 frames)
padded = Qwen3TTSCode2WavRunner(c2w, {"chunk_frames": 50, "left_context": 25,
                                      "first_chunk_frames": 4, "fixed_shapes": True})
padded.prepare_calls(4, 0)
skips, decode = [], c2w.decode
c2w.decode = lambda codes, skip_frames=0: skips.append(skip_frames) or decode(codes, skip_frames)
last = [padded.run(codes[:2, :, :n], [context] * 2) for n in (28, 40)]
c2w.decode = decode
plain = [runners[1].run(codes[:2, :, :n], [context] * 2) for n in (28, 40)]
print(json.dumps({"reach": reach, "peak": float(full.abs().max()),
                  "exact": float((kept(reach) - full).abs().max()),
                  "short": float((kept(reach - 2) - full).abs().max()),
                  "skips": [r.stack_skip([context, context + 3]) for r in runners],
                  "served": max(float((a - b).abs().max()) for a, b in zip(*served)),
                  "lengths": [[len(a) for a in wavs] for wavs in served],
                  "padded_skips": skips,
                  "padded": max(float((a - b).abs().max()) for x, y in zip(last, plain)
                                for a, b in zip(x, y)),
                  "padded_lengths": [[len(a) for a in wavs] for wavs in last]}))
"""

CAPTURE = """\
import json, sys, time
import torch
from omni.engines.ar.feedback import FeedbackAREngine
from omni.models import qwen3_tts_stream
engine = FeedbackAREngine("qwen3_tts_ar_talker", sys.argv[1], device="cpu", dtype="float32",
                          options={"max_num_seqs": 2, "kv_cache_mb": 64})
feed = engine.feed
config = feed.model.config
def prompt(text):
    st = feed.new_state(None, torch.device("cpu"))
    feed.take(st, {"text": text})
    st.closed = True
    return feed.prefill(st, feed.speakers[0])[0], st.trailing, st.pad
texts = ["The ship sailed north.", "Wheat, wool and iron went with it."]
snapshot = [prompt(t) for t in texts]
import omni.models.qwen3_tts_talker as talker_module
from contextlib import nullcontext
plain_snapshot = qwen3_tts_stream.snapshot_config
talker_module.snapshot_config = lambda model: nullcontext()  # the feed without the snapshot
plain = [prompt(t) for t in texts]
talker_module.snapshot_config = plain_snapshot
try:  # restored when the call inside fails
    with plain_snapshot(feed.model):
        assert feed.model.config is not config
        raise KeyError("inside")
except KeyError:
    pass
readonly = False
with plain_snapshot(feed.model):
    try:
        feed.model.config.tts_pad_token_id = 0
    except AttributeError:
        readonly = True
print(json.dumps({"equal": all(torch.equal(a, b) for x, y in zip(snapshot, plain)
                               for a, b in zip(x, y)),
                  "lengths": [len(x[0]) for x in snapshot],
                  "restored": feed.model.config is config, "readonly": readonly}))
"""


@pytest.fixture(scope="module")
def release():
    return layouts.release_dir()


def _run(script: str, *args: str) -> dict:
    """The script's last line of output (JSON), run in the qwen3-tts environment."""
    out = subprocess.run([PYTHON, "-c", script, *args], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "1",
                                          "PYTHONPATH": ROOT})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_graphed_predictor_projects_into_its_own_width(release):
    """A code predictor narrower than its talker (qwen-tts's small_to_mtp_projection):
    the graphed loop's greedy codes equal the predictor's own generate, for a batch, in
    both forms (each pass recomputing the frame's positions, or reading them from a static
    KV cache)."""
    got = _run(PREDICTOR)
    assert got["projected"]
    assert len({c for row in got["theirs"] for c in row}) > 3  # the codes vary
    assert got["ours"] == got["theirs"]
    assert got["cached"] == got["theirs"]


def test_fixed_shape_chunk_decodes_equal_the_unpadded_ones(release):
    """Chunks of several lengths, with left context, decoded in calls padded to powers of
    two of frames and rows (all of them, or only those within fixed_upto): each chunk's audio equals its unpadded decode (float noise of
    other batch shapes), and warm_decoder meets every such shape once; so do the split
    layouts' Code2Wav stage's padded calls (omni/models/code2wav_shapes.py)."""
    got = _run(DECODER, str(release))
    assert got["peak"] > 0.01  # not silence
    assert got["lengths"] == got["fixed_lengths"] == got["part_lengths"] == [9600, 9600, 15360]
    assert got["diff"] < 1e-4
    assert got["calls"] == 4 * 3  # frames 1, 2, 4, 8 (chunks up to 6) x rows 1, 2, 4
    # the Code2Wav stage's runner: 3 rows of 9 frames decoded as 4 of 12 (its windows are
    # 4, 12, 28, 50), each row's audio after its context as decoded unpadded
    assert got["stage_shape"] == [4, 12]
    assert got["stage_peak"] > 0.01
    assert got["stage_lengths"] == [[1920 * (9 - c) for c in (0, 2, 4)]] * 2
    assert got["stage_diff"] < 1e-4


def test_the_decoder_with_cached_masks_is_the_decoders_own(release):
    """Qwen3-TTS's Code2Wav decoder with its pre-transformer's masks built once per length
    (omni/models/qwen3_tts_codec.py CachedMaskDecoder): the same audio, bit for bit, as
    the decoder's own forward, for lengths within and beyond its sliding window, and a
    length met again (with other rows) builds no new masks; builders that refuse its
    arguments leave the masks to the model."""
    got = _run(MASKS, str(release))
    assert got["window"] + 5 < 50
    assert min(got["peaks"][1:]) > 0.01  # not silence
    assert got["diffs"] == [0.0] * 5
    assert got["built"] == [1, 2, 3, 4, 4]  # the fifth call's length was met by the third
    # where the mask builders refuse its arguments it falls back to the model's own masks
    assert got["own_masks"] and got["fallback"] == 0.0


def test_the_code2wav_stack_over_its_reach_gives_the_chunks_samples(release):
    """The Code2Wav stage's conv stack run only over the frames a chunk's samples read
    (stack_context_frames of its 25-frame context; the pre-transformer still reads all
    25): the same samples as the whole decode within float noise, while two frames less
    change them; the stage's runner trims by the fewest context of its rows."""
    got = _run(TRIM, str(release))
    assert got["reach"] == 10  # the release's and the fixture's conv stacks reach alike
    assert got["peak"] > 0.01  # not silence
    assert got["exact"] < 1e-5
    assert got["short"] > 1e-4
    assert got["skips"] == [15, 0]  # trim_stack on, off
    assert got["served"] < 1e-4
    assert got["lengths"] == [[1920 * 15, 1920 * 12, 1920 * 10]] * 2
    # padded (the GPU default): the 3-frame last chunk trims 2 (its window's warmed context
    # 12 less the reach), the 15-frame one 15; the same samples as the unpadded whole stack
    assert got["padded_skips"] == [2, 15]
    assert got["padded"] < 1e-4
    assert got["padded_lengths"] == [[1920 * 3] * 2, [1920 * 15] * 2]


def test_the_talkers_prompt_is_the_same_through_the_config_snapshot(release):
    """The AR talker's prompt capture reads qwen-tts's config through a snapshot
    (qwen3_tts_stream.snapshot_config: transformers' config reads were half of a request's
    prompt building): the same prompt, trailing text and pad tensors as without it, the
    model's own config back after the block (also when it raises), read-only inside."""
    got = _run(CAPTURE, str(release))
    assert got["equal"]
    assert got["lengths"][0] != got["lengths"][1]  # two different prompts
    assert got["restored"] and got["readonly"]


OPTION_ERRORS = """\
import json, sys
from omni.engines.ar.feedback import FeedbackAREngine
from omni.engines.base import EngineLoadError
errors = {}
for options in ({"predictor_compile_unit": "layers"}, {"load_format": "dummy"}):
    try:
        FeedbackAREngine("qwen3_tts_ar_talker", sys.argv[1], device="cpu", dtype="float32",
                         options={"max_num_seqs": 2, "kv_cache_mb": 64, **options})
    except EngineLoadError as e:
        errors[next(iter(options))] = str(e)
print(json.dumps(errors))
"""


def test_bad_talker_options_fail_the_load_naming_them(release):
    """The predictor's compile unit is 'pass' or 'layer'; dummy weights are not this
    adapter's (it loads qwen-tts's own model): each a load error that says so."""
    got = _run(OPTION_ERRORS, str(release))
    assert "predictor_compile_unit: 'pass' or 'layer', not 'layers'" in got["predictor_compile_unit"]
    assert "adapter loads its own weights" in got["load_format"]
