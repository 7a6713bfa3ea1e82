"""What tests/lerobot/ needs from omni's own environment (OMNI_PYTHON), run as a script:
LeRobot's environment has transformers 4 (LeRobot 0.4.4's), which has no π0, and omni's
has no LeRobot. Inputs and outputs go through torch.save files.

  build VARIANT DIR        a tiny π0 (omni.fixtures.tiny_pi0.VARIANTS) into DIR
  sample DIR IN OUT        transformers' PI0ForConditionalGeneration.sample_actions on
                           LeRobot's processed inputs (IN: a list of dicts), raw outputs
  resize SIDE IN OUT       omni's resize_pad (policy_images.py) of uint8 (3, H, W) frames
  normalize DIR IN OUT     omni's reading of DIR's statistics (lerobot_layout.py): IN's
                           states normalised, its action chunks un-normalised
  serve                    the commands above, one JSON list [COMMAND, *ARGS] per stdin
                           line, each answered on stdout by {"error": null} or the
                           failure's message: one interpreter start (torch and
                           transformers imports, ~4 s each) for the whole test module
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path

import torch


def build(variant: str, out_dir: str) -> None:
    from omni.fixtures.tiny_pi0 import build_tiny_pi0

    build_tiny_pi0(out_dir, variant=variant)


@torch.no_grad()
def sample(model_dir: str, inputs: str, outputs: str) -> None:
    """Each input holds LeRobot's tensors: pixel_values (1, cameras, 3, S, S) in [-1, 1],
    its language tokens and mask (1, L), its normalised state padded to max_state_dim,
    and the noise. The prefix is laid out as LeRobot's PI0Pytorch.embed_prefix lays it:
    every camera's image tokens, then the language tokens, pads masked."""
    from transformers import PI0ForConditionalGeneration

    model = PI0ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    vision = model.config.vlm_config.vision_config
    per_image = (vision.image_size // vision.patch_size) ** 2
    image_token = model.config.vlm_config.image_token_id
    results = []
    for item in torch.load(inputs):
        cameras = item["pixel_values"].shape[1]
        images = torch.full((1, cameras * per_image), image_token)
        ids = torch.cat([images, item["tokens"].long()], dim=1)
        mask = torch.cat([torch.ones_like(images), item["token_mask"].long()], dim=1)
        results.append(model.sample_actions(
            state=item["state"], input_ids=ids, pixel_values=item["pixel_values"],
            noise=item["noise"], attention_mask=mask,
            pixel_attention_mask=torch.ones(1, cameras, dtype=torch.bool)))
    torch.save(results, outputs)


def resize(side: str, inputs: str, outputs: str) -> None:
    from omni.models.policy_images import resize_pad

    torch.save([resize_pad(frame, int(side)) for frame in torch.load(inputs)], outputs)


def normalize(model_dir: str, inputs: str, outputs: str) -> None:
    from omni.models.lerobot_layout import read_release

    release = read_release(model_dir)
    data = torch.load(inputs)
    torch.save({"states": [release.state.normalize(x) for x in data["states"]],
                "actions": [release.actions.unnormalize(x) for x in data["actions"]]}, outputs)


COMMANDS = {"build": build, "sample": sample, "resize": resize, "normalize": normalize}


def serve() -> None:
    """Answer commands until stdin closes; a failing one reports its message and the
    traceback, and the next still runs."""
    for line in sys.stdin:
        command, *args = json.loads(line)
        try:
            COMMANDS[command](*args)
            answer = {"error": None}
        except Exception as err:  # noqa: BLE001 - the test reads the message
            answer = {"error": f"{type(err).__name__}: {err}",
                      "traceback": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


class OmniSide:
    """The test's end of ``serve`` (run in LeRobot's environment): this script started
    once in omni's, each command a line to it and an answer back."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "w") as err:
            self.process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True)

    def __call__(self, *args: str, check: bool = True) -> str | None:
        """Run one command; its error message (None when it succeeded)."""
        self.process.stdin.write(json.dumps(args) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith('{"error"'):  # anything else a library printed is skipped
                answer = json.loads(line)
                assert answer["error"] is None or not check, answer.get("traceback")
                return answer["error"]
        raise AssertionError(f"omni_side.py exited:\n{self.log.read_text()[-4000:]}")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(30)


if __name__ == "__main__":
    torch.set_num_threads(1)
    command, *args = sys.argv[1:]
    serve() if command == "serve" else COMMANDS[command](*args)
