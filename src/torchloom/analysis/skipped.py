"""Analysis items that cannot run say so, once: one line in run.log and an entry in
`reports/skipped.json` ({item: why}), which report.html shows at the top of the page. An item
that is on (by the preset or the config) and writes nothing must never look like an item that
ran and found nothing to say.

`say_skipped` is idempotent per item and reason: a resumed run, or a hook that meets the same
problem on every batch, writes the line once. Imports no torch (`loom report` reads the file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torchloom.data.atomic_files import write_text_atomic
from torchloom.data.json_files import UnreadableJson, read_json

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

SKIPPED_FILE = "skipped.json"
MAX_SKIPPED_BYTES = 1_000_000


def read_skipped(run_dir: Path) -> dict[str, str]:
    """{item: why it did not run} of a run folder ({} when every item ran)."""
    path = run_dir / "reports" / SKIPPED_FILE
    try:
        data = read_json(path, MAX_SKIPPED_BYTES)  # a line per analysis item, as written
    except UnreadableJson:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(item): str(why) for item, why in data.items()}


def say_skipped(run: RunView, items: Sequence[str], why: str) -> None:
    """Record that these items (e.g. `augmentation`, or `worst_samples (output 'logits')`) did
    not run and why, with what to set to make them run: one warning line for all of them.
    Rank 0 alone says it: a hook that runs in every process meets the same problem in each."""
    if not run.distributed.main:
        return
    known = read_skipped(run.run_dir)
    new = [item for item in items if known.get(item) != why]
    if not new:
        return
    run.log.warning("analysis: %s skipped: %s", ", ".join(new), why)
    known.update(dict.fromkeys(new, why))
    folder = run.run_dir / "reports"
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / SKIPPED_FILE, json.dumps(known, indent=2) + "\n")
