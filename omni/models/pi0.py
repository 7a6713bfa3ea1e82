"""π0 (Physical Intelligence) on transformers' PI0ForConditionalGeneration, as a policy
for the policy engine (omni/engines/policy/engine.py).

- Loading: a release in LeRobot's layout (lerobot_layout.py); transformers reads its
  config.json as a PI0Config and renames LeRobot's weight names itself.
- Inputs, per observation: the release declares its cameras and state width, and
  policy_inputs.py reads them under the robot's keys (LIBERO, DROID, ALOHA or LeRobot's
  own, or the stage's mapping), refusing whatever does not fit; each camera
  fitted and padded to the model's image size and normalised as PI0ImageProcessor does;
  the prompt + "\\n" tokenized with <bos>, cut and right-padded to the release's
  ``tokenizer_max_length`` (48) as LeRobot's tokenizer step does, after the image tokens
  (256 per camera on the real model), pads masked; the state normalised with the release's
  statistics and zero-padded to ``max_state_dim``. Padding the prompt to a fixed length
  gives every observation with the same camera count the same prefix length, so robots
  with different prompts share the prefix pass and every step.
- The split (engine contract ``Policy``): `prefix` is sample_actions' VLM pass (image and
  prompt embeddings -> a KV cache); `velocity` is its per-step ``self(state, noise,
  timestep, cache)`` on a cache made of each robot's own prefix KV, concatenated; the
  engine takes the Euler steps. tests/proc/test_policy_engine.py checks the result equals
  ``sample_actions`` for the same noise.
- Outputs: the chunk cut to the robot's action width (the release's action feature) and
  un-normalised with its statistics.
- On CUDA both passes replay CUDA graphs (pi0_graphs.py), captured at load for the
  release's camera count; eager wherever a graph cannot serve.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from omni.engines.base import EngineLoadError, PolicyJob
from omni.models.causal_lm import cache_keyword
from omni.models.lerobot_layout import LeRobotRelease, read_release
from omni.models.policy_images import resize_pad
from omni.models.policy_inputs import ObservationLayout, prompt_text
from omni.wire.arrays import pack_tree, unpack_tree

log = logging.getLogger("omni.models.pi0")

PROMPT_CACHE = 64  # tokenized prompts kept per policy (robots repeat theirs every call)


class PI0Policy:
    """options: observation_keys (a key style) or cameras / state_keys (the observation
    keys of each declared camera and of the state; policy_inputs.py), default_prompt,
    tokenizer (a folder, when the release has no tokenizer/), steps (flow-matching steps;
    default the config's num_inference_steps), action_width (default: the release's),
    cuda_graphs (default: on CUDA), graph_batch_sizes (the step's batch buckets; the
    prefix pass takes those up to 8; default pi0_graphs.BATCH_SIZES)."""

    OPTIONS = frozenset({"observation_keys", "cameras", "state_keys", "default_prompt",
                         "tokenizer", "steps", "action_width", "cuda_graphs", "graph_batch_sizes"})

    def __init__(self, model: Any, tokenizer: Any, release: LeRobotRelease, device: str,
                 options: Mapping[str, Any]) -> None:
        self.model, self.tokenizer, self.release = model, tokenizer, release
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        cfg = model.config
        vision = cfg.vlm_config.vision_config
        self.image_size = int(vision.image_size)
        self.tokens_per_image = (vision.image_size // vision.patch_size) ** 2
        self.image_token_id = int(cfg.vlm_config.image_token_id)
        self.horizon, self.max_action_dim = int(cfg.chunk_size), int(cfg.max_action_dim)
        self.max_state_dim = int(cfg.max_state_dim)
        self.steps = int(options.get("steps") or cfg.num_inference_steps)
        self.action_width = int(options.get("action_width") or release.action_width
                                or self.max_action_dim)
        if not 1 <= self.action_width <= self.max_action_dim:
            raise EngineLoadError(f"action_width {self.action_width} must be 1.."
                                  f"{self.max_action_dim}")
        self.layout = ObservationLayout.declare(release.cameras, release.state_width,
                                                options)
        self.default_prompt = options.get("default_prompt")
        self.prompt_length = release.prompt_length
        self._prompts: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._cache_ids: tuple[str, ...] = ()
        self._cache: Any = None
        # the KV cache's forward() keyword and output field: "cache" from transformers
        # 5.24 on, "past_key_values" before (5.23 is setup.cfg's floor)
        self.cache_kwarg = cache_keyword(model.forward)
        self.graphs = self._graphs(options)

    # -- contract -----------------------------------------------------------------------
    def prepare(self, request_id: str, inputs: Mapping[str, Any], seed: int,
                steps: int | None) -> PolicyJob:
        obs = self.layout.read(unpack_tree(inputs.get("observation")))
        frames = [resize_pad(frame, self.image_size, device=self.device)
                  for _, frame in obs.cameras]
        ids, mask = self._prompt(prompt_text(obs.values, self.default_prompt), len(frames))
        noise = torch.randn(1, self.horizon, self.max_action_dim,
                            generator=torch.Generator().manual_seed(seed))
        inputs = {"pixel_values": torch.stack(frames)[None].to(self.dtype),
                  "input_ids": ids, "attention_mask": mask}
        return PolicyJob(request_id, inputs, state=self._state(obs.state),
                         actions=noise.to(self.device, self.dtype),
                         steps=steps or self.steps, seed=seed, prefix_key=len(frames))

    @torch.no_grad()
    def prefix(self, jobs: list[PolicyJob]) -> None:
        """sample_actions' prefix pass, for several robots at once."""
        kv = self.graphs.prefix(jobs) if self.graphs else None
        mask = torch.cat([j.inputs["attention_mask"] for j in jobs])
        if kv is None:
            kv = self._prefix_kv(jobs, mask)
        for i, job in enumerate(jobs):
            job.prefix = {"kv": [(k[i:i + 1], v[i:i + 1]) for k, v in kv],
                          "mask": mask[i:i + 1]}
            job.step_key = mask.shape[1]

    def _prefix_kv(self, jobs: list[PolicyJob], mask: torch.Tensor
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pixels = torch.cat([j.inputs["pixel_values"] for j in jobs])
        ids = torch.cat([j.inputs["input_ids"] for j in jobs])
        cameras_mask = torch.ones(pixels.shape[:2], dtype=torch.bool, device=self.device)
        embeds = self.model.model.embed_prefix(ids, pixels, cameras_mask)
        out = self.model.model.vlm(
            inputs_embeds=embeds, attention_mask=mask, position_ids=mask.cumsum(-1) - 1,
            token_type_ids=torch.zeros_like(embeds)[:, :, 0], use_cache=True)
        cache = getattr(out, self.cache_kwarg)
        return [(layer.keys, layer.values) for layer in cache.layers]

    @torch.no_grad()
    def velocity(self, jobs: list[PolicyJob], actions: torch.Tensor,
                 timesteps: torch.Tensor) -> torch.Tensor:
        graphed = self.graphs.velocity(jobs, actions, timesteps) if self.graphs else None
        if graphed is not None:
            return graphed
        mask = torch.cat([j.prefix["mask"] for j in jobs])
        out = self.model(state=torch.cat([j.state for j in jobs]), noise=actions,
                         timestep=timesteps, attention_mask=mask,
                         **{self.cache_kwarg: self._batch_cache(jobs, mask.shape[1])})
        return out.logits

    def finish(self, job: PolicyJob) -> dict[str, Any]:
        chunk = job.actions[0, :, :self.action_width].float().cpu()
        stats = self.release.actions
        if stats.width == self.action_width:
            chunk = stats.unnormalize(chunk)
        return {"actions": chunk.contiguous()}

    def info(self) -> dict[str, Any]:
        return {"policy": "pi0", "horizon": self.horizon, "action_width": self.action_width,
                "state_width": self.layout.state_width, "cameras": list(self.layout.features),
                "inputs": self.layout.describe(), "image_size": self.image_size,
                "steps": self.steps, "prompt_tokens": self.prompt_length,
                "dtype": str(self.dtype).removeprefix("torch."),
                **(self.graphs.info() if self.graphs else {"cuda_graphs": "off"})}

    def warm(self) -> None:
        """One prefix pass and one step on a blank observation at load, so the first
        robot does not pay for first-call initialisation (about 1.5 s on the CPU)."""
        obs = {**self.layout.blank(self.image_size), "prompt": ""}
        job = self.prepare("warm-up", {"observation": pack_tree(obs)}, 0, 1)
        graphs, self.graphs = self.graphs, None  # eager first: lazy initialisation
        self.prefix([job])
        self.velocity([job], job.actions, torch.ones(1, device=self.device))
        self.graphs = graphs
        if graphs:
            graphs.capture_all(job)
        self.idle()

    def idle(self) -> None:
        """Drop the batch cache (the engine calls this when no robot is stepping)."""
        self._cache_ids, self._cache = (), None

    # -- pieces -------------------------------------------------------------------------
    def _graphs(self, options: Mapping[str, Any]) -> Any:
        wanted = options.get("cuda_graphs")
        if not (self.device.type == "cuda" if wanted is None else wanted):
            return None
        if self.device.type != "cuda":
            raise EngineLoadError(f"cuda_graphs needs device cuda, not {self.device}")
        from omni.models.pi0_graphs import BATCH_SIZES, PI0Graphs

        sizes = options.get("graph_batch_sizes") or BATCH_SIZES
        if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                   for b in sizes):
            raise EngineLoadError(f"graph_batch_sizes must be a list of integers >= 1, "
                                  f"got {sizes!r}")
        return PI0Graphs(self.model, sizes)

    def _prompt(self, prompt: str, n_cameras: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) on the device. A robot sends the same prompt with
        every observation: tokenizing it and copying it up cost 0.3 ms a call on an H200's
        host, so the last PROMPT_CACHE pairs are kept (never written to afterwards)."""
        key = (prompt, n_cameras)
        cached = self._prompts.pop(key, None)
        if cached is None:
            ids, mask = self._tokenize(prompt, n_cameras)
            cached = ids.to(self.device), mask.to(self.device)
        self._prompts[key] = cached  # the most recent last
        while len(self._prompts) > PROMPT_CACHE:
            del self._prompts[next(iter(self._prompts))]
        return cached

    def _tokenize(self, prompt: str, n_cameras: int) -> tuple[torch.Tensor, torch.Tensor]:
        text = self.tokenizer(prompt + "\n", add_special_tokens=True)["input_ids"]
        text = text[:self.prompt_length]
        pad = self.prompt_length - len(text)
        pad_id = self.tokenizer.pad_token_id or 0
        images = n_cameras * self.tokens_per_image
        ids = [self.image_token_id] * images + text + [pad_id] * pad
        mask = [1] * (images + len(text)) + [0] * pad
        return torch.tensor([ids]), torch.tensor([mask])

    def _state(self, vector: np.ndarray) -> torch.Tensor:
        state, stats = torch.from_numpy(vector), self.release.state
        n = state.shape[0]
        if stats.width is not None and n != stats.width:
            raise ValueError(f"the state has {n} values; this policy's statistics have "
                             f"{stats.width}")
        if n > self.max_state_dim:
            raise ValueError(f"the state has {n} values; at most {self.max_state_dim}")
        state = torch.nn.functional.pad(stats.normalize(state), (0, self.max_state_dim - n))
        return state[None].to(self.device, self.dtype)

    def _batch_cache(self, jobs: list[PolicyJob], prefix_len: int) -> Any:
        """The robots' prefix KV as one cache; kept while the same robots step together
        (cut back to the prefix after each step, as sample_actions does)."""
        from transformers import DynamicCache

        ids = tuple(j.request_id for j in jobs)
        if ids == self._cache_ids and self._cache is not None:
            self._cache.crop(prefix_len - self._cache.get_seq_length())
            return self._cache
        layers = zip(*(j.prefix["kv"] for j in jobs), strict=True)
        data = [(torch.cat([k for k, _ in per_job]), torch.cat([v for _, v in per_job]))
                for per_job in layers]
        self._cache_ids, self._cache = ids, DynamicCache(ddp_cache_data=data)
        return self._cache


def build_pi0_policy(*, model_dir: str | None, device: str, dtype: str,
                     options: Mapping[str, Any]) -> PI0Policy:
    from transformers import AutoTokenizer, PI0ForConditionalGeneration

    from omni.models.diffusion import torch_dtype

    if not model_dir:
        raise EngineLoadError("model 'pi0' needs a model_dir (a π0 release directory)")
    release = read_release(model_dir, options.get("tokenizer"))
    kind = release.config.get("type") or release.config.get("model_type")
    if kind != "pi0":
        raise EngineLoadError(f"{model_dir} holds a {kind!r} model, not pi0")
    tokenizer = AutoTokenizer.from_pretrained(str(release.tokenizer_dir))
    model = PI0ForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch_dtype(dtype, device), attn_implementation="sdpa")
    model = model.to(device).eval()
    log.info("pi0 loaded from %s on %s (%s)", model_dir, device,
             str(next(model.parameters()).dtype).removeprefix("torch."))
    policy = PI0Policy(model, tokenizer, release, device, options)
    policy.warm()
    return policy
