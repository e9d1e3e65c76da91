"""Word embeddings: trainable (`IndexEmbeddings`) or initialised from pretrained GloVe /
word2vec vectors (`SentenceEmbeddings`)."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.file_names import READS_A_PATH
from torchloom.core.streams import INTEGER, StreamSpec
from torchloom.data.word_vectors import (
    KNOWN_DOWNLOADS,
    fetch_vectors,
    read_word_vectors,
    vectors_dimension,
)
from torchloom.errors import ComponentError
from torchloom.zoo.text.vocabulary import SPECIALS

_PAD_INDEX = 0  # the SentenceIndexer's <PAD>: its vector is zero and never trained


class IndexEmbeddingsParams(ComponentParams):
    embeddings_size: int = Field(100, gt=0, description="Length of every word vector.")


class IndexEmbeddings(Model):
    """A trainable vector for every vocabulary entry (`torch.nn.Embedding`), <PAD> (index 0)
    staying a zero vector.

    Streams: `word_indices` (int [batch, length]) -> `embeddings` (float32 [batch, length,
    embeddings_size]). Needs `vocabulary_size` (a `SentenceIndexer` publishes it); publishes
    `embeddings_size` for the model that reads the embeddings.

    ```yaml
    pipeline:
      embeddings: {type: IndexEmbeddings, embeddings_size: 64}
      encoder:
        type: RecurrentNeuralNetwork
        streams: {inputs: embeddings}
        globals: {input_size: embeddings_size}
    ```
    """

    Params: ClassVar[type[IndexEmbeddingsParams]] = IndexEmbeddingsParams
    params: IndexEmbeddingsParams
    NEEDS_GLOBALS = {"vocabulary_size": "number of vocabulary entries"}
    PUBLISHES_GLOBALS = {"embeddings_size": "length of every word vector"}
    EXAMPLE_GLOBALS = {"vocabulary_size": 100}

    def __init__(self, params: IndexEmbeddingsParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.vocabulary_size = int(self.global_value("vocabulary_size"))
        self.embeddings = nn.Embedding(
            self.vocabulary_size, params.embeddings_size, padding_idx=_PAD_INDEX
        )
        self.publish_global("embeddings_size", params.embeddings_size)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"word_indices": StreamSpec(("batch", -1), INTEGER, "word indices")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "embeddings": StreamSpec(
                ("batch", -1, self.params.embeddings_size), torch.float32, "word vectors"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        return {"embeddings": self.embeddings(inputs["word_indices"].long())}


class SentenceEmbeddingsParams(IndexEmbeddingsParams):
    pretrained_file: str = Field(
        description="GloVe or word2vec text file (.txt, .txt.gz, or a .zip such as "
        "glove.6B.zip); `~` is expanded. Its dimension must be `embeddings_size`.",
        json_schema_extra=READS_A_PATH,
    )
    pretrained_member: str | None = Field(
        None,
        description="File inside a .zip to read; null: its only text file, or the one whose "
        "name has the dimension (glove.6B.zip: glove.6B.<embeddings_size>d.txt).",
    )
    download: bool = Field(
        False,
        description="Download a missing `pretrained_file` named glove.6B.zip (822 MB) into "
        "its folder, checked by md5.",
    )
    missing_words: Literal["normal", "zeros"] = Field(
        "normal",
        description="Initial vector of a word the file lacks (and of <EOS>, <UNK>): seeded "
        "normal values, or zeros.",
    )
    missing_std: float | None = Field(
        None,
        gt=0,
        description="Standard deviation of those normal values; null: that of the "
        "pretrained vectors found, so the new vectors have their scale.",
    )
    seed: int = Field(0, description="Seed of the normal values: the same on every machine.")
    freeze_pretrained: bool = Field(
        False,
        description="Keep the vectors read from the file fixed; only the other words' vectors "
        "train (freeze the whole component with `freeze: true`).",
    )


class SentenceEmbeddings(IndexEmbeddings):
    """Word embeddings initialised from pretrained GloVe or word2vec vectors.

    Reads `pretrained_file` once when the pipeline is built (streaming it and keeping only
    the vocabulary's words, so any file size fits in memory), checks that its dimension is
    `embeddings_size`, and copies the vector of every vocabulary word it finds (trying the
    lower-cased word too). Other words get seeded normal values or zeros; <PAD> is zero.
    The coverage ("N of M words (x%) found in FILE") is logged and kept as `coverage`.
    With `freeze_pretrained: true` the pretrained vectors stay fixed and only the others
    train. Streams and globals as `IndexEmbeddings`, plus the global `word_mappings`.

    ```yaml
    pipeline:
      embeddings:
        type: SentenceEmbeddings
        embeddings_size: 100
        pretrained_file: ~/data/glove/glove.6B.zip   # reads glove.6B.100d.txt from it
        download: true
        freeze_pretrained: true
    ```
    """

    Params = SentenceEmbeddingsParams
    params: SentenceEmbeddingsParams
    NEEDS_GLOBALS = {
        "vocabulary_size": "number of vocabulary entries",
        "word_mappings": "word -> index of every vocabulary entry",
    }
    pretrained_mask: torch.Tensor
    pretrained_vectors: torch.Tensor

    def __init__(self, params: SentenceEmbeddingsParams, context: BuildContext) -> None:
        super().__init__(params, context)
        mappings = self.global_value("word_mappings")
        size = params.embeddings_size
        path = self._vector_file()
        dimension = vectors_dimension(path, params.pretrained_member, size)
        if dimension != size:
            raise ComponentError.at(
                self.where("embeddings_size"),
                self.label,
                f"'{path}' holds {dimension}-dimensional vectors but embeddings_size is {size}",
                f"set embeddings_size: {dimension}, or choose a file of {size} "
                "dimensions (pretrained_file / pretrained_member)",
            )
        words = [w for w in mappings if w not in SPECIALS]
        wanted = set(words) | {w.lower() for w in words}
        read = read_word_vectors(path, wanted, size, params.pretrained_member)
        weight, mask = self._initial_weights(mappings, read.vectors)
        with torch.no_grad():
            self.embeddings.weight.copy_(weight)
        found = int(mask.sum())
        share = 100.0 * found / len(words) if words else 0.0
        self.coverage = (found, len(words))
        self.coverage_text = f"{found} of {len(words)} words ({share:.1f}%) found in {read.source}"
        self.note(self.coverage_text)
        if params.freeze_pretrained:
            self.register_buffer("pretrained_mask", mask)
            self.register_buffer("pretrained_vectors", weight * mask[:, None])

    def _vector_file(self) -> Path:
        path = Path(self.params.pretrained_file).expanduser()
        if path.is_file():
            return path
        if self.params.download and path.name in KNOWN_DOWNLOADS:
            return fetch_vectors(path, allow_download=True)
        known = " or ".join(KNOWN_DOWNLOADS)
        raise ComponentError.at(
            self.where("pretrained_file"),
            self.label,
            f"word-vector file '{path}' does not exist",
            f"set `download: true` for {known}, or get a GloVe / word2vec text file"
            if path.name in KNOWN_DOWNLOADS
            else "give a GloVe or word2vec text file (e.g. glove.6B.zip from "
            "https://nlp.stanford.edu/projects/glove/)",
        )

    def _initial_weights(
        self, mappings: Mapping[str, int], vectors: Mapping[str, array[float]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [vocabulary, size], mask of the rows that came from the file)."""
        size = self.params.embeddings_size
        rows: dict[int, array[float]] = {}
        for word, index in mappings.items():
            vector = vectors.get(word) if word not in SPECIALS else None
            vector = vector if vector is not None else vectors.get(word.lower())
            if vector is not None and word not in SPECIALS and 0 <= index < self.vocabulary_size:
                rows[index] = vector
        mask = torch.zeros(self.vocabulary_size, dtype=torch.bool)
        weight = torch.zeros(self.vocabulary_size, size)
        if rows:
            indices = torch.tensor(sorted(rows))
            weight[indices] = torch.stack(
                [torch.frombuffer(rows[i], dtype=torch.float32) for i in sorted(rows)]
            )
            mask[indices] = True
        if self.params.missing_words == "normal":
            std = self.params.missing_std
            if std is None:
                found = weight[mask]
                std = float(found.std()) if found.numel() > 1 else 1.0
            generator = torch.Generator().manual_seed(self.params.seed)
            normal = torch.randn(self.vocabulary_size, size, generator=generator) * std
            weight = torch.where(mask[:, None], weight, normal)
        weight[_PAD_INDEX] = 0.0
        mask[_PAD_INDEX] = False
        return weight, mask

    def forward(self, inputs: Batch) -> Batch:
        if not self.params.freeze_pretrained:
            return super().forward(inputs)
        # The pretrained rows come from a buffer, so no gradient (nor weight decay) reaches
        # them; the trainable rows are the embedding's own.
        weight = torch.where(
            self.pretrained_mask[:, None], self.pretrained_vectors, self.embeddings.weight
        )
        indices = inputs["word_indices"].long()
        return {"embeddings": F.embedding(indices, weight, padding_idx=_PAD_INDEX)}
