"""Pictures of more than 8 bits a channel (16-bit PNG and TIFF: PIL's modes I;16 and I), made
the 8-bit ones the image tasks and `loom predict` read. PIL's own `convert("L")` clips such a
picture to 0 or 255: a 16-bit grayscale scan became black and white, without a word. Imports
PIL and numpy only, as `loom predict` does."""

from __future__ import annotations

from typing import Any

import numpy as np

WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def eight_bit(image: Any) -> Any:
    """`image` (a PIL image) with 8 bits a channel: a 16-bit one scaled (65535 is 255); an
    `I` one (32-bit integers) whose values fit 8 bits as it is, else read as 16-bit. A
    floating-point one raises ValueError: what its values mean is not known."""
    from PIL import Image

    if image.mode == "F":
        raise ValueError("a floating-point image: save it with 8 or 16 bits a channel")
    if image.mode not in WIDE_MODES:
        return image
    values = np.asarray(image)  # uint16 or int32, as PIL holds it
    if image.mode == "I" and values.size and values.min() >= 0 and values.max() <= 255:
        return Image.fromarray(values.astype(np.uint8))
    # In place, in 32 bits (65535 * 255 + 32767 fits): int64 and a copy per operation took
    # 17 bytes a pixel, 3 GB for a 360 KB 16-bit PNG of 13000 x 13000 pixels.
    if values.dtype != np.uint16:  # mode I: 32-bit, read as 16-bit
        values = np.clip(values, 0, 65535)
    scaled = values.astype(np.uint32)
    scaled *= 255
    scaled += 32767
    scaled //= 65535
    return Image.fromarray(scaled.astype(np.uint8))  # mode L
