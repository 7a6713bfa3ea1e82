"""An AR stage fed over a stream edge by a real upstream engine process: the LLM waits
for its prompt in its scheduler (no placeholders) and answers exactly as it would have
answered the whole prompt."""

from __future__ import annotations

from procutil import assert_idle, collect, echo_stage, run, serving

from omni.config.pipeline import parse_pipeline
from omni.fixtures.tiny_models import build_tiny_qwen3, ensure_tiny_model

PROMPT = "The quick brown fox jumps over the lazy dog and then runs far away"
PARAMS = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}


def test_llm_fed_by_a_stream_edge(tmp_path):
    # a larger init than the default, whose greedy answer repeats one token whatever the
    # prompt: lost or reordered chunks must be able to change this one
    model_dir = str(build_tiny_qwen3(tmp_path / "varied", initializer_range=0.5))
    pipeline = parse_pipeline({
        "name": "fed",
        "stages": [echo_stage("up", chunks=4, delay_ms=20),
                   {"name": "llm", "engine": "ar", "model_dir": model_dir,
                    "final_output": "text"}],
        "edges": [{"from": "up", "to": "llm", "delivery": "stream"}],
    })
    direct = parse_pipeline({"name": "direct", "stages": [
        {"name": "llm", "engine": "ar", "model_dir": model_dir, "final_output": "text"}]})

    def answer(outputs) -> list[int]:
        return [t for o in outputs if o.stage == "llm" and o.data
                for t in o.data.get("token_ids", [])]

    async def body():
        async with serving(pipeline) as omni:
            fed = await collect(omni.generate({"prompt": PROMPT}, params={"llm": PARAMS}))
            assert_idle(omni)
        async with serving(direct) as omni:
            whole = await collect(omni.generate({"prompt": PROMPT}, params={"llm": PARAMS}))
        assert len(answer(fed)) == 6 and answer(fed) == answer(whole)
        assert len(set(answer(whole))) >= 3  # the answer varies: the equality means something
        async with serving(direct) as omni:  # ... and it depends on the whole prompt
            cut = await collect(omni.generate({"prompt": PROMPT[:30]}, params={"llm": PARAMS}))
        assert answer(cut) != answer(whole)
    run(body(), timeout_s=120)


def test_stage_memory_reaches_the_engine(tmp_path):
    model_dir = str(ensure_tiny_model("qwen3", tmp_path))

    def pipeline(memory):
        stage = {"name": "llm", "engine": "ar", "model_dir": model_dir, "final_output": "text"}
        if memory:
            stage["memory"] = memory
        return parse_pipeline({"name": "sized", "stages": [stage]})

    async def body():
        async with serving(pipeline(None)) as omni:
            default_blocks = omni.output_info("text")["kv_blocks"]
        async with serving(pipeline("8MiB")) as omni:
            sized_blocks = omni.output_info("text")["kv_blocks"]
            out = await collect(omni.generate({"prompt": PROMPT}, params={"llm": PARAMS}))
            assert out[-1].finished
        assert 2 <= sized_blocks < default_blocks
    run(body(), timeout_s=120)
