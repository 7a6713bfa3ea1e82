"""The benchmark entry points import and explain their flags (they are not run here)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [["-m", "bench", "--help"], ["-m", "bench", "core", "--help"],
                                  ["-m", "bench", "startup", "--help"],
                                  ["-m", "bench", "tts", "--help"],
                                  ["-m", "bench", "ar", "--help"],
                                  ["-m", "bench", "omni", "--help"],
                                  ["-m", "bench.shm_throughput", "--help"],
                                  ["-m", "bench.cuda_ipc", "--help"],
                                  ["-m", "bench.ar_step", "--help"],
                                  ["-m", "bench.decode_fill", "--help"]])
def test_bench_help(args: list[str]) -> None:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--" in out.stdout and "usage" in out.stdout.lower()


def test_ar_roofline_bytes() -> None:
    """The decode roofline's byte count on the published Qwen3-8B / 30B-A3B shapes."""
    from bench.ar_report import distinct_experts, model_summary, step_bytes

    base = {"vocab_size": 151936, "head_dim": 128, "tie_word_embeddings": False}
    dense = model_summary({**base, "model_type": "qwen3", "hidden_size": 4096,
                           "intermediate_size": 12288, "num_hidden_layers": 36,
                           "num_attention_heads": 32, "num_key_value_heads": 8})
    moe = model_summary({**base, "model_type": "qwen3_moe", "hidden_size": 2048,
                         "intermediate_size": 6144, "moe_intermediate_size": 768,
                         "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                         "num_attention_heads": 32, "num_key_value_heads": 4})
    assert dense["params"] == pytest.approx(8.19e9, rel=1e-3)
    assert moe["params"] == pytest.approx(30.53e9, rel=1e-3)
    assert moe["active_params"] == pytest.approx(3.35e9, rel=0.01)
    assert distinct_experts(128, 8, 1) == pytest.approx(8)
    assert distinct_experts(128, 8, 32) == pytest.approx(128 * (1 - (120 / 128) ** 32))
    # batch 1: every weight but the embedding table (one row of it is read), bf16
    one = step_bytes(dense, 1, 0, 2)
    assert one["weights"] == pytest.approx(2 * (dense["params"] - 151936 * 4096 + 4096))
    assert one["kv"] == 2 * 36 * 8 * 128 * 2  # the step's own K and V, written
    # at batch 32 the MoE reads ~112 of 128 experts per layer: most of the model
    assert 0.8 < step_bytes(moe, 32, 0, 2)["weights"] / (2 * moe["params"]) < 0.95
    assert step_bytes(moe, 1, 0, 2)["weights"] == pytest.approx(
        2 * (moe["active_params"] - 151936 * 2048 + 2048))
    assert step_bytes(dense, 4, 191, 2)["kv"] == 4 * 192 * 2 * 36 * 8 * 128 * 2
    # a multimodal release: the text decoder nested beside a speech decoder (smaller vocab)
    text = {**base, "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "intermediate_size": 6144}
    speech = {**text, "vocab_size": 3072, "num_hidden_layers": 20}
    nested = model_summary({"model_type": "omni", "a_config": {"text_config": speech},
                            "b_config": {"text_config": text, "audio_config": {}}})
    assert (nested["layers"], nested["vocab"]) == (48, 151936)


def test_random_omni_builder_writes_the_release_names(tmp_path) -> None:
    """scripts/build_random_omni.py: the real-size Qwen3-Omni it would write (meta device,
    no weights) has exactly the tensor names of a save_pretrained of the same class, and
    the shapes of the 30B-A3B language models."""
    import math
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import build_random_omni as b
    from transformers import Qwen3OmniMoeConfig

    tok = b.write_tokenizer(tmp_path)
    assert tok.convert_tokens_to_ids("<|im_start|>") == 151644  # where the release has it
    tensors = b.disk_tensors(Qwen3OmniMoeConfig(**b.configs(tok, 2)), torch.bfloat16)
    b.check_against_tiny(tensors)  # raises on any difference
    assert tensors["thinker.lm_head.weight"] == (152064, 2048)
    assert tensors["thinker.model.layers.1.mlp.experts.127.down_proj.weight"] == (2048, 768)
    assert tensors["talker.model.layers.19.mlp.experts.0.gate_proj.weight"] == (384, 1024)
    talker = sum(math.prod(s) for n, s in tensors.items() if n.startswith("talker."))
    assert 3.2e9 < talker < 3.4e9


def test_random_omni_builder_qwen2_5_family(tmp_path) -> None:
    """build_random_omni.py --family qwen2_5_omni: Qwen2.5-Omni-7B's names and shapes."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import build_random_omni as b
    from transformers import Qwen2_5OmniConfig

    tok = b.write_tokenizer(tmp_path, "qwen2_5_omni")
    assert tok.convert_tokens_to_ids("<|AUDIO|>") == 151646  # where the release has it
    config = Qwen2_5OmniConfig(**b.configs(tok, 2, "qwen2_5_omni"))
    tensors = b.disk_tensors(config, torch.bfloat16, "qwen2_5_omni")
    b.check_against_tiny(tensors, "qwen2_5_omni")  # raises on any difference
    assert tensors["thinker.lm_head.weight"] == (152064, 3584)
    assert tensors["talker.model.layers.23.mlp.down_proj.weight"] == (896, 4864)


def test_ar_engine_options_go_into_a_preset_copy(tmp_path) -> None:
    import yaml

    from bench.ar import _engine_options
    from bench.ar_ours import target_for
    from omni.fixtures.tiny_models import ensure_tiny_model

    options = _engine_options(["attention_kernel=sdpa", "cuda_graphs=false", "max_num_seqs=8"])
    assert options == {"attention_kernel": "sdpa", "cuda_graphs": False, "max_num_seqs": 8}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        _engine_options(["attention_kernel"])
    model = str(ensure_tiny_model("qwen3", tmp_path / "models"))
    flag, path = target_for(model, "cpu", tmp_path, options)
    stage = yaml.safe_load(open(path))["stages"][0]
    assert flag == "--pipeline" and stage["options"] == options
    assert stage["model_dir"] == model and stage["devices"] == ["cpu"]
    assert target_for(model, "cpu", tmp_path) == ("--model", model)


def test_ar_step_measures_every_step_order(tmp_path) -> None:
    """bench.ar_step on the tiny model (CPU): one row per (batch, step order), each with
    its phases; the chained order really chains."""
    import json

    from bench.ar_step import main
    from omni.fixtures import build_tiny_qwen3

    model = build_tiny_qwen3(tmp_path / "q", initializer_range=0.5)
    assert main(["--model", str(model), "--batch", "1,3", "--steps", "4",
                 "--prompt-len", "16", "--out", str(tmp_path), "--tag", "t"]) == 0
    data = json.loads((tmp_path / "ar-step-t.json").read_text())
    assert [(r["batch"], r["mode"]) for r in data["rows"]] == [
        (b, m) for b in (1, 3) for m in ("off", "on", "chain")]
    for row in data["rows"]:
        assert row["step"] > 0 and row["forward"] > 0 and row["replay"] is None
        assert row["schedule"] == 0 if row["mode"] == "chain" else row["schedule"] > 0
    assert "| 3 | chain |" in (tmp_path / "ar-step-t.md").read_text()


def test_omni_report_splits_waits_and_steps_by_stage() -> None:
    from bench.omni_report import _per_stage

    stages = _per_stage({"latency": 10.0, "step_sum:talker": 0.5, "step_count:talker": 50,
                         "wait_sum:talker": 0.2, "wait_count:talker": 4,
                         "step_sum:code2wav": 2.0, "step_count:code2wav": 10,
                         "preemptions:talker": 3, "hop_out_sum:talker": 0.4,
                         "first_sum:talker": 0.6, "first_count:talker": 4})
    assert stages["talker"] == {"steps": 50, "step_mean_s": 0.01, "wait_mean_s": 0.05,
                                "wait_share": 0.02, "preemptions": 3,
                                "hop_in_mean_s": 0.0, "hop_out_mean_s": 0.1,
                                "gc_s": 0.0, "gc_pauses": 0.0, "first_output_mean_s": 0.15}
    assert stages["code2wav"]["step_mean_s"] == 0.2 and stages["code2wav"]["wait_share"] == 0


def test_omni_summary_counts_failed_requests() -> None:
    """A failed request is counted (with the first error) and left out of the percentiles,
    and the table and targets say so: one failure must not lose the level's numbers."""
    from bench.omni_report import _table, summarize

    ok = {"ttft_s": 0.1, "ttfp_s": 0.2, "e2el_s": 1.0, "rtf": 0.5, "underrun_s": 0.0,
          "audio_s": 2.0, "prompt_tokens": 12, "completion_tokens": 30}
    level = summarize({"runs": [ok, {"error": "stream error: out of memory"}, dict(ok)],
                       "transit": {"latency": 2.0}})
    assert level["requests"] == 3 and level["failed"] == 1
    assert level["first_error"] == "stream error: out of memory"
    assert level["ttfp_s"]["n"] == 2 and level["audio_s"] == 2.0
    assert level["prompt_tokens"] == [12]
    assert "| full | 8 | 3 | 1 |" in "\n".join(_table({"full": {"8": level}}))


def test_omni_sides_change_stage_options(tmp_path) -> None:
    """bench omni --sides stream+STAGE.OPTION=VALUE: the side's pipeline file is the
    preset's with that option set (YAML value), its files get plain names, bad ones exit."""
    import argparse

    import yaml

    from bench.omni import file_safe, pipeline_file
    from omni.config.pipeline import load_pipeline_file

    args = argparse.Namespace(memory="", sides="stream,full", device="cpu", thinker_tokens=4,
                              talker_frames=8)
    side = "full+code2wav.max_batch_frames=128+talker.cuda_graphs=false"
    data = yaml.safe_load(pipeline_file("/m", side, args, tmp_path).read_text())
    stages = {s["name"]: s for s in data["stages"]}
    assert stages["code2wav"]["options"]["max_batch_frames"] == 128
    assert stages["talker"]["options"]["cuda_graphs"] is False
    assert {e["delivery"] for e in data["edges"]} == {"full"}
    assert not any("max_lead" in e for e in data["edges"])  # the preset's lead: stream only
    load_pipeline_file(pipeline_file("/m", "full", args, tmp_path))  # a valid pipeline
    led = yaml.safe_load(pipeline_file("/m", "stream+thinker->talker.max_lead=null", args,
                                       tmp_path).read_text())
    assert [e.get("max_lead", "unset") for e in led["edges"]] == [None, "unset"]
    placed = yaml.safe_load(pipeline_file("/m", "stream+talker.devices=cuda:1+talker.memory=8GiB",
                                          args, tmp_path).read_text())
    talker = next(s for s in placed["stages"] if s["name"] == "talker")
    assert talker["devices"] == "cuda:1" and talker["memory"] == "8GiB"  # stage fields
    assert not {"devices", "memory"} & set(talker["options"])
    assert file_safe(side) == "full_code2wav.max_batch_frames_128_talker.cuda_graphs_false"
    for bad in ("stream+code2wav.max_batch_frames", "stream+vocoder.x=1", "fast"):
        with pytest.raises(SystemExit):
            pipeline_file("/m", bad, args, tmp_path)
