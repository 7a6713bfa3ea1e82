"""Request limits of diffusion stages, shared by the adapters and the API (no torch).

Limits come from the stage's options, so a deployment bounds what one request may cost
(size, steps, images, frames). The engine reports them in READY; the API checks a
request against them and answers 400 before anything is queued; the engine checks again.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

MAX_SEED = 2**63 - 1


class LimitsError(ValueError):
    """A stage's limit options are inconsistent."""


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; every field can be set in the stage's options."""

    default_size: str = "1024x1024"
    size_multiple: int = 16
    max_side: int = 2048
    max_pixels: int = 2048 * 2048
    default_steps: int = 50
    max_steps: int = 100
    max_n: int = 4
    default_guidance: float = 4.0
    # video only
    fps: int = 0
    default_frames: int = 0
    max_frames: int = 0

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **defaults: Any) -> Limits:
        fields = {**defaults, **{k: options[k] for k in cls.__dataclass_fields__
                                 if k in options}}
        try:
            limits = cls(**fields)
            parse_size(limits.default_size, limits)
        except (TypeError, ValueError) as e:
            raise LimitsError(f"bad limit in options: {e}") from e
        return limits

    def info(self) -> dict[str, Any]:
        return asdict(self)

    def largest_output_bytes(self) -> int:
        """One request's output at these limits, as the engine publishes it: uint8 RGB
        frames (a video: max_frames of them), or max_n images."""
        frames = self.max_frames if self.max_frames else self.max_n
        return self.max_pixels * 3 * frames


def parse_size(size: Any, limits: Limits) -> tuple[int, int]:
    """'WxH' (or None / 'auto' for the default) -> (width, height), within limits."""
    if size is None or size == "auto":
        size = limits.default_size
    try:
        width, height = (int(v) for v in str(size).lower().split("x"))
    except ValueError:
        raise ValueError(f"size {size!r} is not WIDTHxHEIGHT (e.g. '1024x1024')") from None
    m = limits.size_multiple
    if width < m or height < m or width % m or height % m:
        raise ValueError(f"size {size!r}: width and height must be positive multiples of {m}")
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        raise ValueError(f"size {size!r} is larger than this server allows (each side <= "
                         f"{limits.max_side}, width*height <= {limits.max_pixels})")
    return width, height


def bounded_int(params: Mapping[str, Any], name: str, default: int, low: int,
                high: int) -> int:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"'{name}' must be an integer from {low} to {high}, got {value!r}")
    return value


def guidance(params: Mapping[str, Any], default: float) -> float:
    value = params.get("guidance_scale", default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 50:
        raise ValueError(f"'guidance_scale' must be a number from 0 to 50, got {value!r}")
    return float(value)


def seed_of(params: Mapping[str, Any]) -> int:
    """The request's seed, or a fresh random one (reported back, so any output can be
    reproduced)."""
    seed = params.get("seed")
    if seed is None:
        return secrets.randbelow(MAX_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"'seed' must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    return seed



LIMIT_OPTIONS = frozenset(Limits.__dataclass_fields__)  # stage options that set a limit


def from_info(info: Mapping[str, Any]) -> Limits:
    """The limits a stage reported in READY."""
    return Limits(**{k: info[k] for k in Limits.__dataclass_fields__ if k in info})
