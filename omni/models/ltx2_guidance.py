"""LTX-2's two latent streams in one engine job, and its guidance, as LTX2Pipeline does it.

The diffusion engine steps one latents tensor per job; LTX-2 denoises two (video tokens
(1, Nv, Dv) and audio tokens (1, Na, Da)) with one scheduler copy each. ``Streams`` packs
them flat side by side (the engine's step cache and byte accounting see one tensor) and
``JointScheduler`` steps each half with its own scheduler, as the pipeline's loop does.

Guidance (diffusers 0.42 ``LTX2Pipeline.__call__``, in x0 space, per stream):
  x0 = latents - velocity * sigma
  g  = x0_cond + (cfg - 1)(x0_cond - x0_uncond) + stg (x0_cond - x0_perturbed)
             + (modality - 1)(x0_cond - x0_isolated)
  g  = rescale_noise_cfg(g, x0_cond, rescale)   (when rescale > 0)
  velocity = (latents - g) / sigma
where ``uncond`` is the negative prompt (on when either stream's cfg > 1), ``perturbed``
skips self-attention in the STG blocks (on when either stg > 0) and ``isolated`` turns
off the audio<->video cross-attention (on when either modality scale > 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

VIDEO, AUDIO = 0, 1


@dataclass(frozen=True)
class Scales:
    """One stream's guidance scales."""

    cfg: float
    stg: float
    modality: float
    rescale: float


@dataclass(frozen=True)
class Streams:
    """Where the video and audio tokens sit in a job's flat latents."""

    video: tuple[int, int]  # (tokens, features)
    audio: tuple[int, int]

    def pack(self, video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    def split(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n_video = self.video[0] * self.video[1]
        video, audio = flat[:, :n_video], flat[:, n_video:]
        return video.reshape(-1, *self.video), audio.reshape(-1, *self.audio)


class JointScheduler:
    """Steps the video half with the video scheduler and the audio half with the audio
    one (the pipeline keeps two copies in case a scheduler keeps state between steps).
    ``held``: (1, video tokens), 1 on tokens the video scheduler leaves as they are (an
    input image's first frame; the I2V pipeline steps frames 1.. only, and the Euler
    step is per element, so stepping all and keeping those is the same)."""

    def __init__(self, video: Any, audio: Any, streams: Streams,
                 held: torch.Tensor | None = None) -> None:
        self.video, self.audio, self.streams = video, audio, streams
        self.held = None if held is None else held.bool().unsqueeze(-1)

    def step(self, model_output: torch.Tensor, t: Any, latents: torch.Tensor,
             return_dict: bool = False) -> tuple[torch.Tensor]:
        out_video, out_audio = self.streams.split(model_output)
        video, audio = self.streams.split(latents)
        stepped = self.video.step(out_video, t, video, return_dict=False)[0]
        video = stepped if self.held is None else torch.where(self.held, video, stepped)
        audio = self.audio.step(out_audio, t, audio, return_dict=False)[0]
        return (self.streams.pack(video, audio),)


def rescale_noise_cfg(guided: torch.Tensor, cond: torch.Tensor, rescale: float) -> torch.Tensor:
    """diffusers' rescale_noise_cfg (std over every dim but the batch)."""
    dims = list(range(1, cond.ndim))
    rescaled = guided * (cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return rescale * rescaled + (1 - rescale) * guided


def guided_velocity(latents: torch.Tensor, sigma: torch.Tensor, scales: Scales,
                    outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """One stream's guided velocity from the model outputs of its passes ("cond", and
    "uncond" / "perturbed" / "isolated" where the request runs them)."""
    x0 = {kind: latents - out * sigma for kind, out in outputs.items()}
    cond = x0["cond"]
    guided = cond
    if "uncond" in x0:
        guided = guided + (scales.cfg - 1) * (cond - x0["uncond"])
    if "perturbed" in x0:
        guided = guided + scales.stg * (cond - x0["perturbed"])
    if "isolated" in x0:
        guided = guided + (scales.modality - 1) * (cond - x0["isolated"])
    if scales.rescale > 0:
        guided = rescale_noise_cfg(guided, cond, scales.rescale)
    return (latents - guided) / sigma


def passes(video: Scales, audio: Scales, perturbable: bool) -> tuple[str, ...]:
    """The transformer passes a request runs besides "cond" (the pipeline's switches: a
    pass runs when either stream asks for it). ``perturbable``: whether any STG block
    can skip its self-attention; where none can (LTX-2.0's transformer) the pipeline's
    STG pass repeats the cond pass (its term is float noise, ~1e-6), so it is not run."""
    kinds = []
    if video.cfg > 1 or audio.cfg > 1:
        kinds.append("uncond")
    if perturbable and (video.stg > 0 or audio.stg > 0):
        kinds.append("perturbed")
    if video.modality > 1 or audio.modality > 1:
        kinds.append("isolated")
    return tuple(kinds)
