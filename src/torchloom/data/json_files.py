"""Reading the JSON records torchloom writes into its folders (a run's summary.json and lock,
an export's sidecar.json, a search's search.json, a quantized model's report), which may since
have come from someone else: read within a size no record of torchloom reaches, and every way
one can be damaged said in words (`UnreadableJson`), never a traceback. A JSON text nested a
few thousand levels deep made Python's parser raise RecursionError, which no reader caught.
Writing them: atomic_files.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# No record torchloom writes comes near this (a summary of a long run with many statistics
# is a few hundred kilobytes; a sidecar with 20,000 class names, one megabyte).
MAX_RECORD_BYTES = 16_000_000


class UnreadableJson(ValueError):
    """Why a JSON file cannot be read, as words that follow its name ("is not valid JSON:
    ..."); a ValueError, as json's own errors are, for readers that fall back on any."""


def read_json(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """The JSON value in `path`, read only when it has at most `max_bytes`."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(max_bytes + 1) if size <= max_bytes else b""
    except OSError as error:
        raise UnreadableJson(f"cannot be read: {error.strerror or error}") from error
    if size > max_bytes or len(data) > max_bytes:  # or it grew while it was read
        raise UnreadableJson(
            f"has {max(size, len(data)):,} bytes, more than torchloom writes there "
            f"(at most {max_bytes:,} are read)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableJson(f"is not UTF-8 text: {error.reason}") from error
    try:
        return json.loads(text)
    except RecursionError as error:
        raise UnreadableJson("is nested too deeply to be a record torchloom wrote") from error
    except ValueError as error:
        raise UnreadableJson(f"is not valid JSON: {error}") from error
