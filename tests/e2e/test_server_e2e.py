"""`python -m omni.server` as a subprocess, driven the way a user drives it."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from omni.fixtures.speech import SENTENCES

SLOW = """
name: slow
stages:
  - name: only
    engine: echo
    final_output: text
    params: {chunks: 8}
    options: {delay_ms: 150}
"""


class Server:
    """A server subprocess whose log is collected on a thread."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "omni.server", "--port", "0", *args],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self.port: int | None = None
        self.listening = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            match = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                self.listening.set()

    def wait_listening(self, timeout: float = 60.0) -> int:
        assert self.listening.wait(timeout), "server did not start:\n" + self.log()
        return self.port

    def log(self) -> str:
        return "".join(self.lines)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        """SIGTERM (the server cleans up after itself), SIGKILL only if that hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _children(pid: int) -> set[int]:
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.add(int(stat.parent.name))
    return kids


def _gone_within(pids: set[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigterm_drains_in_flight_and_leaves_nothing(tmp_path: Path) -> None:
    slow = tmp_path / "slow.yaml"
    slow.write_text(SLOW)
    # the server's TMPDIR: its IPC socket dirs go here. A short path: a socket's path may
    # not pass 107 characters, which pytest's tmp_path under xdist workers (.ci/run) did
    runtime = Path(tempfile.mkdtemp(prefix="omni-rt-"))
    server = Server("--pipeline", "echo", "--pipeline", str(slow), "--drain-timeout", "20",
                    env={"TMPDIR": str(runtime)})
    try:
        server.wait_listening()
        assert _get(server.url("/health"))[0] == 200
        ids = [m["id"] for m in _get(server.url("/v1/models"))[1]["data"]]
        assert ids == ["echo", "slow"]
        with urllib.request.urlopen(server.url("/metrics"), timeout=10) as resp:
            metrics = resp.read().decode()
        # the server froze what loading left and reports its own collections (omni/heap.py)
        assert 'omni_gc_pause_seconds_total{process="server"}' in metrics
        assert 'omni_gc_pause_max_seconds{process="server"}' in metrics
        assert list(runtime.glob("omni-ipc-*")), "IPC dirs should live under TMPDIR"
        children = _children(server.proc.pid)
        assert len(children) >= 2, "expected one engine process per stage"
        result: dict = {}
        body = {"model": "slow", "prompt": "drain me please"}
        worker = threading.Thread(
            target=lambda: result.update(zip(("status", "body"),
                                             _post(server.url("/v1/completions"), body), strict=True)))
        worker.start()
        time.sleep(0.4)  # let the request get into the engine before the signal
        server.proc.send_signal(signal.SIGTERM)
        worker.join(30)
        assert result["status"] == 200, result
        assert result["body"]["choices"][0]["text"] == "drain me please"
        assert server.proc.wait(30) == 0, server.log()
        # the multiprocessing resource tracker exits just after its parent; allow a moment
        assert _gone_within(children, 5.0), [p for p in children if Path(f"/proc/{p}").exists()]
        assert not list(runtime.iterdir()), "IPC socket dirs left behind"
    finally:
        server.stop()
        shutil.rmtree(runtime, ignore_errors=True)


def test_stage_that_fails_to_load_fails_start_with_its_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages:\n  - {name: broken, engine: echo, final_output: text, "
                   "options: {fail_load: 'weights are corrupt'}}\n")
    server = Server("--pipeline", str(bad))
    try:
        code = server.proc.wait(60)
        time.sleep(0.2)  # the log reader thread may still hold the last lines
        assert code == 2
        assert "weights are corrupt" in server.log()
        assert "broken" in server.log()
    finally:
        server.stop()


def test_bad_pipeline_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text("stages:\n  - {name: x, engine: echo, final_output: text, replica: 2}\n")
    out = subprocess.run([sys.executable, "-m", "omni.server", "--pipeline", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "typo.yaml" in out.stderr and "replicas" in out.stderr


def test_help_explains_every_flag() -> None:
    out = subprocess.run([sys.executable, "-m", "omni.server", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--model", "--pipeline", "--served-model-name", "--host", "--port",
                 "--api-key", "--dtype", "--max-request-mb", "--drain-timeout", "--cache-dir",
                 "--max-speech-chars", "--heartbeat-s", "--hang-timeout-s"):
        assert flag in out.stdout


def test_errors_are_openai_objects() -> None:
    server = Server("--pipeline", "echo")  # one server start for both paths
    try:
        server.wait_listening()
        for path in ("/v1/nope", "/v1/images/generations"):
            status, body = _post(server.url(path), {"model": "echo", "input": "x"})
            assert status == 404, path
            assert set(body["error"]) == {"message", "type", "param", "code"}, path
    finally:
        server.stop()





def _stage_count(server: Server, stage: str) -> float:
    """Requests the stage finished, from /metrics (omni_stage_latency_seconds_count)."""
    with urllib.request.urlopen(server.url("/metrics"), timeout=10) as resp:
        text = resp.read().decode()
    match = re.search(r'omni_stage_latency_seconds_count\{pipeline="assistant",stage="'
                      + stage + r'"\} ([0-9.e+]+)', text)
    return float(match.group(1)) if match else 0.0


def test_default_server_answers_with_real_weights() -> None:
    """No flags: the spoken assistant and its three models alone (SmolLM2 converted into
    the model cache on first start; the CI run's server start did that already,
    $OMNI_CACHE_DIR), real weights; asked by voice, it answers by voice."""
    import openai

    server = Server()
    try:
        server.wait_listening(timeout=240)
        models = _get(server.url("/v1/models"))[1]["data"]
        assert [m["id"] for m in models] == ["assistant", "smollm2", "piper", "whisper"]
        assert not any(m["random_weights"] for m in models)
        assert [m["input_modalities"] for m in models] == [
            ["text", "audio"], ["text"], ["text"], ["audio"]]
        assert [m.get("view_of") for m in models] == [None] + ["assistant"] * 3
        # SmolLM2's card sampling (its converted generation_config.json) for every text
        # answer; the assistant's are told to be brief, and a spoken one is short
        speaking = models[0]["defaults"]["audio"]["llm"]
        assert speaking["temperature"] == 0.2 and speaking["top_p"] == 0.9
        assert speaking["max_tokens"] == 40 and "sentences" in speaking["system_prompt"]
        assert models[0]["defaults"]["text"]["llm"]["system_prompt"] == \
            speaking["system_prompt"]
        assert models[1]["defaults"] == {"text": {"llm": {
            "temperature": 0.2, "top_p": 0.9, "max_tokens": 512}}}
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="none")
        answer = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=40, messages=[{
                "role": "user",
                "content": "What is the capital of France? Answer in one sentence."}])
        assert "Paris" in answer.choices[0].message.content, answer
        assert answer.choices[0].finish_reason == "stop"
        other = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=40, messages=[{
                "role": "user", "content": "Name a primary color. Answer in one word."}])
        assert other.choices[0].message.content != answer.choices[0].message.content
        # a real voice out of the box, under an OpenAI voice name
        speech = client.audio.speech.create(model="piper", voice="alloy",
                                            input="The weather is nice today.",
                                            response_format="wav")
        wav = speech.read()
        assert wav[:4] == b"RIFF" and len(wav) > 44 + 22050  # over half a second of speech
        heard = client.audio.transcriptions.create(model="whisper", file=("hi.wav", wav))
        assert heard.text.strip(" .").lower() == "the weather is nice today", heard
        # Whisper hears the voice: ten sentences, word error rate, streamed == whole
        jiwer = pytest.importorskip("jiwer")
        norm = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(),
                              jiwer.RemoveMultipleSpaces(), jiwer.Strip()])
        heard_all = []
        for sentence in SENTENCES:
            clip = client.audio.speech.create(model="piper", voice="alloy", input=sentence,
                                              response_format="wav").read()
            heard_all.append(client.audio.transcriptions.create(
                model="whisper", file=("s.wav", clip)).text)
        assert len(set(heard_all)) == len(SENTENCES)
        wer = jiwer.wer([norm(x) for x in SENTENCES], [norm(x) for x in heard_all])
        assert wer <= 0.10, list(zip(SENTENCES, heard_all, strict=True))
        events = list(client.audio.transcriptions.create(model="whisper", stream=True,
                                                         file=("s.wav", clip)))
        assert events[-1].type == "transcript.text.done" and events[-1].text == heard_all[-1]
        assert "".join(e.delta for e in events[:-1]) == heard_all[-1]
        # a text question to the assistant runs no Whisper step
        asr_before = _stage_count(server, "asr")
        text_answer = client.chat.completions.create(
            model="assistant", temperature=0, max_tokens=40,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in text_answer.choices[0].message.content
        assert _stage_count(server, "asr") == asr_before
        question = client.audio.speech.create(
            model="piper", voice="alloy", response_format="wav",
            input="What is the capital of France? Answer in one sentence.").read()
        spoken = client.chat.completions.create(
            model="assistant", temperature=0, max_tokens=40, modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"}, messages=[{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {
                    "data": base64.b64encode(question).decode(), "format": "wav"}}]}])
        answer = base64.b64decode(spoken.choices[0].message.audio.data)
        heard = client.audio.transcriptions.create(model="whisper", file=("a.wav", answer))
        assert "paris" in heard.text.lower(), (heard, spoken.choices[0].message.audio.transcript)
        status, body = _post(server.url("/v1/images/generations"), {"prompt": "x"})
        assert status == 404 and "smollm2" in body["error"]["message"]
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        # a stop says its own two lines and nothing else: no resource tracker warning of a
        # semaphore (tqdm's lock in the Whisper engine did that), no triton "nanobind:
        # leaked" report (the SmolLM2 conversion in the server process did that)
        server.reader.join(10)  # it ends at the closed pipe: every line is in
        after = "".join(server.lines).split("stopping: draining")[-1].splitlines()[1:]
        assert len(after) == 1 and after[0].endswith("INFO omni.server: stopped"), after
    finally:
        server.stop()
