"""The parts of a run folder's path that a config or a command line chooses:
`<expdir>/<name>/<YYYYmmdd_HHMMSS>[_<tag>]/`.

Each part is sanitised (any run of characters other than letters, digits, `_`, `.` and `-`
becomes one `-`), and refused where sanitising cannot make it safe: a name that is empty or
starts with `.` (`.` and `..` would put the run folder outside the experiments folder, and a
hidden folder is one `loom runs` does not list), or a name or tag longer than the file
system takes in one path part. Refused when the config is validated, before anything is
created. A module of its own, imported by `config` (the `name` key) and `engine` (the run
folder): it imports nothing, so `loom runs` stays fast.
"""

from __future__ import annotations

import re

MAX_PART_LENGTH = 100  # characters of a sanitised name or tag (file systems take 255 bytes)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def folder_part(text: str) -> str:
    """`text` as a part of a folder name: each run of unsafe characters becomes `-`."""
    return _UNSAFE.sub("-", text)


def _too_long(part: str) -> str:
    if len(part) > MAX_PART_LENGTH:
        return f"is {len(part)} characters long, more than the {MAX_PART_LENGTH} a run folder takes"
    return ""


def run_name_problem(name: str) -> str:
    """Why `name` cannot name the folder of a pipeline's runs; '' when it can."""
    part = folder_part(name)
    if not part:
        return "is empty"
    if not name.isprintable():  # shown by every command that lists runs
        return "holds a control character"
    if part.startswith("."):
        return (
            f"'{part[:40]}' starts with '.': it would write outside the experiments folder "
            "('.', '..') or hide the runs from loom runs"
        )
    return _too_long(part)


def run_tag_problem(tag: str) -> str:
    """Why `tag` cannot end a run folder's name; '' when it can (an empty tag is none). A
    tag of unsafe characters alone would end every such folder with the same `-`."""
    part = folder_part(tag)
    if tag and not part.strip("-_."):
        return "has no letter or digit to tell the run by"
    return _too_long(part)


def shown(text: str) -> str:
    """`text` quoted for a message, cut to 40 characters."""
    return f"'{text}'" if len(text) <= 40 else f"'{text[:37]}...'"
