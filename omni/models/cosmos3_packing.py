"""The per-request and per-step pieces of ``Cosmos3OmniPipeline.__call__`` (diffusers
0.42.1), for forward_dynamics without sound: what a request packs once, and the
transformer passes of one step. Kept line for line with the pipeline's order of
operations so a step equals the pipeline's own (cosmos3_world.py says what is left out).
"""

from __future__ import annotations

from typing import Any

import torch

# the transformer's per-modality arguments, read from a packed request by name
_FIELDS = ("input_ids", "text_indexes", "position_ids", "und_len", "sequence_length",
           "vision_token_shapes", "vision_sequence_indexes", "vision_mse_loss_indexes",
           "vision_noisy_frame_indexes", "action_token_shapes", "action_sequence_indexes",
           "action_mse_loss_indexes", "action_noisy_frame_indexes")


def packed_request(pipe: Any, action: Any, prompt: str, ratios: Any, generator: Any,
                   device: str, fps: float) -> dict[str, Any]:
    """Tokens, initial latents, masks and the cond / uncond packs of one request."""
    from diffusers.video_processor import VideoProcessor

    num_frames = action.chunk_size + 1
    probe = pipe.video_processor.preprocess_video([action.image])
    height, width = VideoProcessor.classify_height_width_bin(
        int(probe.shape[-2]), int(probe.shape[-1]), ratios=ratios)
    cond_ids, uncond_ids = pipe.tokenize_prompt(
        prompt, None, num_frames=num_frames, height=height, width=width, fps=fps,
        use_system_prompt=None, add_resolution_template=True, add_duration_template=True,
        action_mode=action.mode, action_view_point=action.view_point)
    cond_text = pipe._prepare_text_segment(cond_ids, device=device)
    uncond_text = pipe._prepare_text_segment(uncond_ids, device=device)
    (latents, _sound, action_latents, fps_vision, _fps_sound, vision_mask, _sound_mask,
     action_mask, domain_id, _image_size, raw_action_dim, action_cond_indexes) = \
        pipe.prepare_latents(
            image=None, video=None, condition_frame_indexes_vision=(0, 1),
            condition_video_keep="first", num_frames=num_frames, height=height, width=width,
            fps=fps, latents=None, sound_latents=None, action_latents=None,
            generator=generator, device=device, dtype=torch.float32, enable_sound=False,
            action=action)
    cond_indexes = [int(i) for i in
                    torch.nonzero(vision_mask[:, 0, 0] > 0, as_tuple=False).flatten()]

    def pack(text: dict[str, Any]) -> dict[str, Any]:
        vision = pipe._prepare_vision_segment(
            input_vision_tokens=latents, has_image_condition=bool(cond_indexes),
            mrope_offset=text["vision_start_temporal_offset"], vision_fps=fps_vision,
            curr=text["und_len"], device=device, condition_frame_indexes=cond_indexes)
        acts: dict[str, Any] = {}
        if action_latents is not None:
            acts = pipe._prepare_action_segment(
                input_action_tokens=action_latents, condition_frame_indexes=action_cond_indexes,
                mrope_offset=text["vision_start_temporal_offset"], action_fps=fps_vision,
                curr=text["und_len"] + vision["num_vision_tokens"], device=device)
        mrope = [text["text_mrope_ids"], vision["vision_mrope_ids"]]
        if acts:
            mrope.append(acts["action_mrope_ids"])
        return {**text, **vision, **acts, "position_ids": torch.cat(mrope, dim=1),
                "sequence_length": text["und_len"] + vision["num_vision_tokens"]
                + acts.get("action_len", 0)}

    return {"latents": latents, "action_latents": action_latents, "vision_mask": vision_mask,
            "action_mask": action_mask, "domain_id": domain_id,
            "raw_action_dim": raw_action_dim, "cond": pack(cond_text),
            "uncond": pack(uncond_text)}


def call_kwargs(packed: dict[str, Any], state: dict[str, Any], vision: torch.Tensor,
                actions: torch.Tensor | None, timestep: float, device: str) -> dict[str, Any]:
    """The transformer's arguments for one pass (cond or uncond) of one request."""
    noisy_actions = packed.get("num_noisy_action_tokens")
    return {**{name: packed.get(name) for name in _FIELDS}, "vision_tokens": [vision],
            "vision_timesteps": torch.full((packed["num_noisy_vision_tokens"],), timestep,
                                           device=device),
            "action_tokens": [actions] if actions is not None else None,
            "action_timesteps": (torch.full((noisy_actions,), timestep, device=device)
                                 if actions is not None else None),
            "action_domain_ids": ([state["domain_id"]] if state["domain_id"] is not None
                                  else None)}


def masked_velocity(pipe: Any, state: dict[str, Any], pred_vision: torch.Tensor,
                    pred_action: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The pipeline's _mask_velocity_predictions for one pass: condition positions zero;
    (vision, action or None) as float32."""
    action_mask = state["action_mask"]
    v_vision, _, v_action = pipe._mask_velocity_predictions(
        [pred_vision], None, vision_condition_mask=[state["vision_mask"]],
        sound_condition_mask=None, preds_action=None if pred_action is None else [pred_action],
        action_condition_mask=[action_mask] if action_mask is not None else None,
        raw_action_dim=state["raw_action_dim"])
    return v_vision.float(), None if v_action is None else v_action.float()


def velocities(pipe: Any, jobs: list[Any], processor: Any, dtype: torch.dtype, device: str,
               latents: Any, actions: Any, timestep: Any
               ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The guided (vision, action) velocities of each job at its own step, every pass of
    every job in ONE transformer call (cosmos3_batch.py packs them; attention stays per
    sample). ``latents`` / ``actions`` / ``timestep``: a job's vision latents, action
    latents (or None) and current timestep. The pipeline's ``cache_context`` is left out:
    it only scopes diffusers' optional caching hooks, per sample, and none is installed."""
    from omni.models.cosmos3_batch import pack

    calls, owners = [], []
    for index, job in enumerate(jobs):
        state = job.state
        vision = latents(job).to(device=device, dtype=dtype)
        action = actions(job)
        action = action.to(device=device, dtype=dtype) if action is not None else None
        for kind in ("cond", "uncond") if job_guided(job) else ("cond",):
            calls.append(call_kwargs(state[kind], state, vision, action, timestep(job), device))
            owners.append(index)
    kwargs, processor.lengths = pack(calls)
    try:
        preds_vision, _sound, preds_action = pipe.transformer(**kwargs)
    finally:
        processor.lengths = []
    passes: list[list[tuple]] = [[] for _ in jobs]
    for i, owner in enumerate(owners):
        action = preds_action[i] if preds_action is not None else None
        passes[owner].append(masked_velocity(pipe, jobs[owner].state, preds_vision[i], action))
    return [_guided(job.state.get("scale", 1.0), p) for job, p in zip(jobs, passes, strict=True)]


def job_guided(job: Any) -> bool:
    return bool(getattr(job, "guided", False) or job.state.get("guided", False))


def _guided(scale: float, passes: list[tuple]) -> tuple[torch.Tensor, torch.Tensor | None]:
    (cond_v, cond_a), *rest = passes
    if not rest:
        return cond_v, cond_a
    uncond_v, uncond_a = rest[0]
    vision = uncond_v + scale * (cond_v - uncond_v)
    action = None if cond_a is None else uncond_a + scale * (cond_a - uncond_a)
    return vision, action
