"""search.json: what a search folder needs to continue (`loom search --resume DIR`) and to
be read again (`loom report DIR`): the study's storage and name, the monitor, the settings.
The config (config.yaml, merged, overrides applied) and a `--space` file (space.yml) are
copied beside it, so a search continues with what it started with, whatever was edited."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchloom.data.atomic_files import refuse_links, write_text_atomic
from torchloom.data.json_files import read_json
from torchloom.errors import ConfigError
from torchloom.search.settings import SearchSettings
from torchloom.search.storage_urls import has_password, without_password

RECORD = "search.json"
# How a search ranks its parameters (results.importance): PED-ANOVA by default, fANOVA on
# request (it needs scikit-learn). Kept in search.json, so `loom report` ranks them the same.
IMPORTANCE_EVALUATORS = ("ped-anova", "fanova")


@dataclass
class SearchRecord:
    name: str
    study: str
    storage: str
    monitor: str
    mode: str
    trials: int
    settings: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    device: str | None = None
    config: str = "config.yaml"
    space: str | None = None  # space.yml when the space came from --space
    digest: str = ""  # of the config and the space (study.config_digest); "" before it was kept
    importance: str = "ped-anova"  # one of IMPORTANCE_EVALUATORS
    # `storage` with its password, as --storage gave it, for this process and the workers it
    # starts (processes.py hands it over a pipe); never saved nor shown (storage_urls.py).
    storage_with_password: str | None = field(default=None, init=False, repr=False)

    def set_importance(self, evaluator: str | None, search_dir: Path) -> None:
        """Rank the parameters with `evaluator` from now on (None: as before)."""
        if evaluator is not None:
            self.importance = evaluator
            self.save(search_dir)

    @property
    def direction(self) -> str:
        return "maximize" if self.mode == "max" else "minimize"

    def study_identity(self) -> dict[str, str] | None:
        """What the study keeps of the search that made it (study.create_study), to tell it
        from another search's study of the same name; None for a folder that kept none."""
        if not self.digest:
            return None
        return {"monitor": self.monitor, "direction": self.direction, "digest": self.digest}

    def journal_in_folder(self) -> str | None:
        """The path of the storage's journal in the search folder (relative), or None for a
        storage elsewhere."""
        if not self.storage.startswith("journal:"):
            return None
        journal = self.storage[len("journal:") :]
        return None if Path(journal).is_absolute() else journal

    def storage_in_folder(self) -> bool:
        return self.journal_in_folder() is not None

    def storage_url(self, search_dir: Path | None = None) -> str:
        """The storage to open, its password included when this process was given one: a
        journal's relative path is the search folder's (`search_dir`, which a storage
        outside the folder does not need)."""
        if self.storage.startswith("journal:"):
            path = Path(self.storage[len("journal:") :])
            if path.is_absolute():
                return self.storage
            assert search_dir is not None, "a journal in the search folder needs the folder"
            return f"journal:{Path(search_dir).resolve() / path}"
        return self.storage_with_password or self.storage

    def give_storage(self, url: str) -> None:
        """Keep `url` as the storage, its password for this process only."""
        self.storage = without_password(url)
        self.storage_with_password = url if has_password(url) else None

    def search_settings(self) -> SearchSettings:
        return SearchSettings(**self.settings)

    def save(self, search_dir: Path) -> None:
        saved = asdict(self)
        del saved["storage_with_password"]
        write_text_atomic(search_dir / RECORD, json.dumps(saved, indent=2) + "\n")


def check_importance(evaluator: str | None, where: str) -> None:
    """Refuse an unknown importance evaluator before the search begins."""
    if evaluator is not None and evaluator not in IMPORTANCE_EVALUATORS:
        raise ConfigError.at(
            where,
            "importance",
            f"unknown importance evaluator '{evaluator}'",
            f"one of {', '.join(IMPORTANCE_EVALUATORS)}",
        )


def is_search_dir(path: Path) -> bool:
    return (Path(path) / RECORD).is_file()


def read_record(search_dir: Path) -> SearchRecord:
    path = Path(search_dir) / RECORD
    try:
        data = read_json(path)
        record = SearchRecord(**data)
        if not isinstance(record.storage, str):
            raise TypeError(f"its storage is {record.storage!r}, not a URL")
        # A folder of an older torchloom kept the password: used, never shown, and dropped
        # from search.json at its next save.
        record.give_storage(record.storage)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigError.at(
            str(search_dir),
            "search folder",
            f"has no readable {RECORD} ({error})",
            "give a folder that `loom search` made: <expdir>/searches/<name>/<date>",
        ) from error
    _check_in_folder(record, path)
    # trials/, trials.csv, search.html are written into it (its journal: a plain name now)
    refuse_links(Path(search_dir), record.journal_in_folder())
    return record


def _check_in_folder(record: SearchRecord, path: Path) -> None:
    """A search folder may come from someone else: what its record names inside the folder
    is what `loom search` writes there, never a path elsewhere (`"config": "/etc/passwd"`
    was read; `"storage": "journal:../other/study.journal"` resumed into another search's
    study)."""
    files: dict[str, tuple[Any, tuple[Any, ...]]] = {
        "config": (record.config, ("config.yaml", "")),  # "": a code-first search's
        "space": (record.space, (None, "space.yml")),
    }
    journal = record.journal_in_folder()
    if journal is not None:
        # The folder's own journal: `study.journal`, or the plain file name given to
        # `--storage journal:NAME`, which the search made there.
        plain = Path(journal).name == journal and journal not in ("", ".", "..")
        files["storage"] = (journal, (journal,) if plain else ("study.journal",))
    for key, (value, written) in files.items():
        if value not in written:
            raise ConfigError.at(
                str(path),
                key,
                f"is {value!r}: `loom search` writes {' or '.join(repr(w) for w in written)} "
                "there, a file of the search folder",
                "give a folder that `loom search` made, unedited",
            )
