"""LTX-2 (video with its audio track) for the diffusion engine.

Loaded with diffusers' ``LTX2Pipeline`` from a local release directory (Lightricks/LTX-2:
Gemma-3 text encoder + text connectors, the joint audio-video transformer, a video VAE,
an audio VAE and a vocoder). The adapter reuses the pipeline's pieces and replaces its
loop so that requests at different steps share transformer calls. What it reproduces
from ``LTX2Pipeline.__call__`` (diffusers 0.42):
- text: Gemma's every hidden layer, left-padded to ``max_sequence_length`` (1024), through
  the connectors into a video and an audio text embedding;
- latents: video tokens (frames 8k+1, sizes multiples of 32) and audio tokens
  (``round(frames / fps * sample_rate / hop / 4)`` latent frames), drawn in that order
  from the request's generator; one step moves both (ltx2_guidance.py: one flat latents
  tensor per job, a scheduler copy per stream), FlowMatchEuler on ``linspace(1, 1/steps)``
  shifted by ``mu`` from the video token count;
- guidance (ltx2_guidance.py): classifier-free, spatio-temporal (STG: self-attention
  skipped in ``stg_blocks``) and modality isolation (no audio<->video attention), each
  stream with its own scales and rescale. The cond, uncond and STG rows of every request
  in a group share ONE transformer call (STG rows are marked by a per-row perturbation
  mask); the isolation rows share a second (isolation is a per-call switch);
- decode: video VAE (timestep-conditioned VAEs at ``decode_timestep`` with
  ``decode_noise_scale`` of fresh noise), audio VAE to a mel spectrogram, vocoder to
  stereo audio at its ``output_sampling_rate``.
The request's ``guidance_scale`` is the video stream's; the rest are stage options with
the pipeline's defaults.
Image to video (an ``input_reference``) is ``LTX2ImageToVideoPipeline`` over the same
modules (ltx2_image.py: the image as latent frame 0, held at timestep 0); image and
text requests of one grid share transformer calls.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob, EngineLoadError, flag_option
from omni.models.ltx2_guidance import (
    AUDIO,
    VIDEO,
    JointScheduler,
    Scales,
    Streams,
    guided_velocity,
    passes,
)
from omni.models.ltx2_image import FirstFrame, video_timesteps

PIPELINE = "LTX2Pipeline"
# LTX2Pipeline.__call__'s defaults: (video, audio) per guidance option
GUIDANCE_DEFAULTS = {"stg_scale": (1.0, 1.0), "modality_scale": (3.0, 3.0),
                     "guidance_rescale": (0.7, 0.7)}
SCALE_OPTIONS = frozenset(GUIDANCE_DEFAULTS) | {f"audio_{k}" for k in GUIDANCE_DEFAULTS}


def _classes() -> dict[str, Any]:
    from diffusers import LTX2Pipeline

    return {PIPELINE: LTX2Pipeline}


class LTX2Denoiser:
    output = "video"
    OPTIONS = common.LIMIT_OPTIONS | SCALE_OPTIONS | {
        "audio_guidance_scale", "stg_blocks", "use_cross_timestep", "max_sequence_length",
        "decode_timestep", "decode_noise_scale", "image_crf"}

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        self.pipe, self.device = pipe, device
        self.temporal = pipe.vae_temporal_compression_ratio
        self.spatial = pipe.vae_spatial_compression_ratio
        self.dtype = pipe.transformer.dtype
        self.limits = common.limits(
            options, size_multiple=self.spatial, default_size="768x512",
            max_pixels=1280 * 720, max_side=1280, default_steps=30, default_guidance=3.0,
            max_n=1, fps=24, default_frames=121, max_frames=257)
        if (self.limits.max_frames - 1) % self.temporal:
            raise EngineLoadError(f"max_frames must be {self.temporal}k+1")
        self.options = self._guidance_options(options)
        self.max_text_tokens = int(options.get("max_sequence_length", 1024))
        self.decode_timestep = float(options.get("decode_timestep", 0.0))
        self.decode_noise_scale = float(options.get("decode_noise_scale",
                                                    self.decode_timestep))
        from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

        self.rope_fps = conditioning_frame_rate(float(self.limits.fps), 1.0)
        # a schedule stretched to shift_terminal needs 2 sigmas (1 step gives NaN sigmas,
        # a NaN video and NaN audio)
        self.min_steps = 2 if pipe.scheduler.config.get("shift_terminal") else 1
        blocks = pipe.transformer.transformer_blocks
        self.perturbable = any(blocks[i].perturbed_attn for i in self.options["stg_blocks"]
                               if 0 <= i < len(blocks))
        self.first_frame = FirstFrame(pipe, options)

    @staticmethod
    def _guidance_options(options: Mapping[str, Any]) -> dict[str, Any]:
        try:
            values = {name: (float(options.get(name, video)),
                             float(options.get(f"audio_{name}", audio)))
                      for name, (video, audio) in GUIDANCE_DEFAULTS.items()}
            values["audio_guidance_scale"] = float(options.get("audio_guidance_scale", 7.0))
            values["stg_blocks"] = [int(b) for b in options.get("stg_blocks", [28])]
        except (TypeError, ValueError) as e:
            raise EngineLoadError(f"bad LTX-2 guidance option: {e}") from e
        values["use_cross_timestep"] = flag_option(options, "use_cross_timestep", True)
        return values

    def info(self) -> dict[str, Any]:
        return {"tasks": ["text_to_video", "image_to_video"], "max_input_images": 1,
                "pipeline": type(self.pipe).__name__, "frame_step": self.temporal,
                "audio": True, **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        images = inputs.get("images") or []
        if len(images) > 1:
            raise ValueError(f"'input_reference': one image per video, got {len(images)}")
        frames = common.video_frames(params, self.limits, self.temporal)
        width, height = common.parse_size(params.get("size"), self.limits)
        plan = common.request_plan(inputs, params, self.limits, no_negative="",
                                   min_steps=self.min_steps, batched=False)
        return plan | {"frames": frames, "width": width, "height": height,
                       "image": self.first_frame.image(images[0]) if images else None}

    def _scales(self, guidance: float) -> tuple[Scales, Scales]:
        o = self.options
        video = Scales(guidance, o["stg_scale"][VIDEO], o["modality_scale"][VIDEO],
                       o["guidance_rescale"][VIDEO])
        # the pipeline: audio_guidance_scale or guidance_scale (0 falls back)
        audio = Scales(o["audio_guidance_scale"] or guidance, o["stg_scale"][AUDIO],
                       o["modality_scale"][AUDIO], o["guidance_rescale"][AUDIO])
        return video, audio

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        pipe = self.pipe
        scales = self._scales(plan["guidance"])
        kinds = passes(*scales, self.perturbable)
        text = self._encode_text(plan, "uncond" in kinds)
        grid = ((plan["frames"] - 1) // self.temporal + 1, plan["height"] // self.spatial,
                plan["width"] // self.spatial)
        gen = common.generator(plan["seed"])
        video, first_frame = self._video_latents(plan, gen)
        audio_frames = round(plan["frames"] / self.limits.fps * pipe.audio_sampling_rate
                             / pipe.audio_hop_length / pipe.audio_vae_temporal_compression_ratio)
        audio = pipe.prepare_audio_latents(
            1, num_channels_latents=pipe.audio_vae.config.latent_channels,
            audio_latent_length=audio_frames, num_mel_bins=pipe.audio_vae.config.mel_bins,
            noise_scale=0.0, dtype=torch.float32, device=self.device, generator=gen)
        streams = Streams(tuple(video.shape[1:]), tuple(audio.shape[1:]))
        scheduler, timesteps = self._schedule(plan["steps"], video.shape[1], streams,
                                              first_frame)
        state = {"text": text, "grid": grid, "audio_frames": audio_frames, "scales": scales,
                 "passes": kinds, "streams": streams, "generator": gen,
                 "first_frame": first_frame}
        return DenoiseJob(request_id, streams.pack(video, audio), timesteps, scheduler,
                          rows=1, guided="uncond" in kinds, seed=plan["seed"], state=state,
                          extra_rows_per_image=int("perturbed" in kinds))

    def _video_latents(self, plan: dict[str, Any],
                       gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(packed video latents, the image's first-frame mask or None): the noise is
        drawn the same way with or without an image."""
        if plan["image"] is not None:
            return self.first_frame.latents(plan["image"], plan, gen, self.device)
        pipe = self.pipe
        return pipe.prepare_latents(1, pipe.transformer.config.in_channels, plan["height"],
                                    plan["width"], plan["frames"], 0.0, torch.float32,
                                    self.device, gen), None

    def _encode_text(self, plan: dict[str, Any], guided: bool) -> dict[str, Any]:
        """{"cond": (video text, audio text, mask), "uncond": ... when guided}."""
        pipe = self.pipe
        pos, pos_mask, neg, neg_mask = pipe.encode_prompt(
            prompt=plan["prompt"], negative_prompt=plan["negative_prompt"],
            do_classifier_free_guidance=guided, num_videos_per_prompt=1,
            max_sequence_length=self.max_text_tokens, device=self.device)
        embeds = pos if neg is None else torch.cat([neg, pos])
        masks = pos_mask if neg is None else torch.cat([neg_mask, pos_mask])
        side = getattr(pipe.tokenizer, "padding_side", "left")
        video, audio, mask = pipe.connectors(embeds, masks, padding_side=side)
        rows = {"cond": (video[-1:], audio[-1:], mask[-1:])}
        if guided:
            rows["uncond"] = (video[:1], audio[:1], mask[:1])
        return rows

    def _schedule(self, steps: int, tokens: int, streams: Streams,
                  held: torch.Tensor | None) -> tuple[Any, torch.Tensor]:
        """A copy of the release's scheduler per stream, set as the pipeline sets it."""
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, retrieve_timesteps

        cfg = self.pipe.scheduler.config
        mu = calculate_shift(tokens, cfg.get("base_image_seq_len", 1024),
                             cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.95),
                             cfg.get("max_shift", 2.05))
        sigmas = np.linspace(1.0, 1 / steps, steps)
        copies = [copy.deepcopy(self.pipe.scheduler) for _ in range(2)]
        for scheduler in copies:
            timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas,
                                              mu=mu)
            scheduler.set_begin_index(0)
        return JointScheduler(*copies, streams, held), timesteps

    # -- denoising --------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return (job.state["grid"], job.state["audio_frames"])

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        joint = [(j, k) for k in ("cond", "uncond", "perturbed") for j in jobs
                 if k == "cond" or k in j.state["passes"]]
        outputs = dict(zip(joint, self._call(joint, isolated=False), strict=True))
        isolated = [(j, "isolated") for j in jobs if "isolated" in j.state["passes"]]
        if isolated:
            outputs.update(zip(isolated, self._call(isolated, isolated=True), strict=True))
        return [self._guide(job, {kind: out for (j, kind), out in outputs.items()
                                  if j is job}) for job in jobs]

    def _call(self, rows: list[tuple[DenoiseJob, str]],
              isolated: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One transformer call over ``rows`` (job, pass); per row (video, audio) output."""
        tr, first = self.pipe.transformer, rows[0][0]
        frames, height, width = first.state["grid"]
        audio_frames, n = first.state["audio_frames"], len(rows)
        latents = [j.state["streams"].split(j.latents) for j, _ in rows]
        text = [j.state["text"]["uncond" if k == "uncond" else "cond"] for j, k in rows]
        timestep = torch.cat([j.timesteps[j.step].expand(1) for j, _ in rows])
        perturbed = [k == "perturbed" for _, k in rows]
        video, audio = tr(
            hidden_states=torch.cat([v for v, _ in latents]).to(self.dtype),
            audio_hidden_states=torch.cat([a for _, a in latents]).to(self.dtype),
            encoder_hidden_states=torch.cat([t[0] for t in text]),
            audio_encoder_hidden_states=torch.cat([t[1] for t in text]),
            encoder_attention_mask=torch.cat([t[2] for t in text]),
            audio_encoder_attention_mask=torch.cat([t[2] for t in text]),
            timestep=video_timesteps([j for j, _ in rows], timestep),
            audio_timestep=timestep, sigma=timestep, num_frames=frames, height=height,
            width=width, fps=self.rope_fps, audio_num_frames=audio_frames,
            video_coords=tr.rope.prepare_video_coords(n, frames, height, width, self.device,
                                                      fps=self.rope_fps),
            audio_coords=tr.audio_rope.prepare_audio_coords(n, audio_frames, self.device),
            isolate_modalities=isolated,
            spatio_temporal_guidance_blocks=self.options["stg_blocks"] if any(perturbed)
            else None,
            # 0 = skip self-attention in the STG blocks (that row's perturbed pass)
            # in the transformer's dtype: its blocks lerp bf16 values by this weight
            perturbation_mask=torch.tensor([0.0 if p else 1.0 for p in perturbed],
                                           device=self.device, dtype=self.dtype)
            if any(perturbed) else None,
            use_cross_timestep=self.options["use_cross_timestep"], return_dict=False)
        return list(zip(video.float().split(1), audio.float().split(1), strict=True))

    def _guide(self, job: DenoiseJob, outputs: dict[str, tuple[torch.Tensor, ...]]) -> Any:
        streams = job.state["streams"]
        latents = streams.split(job.latents)
        schedulers = (job.scheduler.video, job.scheduler.audio)
        velocity = [guided_velocity(latents[s], schedulers[s].sigmas[job.step],
                                    job.state["scales"][s],
                                    {kind: out[s] for kind, out in outputs.items()})
                    for s in (VIDEO, AUDIO)]
        return streams.pack(*velocity)

    # -- decoding ---------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        """Jobs of one grid decode together (the engine groups by flat latent size)."""
        results: dict[int, dict[str, Any]] = {}
        groups: dict[Any, list[DenoiseJob]] = {}
        for job in jobs:
            groups.setdefault(self.group_key(job), []).append(job)
        for group in groups.values():
            frames, audio = self._decode_video(group), self._decode_audio(group)
            rate = int(self.pipe.vocoder.config.output_sampling_rate)
            for job, video, sound in zip(group, frames, audio, strict=True):
                results[id(job)] = {"video": video, "fps": self.limits.fps,
                                    "audio": sound.float().cpu().contiguous(),
                                    "sample_rate": rate}
        return [results[id(job)] for job in jobs]

    def _decode_video(self, jobs: list[DenoiseJob]) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        pipe, vae = self.pipe, self.pipe.vae
        latents = []
        for job in jobs:
            tokens = job.state["streams"].split(job.latents)[VIDEO]
            video = pipe._unpack_latents(tokens, *job.state["grid"],
                                         pipe.transformer_spatial_patch_size,
                                         pipe.transformer_temporal_patch_size).to(self.dtype)
            if vae.config.timestep_conditioning:  # the pipeline's decode noise
                noise = randn_tensor(video.shape, generator=job.state["generator"],
                                     device=video.device, dtype=video.dtype)
                scale = self.decode_noise_scale
                video = (1 - scale) * video + scale * noise
            latents.append(pipe._denormalize_latents(video, vae.latents_mean, vae.latents_std,
                                                     vae.config.scaling_factor))
        timestep = None
        if vae.config.timestep_conditioning:
            timestep = torch.full((len(jobs),), self.decode_timestep, device=self.device,
                                  dtype=self.dtype)
        pixels = vae.decode(torch.cat(latents).to(vae.dtype), timestep, return_dict=False)[0]
        return common.to_uint8(pixels.movedim(1, 2))  # (n, F, H, W, 3)

    def _decode_audio(self, jobs: list[DenoiseJob]) -> torch.Tensor:
        pipe, audio_vae = self.pipe, self.pipe.audio_vae
        mel_bins = audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio
        latents = []
        for job in jobs:
            tokens = job.state["streams"].split(job.latents)[AUDIO]
            tokens = pipe._denormalize_audio_latents(tokens, audio_vae.latents_mean,
                                                     audio_vae.latents_std)
            latents.append(pipe._unpack_audio_latents(tokens, job.state["audio_frames"],
                                                      num_mel_bins=mel_bins))
        mel = audio_vae.decode(torch.cat(latents).to(audio_vae.dtype), return_dict=False)[0]
        return pipe.vocoder(mel)  # (n, channels, samples) in [-1, 1]


def build_ltx2(*, model_dir: str, device: str, dtype: str,
               options: Mapping[str, Any]) -> LTX2Denoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options))
    return LTX2Denoiser(pipe, device, options)
