"""Image files: encoding generated pixels, and edit masks (Pillow)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

IMAGE_FORMATS = ("png", "jpeg", "webp")
# an uploaded image's most pixels: its header is read and checked before anything decodes
# it (a 60000x60000 PNG is a few kilobytes and 10 GB of pixels). Below Pillow's own
# refusal (2 x Image.MAX_IMAGE_PIXELS), so every image Pillow refuses is over it too.
MAX_IMAGE_PIXELS = 64 * 2**20
MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


def encode_image(pixels: Any, fmt: str = "png", quality: int | None = None) -> bytes:
    """uint8 (H, W, 3) pixels -> image file bytes. ``quality`` (0-100) applies to jpeg and
    webp, as OpenAI's ``output_compression`` does; png is lossless."""
    from PIL import Image

    array = np.ascontiguousarray(np.asarray(pixels, dtype=np.uint8))
    image = Image.fromarray(array, "RGB")
    out = io.BytesIO()
    if fmt == "png":
        image.save(out, "PNG")
    elif fmt in ("jpeg", "webp"):
        image.save(out, fmt.upper(), quality=85 if quality is None else quality)
    else:
        raise ValueError(f"unknown image format {fmt!r}")
    return out.getvalue()


def apply_mask(result: Any, original: bytes, mask: bytes) -> np.ndarray:
    """OpenAI's edit mask: fully transparent pixels of ``mask`` mark where the image may
    change. The model regenerates the whole picture, so outside the mask the original
    (resized to the result) is put back. Raises ValueError for unreadable or
    mismatched inputs."""
    from PIL import Image, UnidentifiedImageError

    height, width = np.asarray(result).shape[:2]
    try:
        with Image.open(io.BytesIO(mask)) as m:
            if m.mode not in ("RGBA", "LA", "PA") and "transparency" not in m.info:
                raise ValueError("'mask' must be a PNG with an alpha channel (transparent "
                                 "where the image should be edited)")
            alpha = np.asarray(m.convert("RGBA").resize((width, height)))[..., 3]
        with Image.open(io.BytesIO(original)) as o:
            base = np.asarray(o.convert("RGB").resize((width, height)))
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"'mask' is not an image this server can read ({e})") from None
    keep = (alpha > 0)[..., None]
    return np.where(keep, base, np.asarray(result, dtype=np.uint8)).astype(np.uint8)


def check_mask(mask: bytes, image: bytes) -> None:
    """A 400-worthy ValueError unless ``mask`` is a readable image with alpha and the
    size of ``image`` (OpenAI's rule)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(mask)) as m, Image.open(io.BytesIO(image)) as i:
            if m.size != i.size:
                raise ValueError(f"'mask' is {m.size[0]}x{m.size[1]} but the image is "
                                 f"{i.size[0]}x{i.size[1]}; they must match")
            if m.mode not in ("RGBA", "LA", "PA") and "transparency" not in m.info:
                raise ValueError("'mask' must be a PNG with an alpha channel (transparent "
                                 "where the image should be edited)")
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"'mask' or 'image' is not an image this server can read ({e})") \
            from None


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of an image file (its header only: callers bound the size before
    anything decodes it); ValueError when it is not one, Image.DecompressionBombError
    (check_image turns it into a ValueError naming the limit) when Pillow refuses it."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"not an image this server can read ({e})") from None


def check_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """(width, height) of an image file whose header declares at most ``max_pixels``;
    ValueError naming the limit otherwise (or saying it is not an image). Only the header
    is read."""
    from PIL import Image

    try:
        width, height = image_size(data)
    except Image.DecompressionBombError:
        raise ValueError(f"the image declares more than {max_pixels} pixels, the most "
                         "accepted") from None
    if width * height > max_pixels:
        raise ValueError(f"the image is {width}x{height}; at most {max_pixels} pixels "
                         "are accepted")
    return width, height
