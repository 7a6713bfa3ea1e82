"""What a robot policy reads from an observation, declared, never guessed.

A policy declares its inputs: its cameras (a LeRobot release's VISUAL input features, in
the model's order), its state width, and the other keys it reads (``prompt``). Robots send
observations under their own keys; a **key style** maps them onto the declared inputs:

| style | cameras, in order | state (concatenated) |
|---|---|---|
| ``lerobot`` | the release's own feature names (``observation.images.<name>``) | ``observation.state`` |
| ``libero`` | ``observation/image``, ``observation/wrist_image`` | ``observation/state`` |
| ``droid`` | ``observation/exterior_image_1_left``, ``observation/wrist_image_left`` | ``observation/joint_position``, ``observation/gripper_position`` |
| ``aloha`` | ``images.cam_high``, ``images.cam_low``, ``images.cam_left_wrist``, ``images.cam_right_wrist`` | ``state`` |

(a nested key is written with dots: ALOHA's ``{"images": {"cam_high": ...}}`` is
``images.cam_high``.) The stage options pick or replace the table: ``observation_keys``
names one style; ``cameras`` (observation keys, one per declared camera, in its order) and
``state_keys`` give the mapping outright. Unset, an observation is read with the style
whose camera keys it holds (only styles with as many cameras as the policy are tried).

Then every declared camera must be there and be an image, the state must have the
declared width, and every key of the observation must be one the mapping places:
anything else is refused with a ValueError naming the key. Nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni.engines.base import EngineLoadError
from omni.models.policy_images import image_uint8

MAX_CAMERAS = 8


@dataclass(frozen=True)
class KeyStyle:
    """How one family of robots names its cameras and state."""

    name: str
    cameras: tuple[str, ...]
    state: tuple[str, ...]


KEY_STYLES = {style.name: style for style in (
    KeyStyle("libero", ("observation/image", "observation/wrist_image"),
             ("observation/state",)),
    KeyStyle("droid", ("observation/exterior_image_1_left", "observation/wrist_image_left"),
             ("observation/joint_position", "observation/gripper_position")),
    KeyStyle("aloha", ("images.cam_high", "images.cam_low", "images.cam_left_wrist",
                       "images.cam_right_wrist"), ("state",)),
)}
LEROBOT_STATE = "observation.state"


@dataclass
class Observation:
    """One observation read against a layout: frames in the policy's camera order."""

    cameras: list[tuple[str, torch.Tensor]]  # (the robot's key, uint8 (3, H, W))
    state: np.ndarray | None                 # float32 (width,), when the policy reads one
    values: dict[str, Any]                   # every other key the policy reads, by name


@dataclass(frozen=True)
class ObservationLayout:
    """A policy's declared inputs and the key styles that may carry them.

    ``features``: the policy's cameras in the model's order. ``reads_state``: False for a
    policy that conditions on frames only (its style's state keys are then accepted and
    not read, and say so in ``describe``). ``spare_cameras``: a policy that reads fewer
    cameras than a style sends (Cosmos 3 reads the first) accepts the style's others."""

    features: tuple[str, ...]
    state_width: int | None
    styles: tuple[KeyStyle, ...]
    other_keys: frozenset[str] = frozenset({"prompt"})
    reads_state: bool = True
    spare_cameras: bool = False
    fixed: bool = field(default=False, compare=False)  # a style or mapping set by options

    @classmethod
    def declare(cls, features: Sequence[str], state_width: int | None,
                options: Mapping[str, Any], **kw: Any) -> ObservationLayout:
        """The layout of a policy whose release declares ``features`` and ``state_width``,
        with the stage options ``observation_keys`` / ``cameras`` / ``state_keys``;
        EngineLoadError for a mapping that cannot fit them."""
        features = tuple(features)
        explicit = _explicit_style(options, features, kw.get("spare_cameras", False))
        if not features:
            if explicit is None:
                raise EngineLoadError("the policy declares no cameras: set the stage "
                                      "option 'cameras' (the observation keys it reads)")
            features = explicit.cameras[:1] if kw.get("spare_cameras") else explicit.cameras
        if len(features) > MAX_CAMERAS:
            raise EngineLoadError(f"{len(features)} cameras; at most {MAX_CAMERAS}")
        if explicit is not None:
            return cls(features, state_width, (explicit,), fixed=True, **kw)
        lerobot = KeyStyle("lerobot", features, (LEROBOT_STATE,))
        styles = (lerobot, *KEY_STYLES.values())
        return cls(features, state_width, styles, **kw)

    # -- reading ------------------------------------------------------------------------
    def read(self, obs: Any) -> Observation:
        if not isinstance(obs, Mapping):
            raise ValueError("the observation must be a map of keys to values")
        flat = flatten(obs)
        style = self.style_for(flat)
        self._refuse_unplaced(flat, style)
        keys = style.cameras[:len(self.features)]
        frames = [(key, image_uint8(key, self._take(flat, key, style))) for key in keys]
        state = self._state(flat, style) if self.reads_state else None
        values = {key: flat[key] for key in self.other_keys if key in flat}
        return Observation(frames, state, values)

    def style_for(self, flat: Mapping[str, Any]) -> KeyStyle:
        """The style whose camera keys the observation holds (most of them wins)."""
        fitting = [s for s in self.styles if self._fits(s)]
        counts = [(sum(k in flat for k in s.cameras), s) for s in fitting]
        best = max(counts, key=lambda pair: pair[0], default=(0, None))
        if best[0] == 0:
            raise ValueError("the observation holds none of this policy's cameras; it reads "
                             + "; or ".join(_describe_style(s) for s in fitting))
        return best[1]

    def _fits(self, style: KeyStyle) -> bool:
        n = len(style.cameras)
        return n == len(self.features) or (self.spare_cameras and n >= len(self.features))

    def _take(self, flat: Mapping[str, Any], key: str, style: KeyStyle) -> Any:
        if key not in flat:
            raise ValueError(f"the observation has no {key!r} (this policy reads "
                             f"{_describe_style(style)})")
        return flat[key]

    def _state(self, flat: Mapping[str, Any], style: KeyStyle) -> np.ndarray:
        parts = [_vector(key, self._take(flat, key, style)) for key in style.state]
        state = np.concatenate(parts)
        if self.state_width is not None and state.shape[0] != self.state_width:
            names = " + ".join(repr(k) for k in style.state)
            raise ValueError(f"the state {names} has {state.shape[0]} values; this policy's "
                             f"robot has {self.state_width}")
        return state

    def _refuse_unplaced(self, flat: Mapping[str, Any], style: KeyStyle) -> None:
        known = set(style.cameras) | set(style.state) | self.other_keys
        for key in flat:
            if key not in known:
                raise ValueError(f"the observation key {key!r} is not one this policy reads "
                                 f"({_describe_style(style)}, "
                                 f"{', '.join(sorted(self.other_keys))}); remove it, or map "
                                 "it with the stage options 'cameras' / 'state_keys'")

    # -- telling robots -----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """For the metadata frame: the declared inputs and each accepted key style."""
        styles = {}
        for s in filter(self._fits, self.styles):
            entry = {"cameras": dict(zip(s.cameras, self.features, strict=False)),
                     "state": list(s.state)}
            unused = list(s.cameras[len(self.features):])
            unused += [] if self.reads_state else list(s.state)
            if unused:
                entry["unused"] = unused
            styles[s.name] = entry
        return {"cameras": list(self.features), "state_width": self.state_width,
                "reads_state": self.reads_state, "other_keys": sorted(self.other_keys),
                "key_styles": styles}

    def blank(self, side: int) -> dict[str, Any]:
        """An all-black observation in the first style's keys (for warming up)."""
        style = next(filter(self._fits, self.styles))
        frame = np.zeros((side, side, 3), np.uint8)
        obs: dict[str, Any] = dict.fromkeys(style.cameras, frame)
        width = self.state_width or len(style.state)
        for i, key in enumerate(style.state):
            obs[key] = np.zeros(width if i == 0 else 0, np.float32)
        return obs


def _explicit_style(options: Mapping[str, Any], features: tuple[str, ...],
                    spare: bool) -> KeyStyle | None:
    """The key style the stage options fix, or None when they leave it to the table."""
    name = options.get("observation_keys")
    cams, state = options.get("cameras"), options.get("state_keys")
    if name is None and not cams and not state:
        return None
    if name is not None:
        if name == "lerobot":
            base = KeyStyle("lerobot", features, (LEROBOT_STATE,))
        elif name in KEY_STYLES:
            base = KEY_STYLES[name]
        else:
            raise EngineLoadError(f"observation_keys {name!r} is not a key style; one of "
                                  f"lerobot, {', '.join(KEY_STYLES)}")
    else:
        base = KeyStyle("lerobot", features, (LEROBOT_STATE,))
    style = KeyStyle("options" if cams or state else base.name,
                     tuple(cams or base.cameras), tuple(state or base.state))
    if not all(isinstance(k, str) and k for k in (*style.cameras, *style.state)):
        raise EngineLoadError("the stage options 'cameras' and 'state_keys' must be lists "
                              "of observation keys")
    n = len(style.cameras)
    if features and not (n == len(features) or (spare and n >= len(features))):
        raise EngineLoadError(f"{n} camera keys ({', '.join(style.cameras)}) for a policy "
                              f"of {len(features)} cameras ({', '.join(features)})")
    return style


def _describe_style(style: KeyStyle) -> str:
    return f"{style.name} keys: " + ", ".join((*style.cameras, *style.state))


def flatten(obs: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested maps as dotted key paths: {"images": {"cam_high": x}} -> "images.cam_high"."""
    out: dict[str, Any] = {}
    for key, value in obs.items():
        if not isinstance(key, str):
            raise ValueError(f"observation keys must be strings, got {key!r}")
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _vector(key: str, value: Any) -> np.ndarray:
    """One state part as float32 (n,); ValueError naming ``key``."""
    arr = np.asarray(value) if isinstance(value, list | tuple | int | float) else value
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "uifb" or arr.ndim > 1:
        raise ValueError(f"{key!r} must be a 1-D array of numbers (the robot state)")
    vector = arr.astype(np.float32).reshape(-1)
    if not np.isfinite(vector).all():
        raise ValueError(f"{key!r} holds NaN or infinity")
    return vector


def prompt_text(values: Mapping[str, Any], default: str | None, max_chars: int = 2000) -> str:
    prompt = values.get("prompt", default)
    if prompt is None:
        raise ValueError("the observation has no 'prompt' and this policy has no default "
                         "prompt")
    if isinstance(prompt, bytes):
        prompt = prompt.decode("utf-8", "replace")
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string")
    if len(prompt) > max_chars:
        raise ValueError(f"'prompt' is {len(prompt)} characters; at most {max_chars}")
    return prompt
