"""SentenceIndexer and LabelIndexer built on their own (pipelines: test_text_pipeline.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams, Task
from torchloom.core.globals_store import GlobalsStore
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError, DataError
from torchloom.zoo.text.indexers import SentenceIndexer
from torchloom.zoo.text.label_indexer import LabelIndexer
from torchloom.zoo.text.vocabulary import EOS, PAD, UNK, Vocabulary


class Texts(Task):
    """A few texts with labels; `texts` comes from the Task base (reads whole samples)."""

    class Params(ComponentParams):
        texts: list[Any] = Field(default_factory=list)
        labels: list[Any] = Field(default_factory=list)

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "inputs": StreamSpec(("batch",), str, "texts"),
            "labels": StreamSpec(("batch",), str, "labels"),
        }

    def __len__(self) -> int:
        return len(self.params.texts)

    def __getitem__(self, index: int) -> Batch:
        return {"inputs": self.params.texts[index], "labels": self.params.labels[index]}


def build(
    cls: type[Component],
    task: Task | None,
    globals: dict[str, Any] | None = None,
    renames: dict[str, str] | None = None,
    **params: Any,
) -> Any:
    store = GlobalsStore()
    for key, value in (globals or {}).items():
        store.publish(key, value, "test")
    context = BuildContext(
        cls.__name__.lower(),
        global_names=renames or {},
        store=store,
        training_task=lambda: task,
    )
    return cls(cls.Params(**params), context)


def texts_task(texts: list[Any], labels: list[Any] | None = None) -> Texts:
    return Texts.create(texts=texts, labels=labels or ["x"] * len(texts))  # type: ignore[return-value]


TEXTS = ["The cat sat", "the cat ran", "A dog sat"]


def test_builds_from_the_training_texts_with_its_tokenization() -> None:
    indexer = build(SentenceIndexer, texts_task(TEXTS))
    assert indexer.vocabulary.words == (PAD, EOS, UNK, "cat", "sat", "the", "a", "dog", "ran")
    store = indexer._context.store
    assert store.get("vocabulary_size", "test") == 9
    assert store.get("word_mappings", "test")["dog"] == 7
    chars = build(SentenceIndexer, texts_task(["abca"]), mode="characters", specials=[])
    assert chars.vocabulary.words == (PAD, "a", "b", "c")


def test_token_lists_are_used_as_they_are() -> None:
    indexer = build(SentenceIndexer, texts_task([["B", "a"], ["B"]]), min_count=2)
    assert indexer.vocabulary.words == (PAD, EOS, UNK, "B")


def test_indices_lengths_padding_eos_and_truncation() -> None:
    indexer = build(SentenceIndexer, texts_task(TEXTS), add_eos=True)
    out = indexer({"tokens": [["the", "cat"], ["dog", "zebra", "sat", "cat"], []]})
    assert out["word_indices"].tolist() == [[5, 3, 1, 0, 0], [7, 2, 4, 3, 1], [1, 0, 0, 0, 0]]
    assert out["lengths"].tolist() == [3, 5, 1]
    assert out["word_indices"].dtype == torch.int64
    fixed = build(SentenceIndexer, texts_task(TEXTS), sequence_length=2)
    out = fixed({"tokens": [["the", "cat", "sat"], ["dog"]]})
    assert out["word_indices"].tolist() == [[5, 3], [7, 0]]
    assert out["lengths"].tolist() == [2, 1]
    assert str(fixed.output_specs()["word_indices"]) == "[batch, 2] int64"
    empty = build(SentenceIndexer, texts_task(TEXTS))({"tokens": [[], []]})
    assert empty["word_indices"].shape == (2, 1)


def test_reverse_maps_indices_back_to_words() -> None:
    forward = build(SentenceIndexer, texts_task(TEXTS), add_eos=True)
    reverse = build(SentenceIndexer, texts_task(TEXTS), reverse=True)
    indices = forward({"tokens": [["the", "cat"], ["a", "dog", "ran"]]})["word_indices"]
    assert reverse({"word_indices": indices}) == {"tokens": [["the", "cat"], ["a", "dog", "ran"]]}
    assert list(reverse.input_specs()) == ["word_indices"]


def test_without_unk_an_unknown_word_is_a_data_error() -> None:
    indexer = build(SentenceIndexer, texts_task(TEXTS), specials=[])
    with pytest.raises(DataError, match="'zebra' is not in the vocabulary"):
        indexer({"tokens": [["zebra"]]})
    with pytest.raises(ComponentError, match="no <EOS> to add"):
        build(SentenceIndexer, texts_task(TEXTS), specials=[UNK], add_eos=True)


def test_reads_a_vocabulary_file(tmp_path: Path) -> None:
    path = tmp_path / "words.txt"
    Vocabulary([PAD, UNK, "b", "a"]).write(path)
    indexer = build(SentenceIndexer, None, vocabulary_file=str(path))
    assert indexer({"tokens": [["a", "c"]]})["word_indices"].tolist() == [[3, 1]]
    assert indexer.artifacts() == {"vocabulary.txt": "<PAD>\n<UNK>\nb\na\n"}


@pytest.mark.parametrize(
    ("content", "params", "message"),
    [
        (None, {}, "cannot read vocabulary file"),
        ("<PAD>\na\na\n", {}, "line 3: 'a' appears twice"),
        ("a\nb\n", {}, "lacks <PAD>"),
    ],
)
def test_file_errors_name_the_key(
    tmp_path: Path, content: str | None, params: dict[str, Any], message: str
) -> None:
    path = tmp_path / "words.txt"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ComponentError, match=message):
        build(SentenceIndexer, None, vocabulary_file=str(path), **params)


def test_build_errors() -> None:
    with pytest.raises(ComponentError, match="no training task"):
        build(SentenceIndexer, None)
    with pytest.raises(ComponentError, match=r"has no stream 'input' \(did you mean 'inputs'\?\)"):
        build(SentenceIndexer, texts_task(TEXTS), build_from="input")
    with pytest.raises(ComponentError, match=r"vocabulary is empty.*3 samples"):
        build(SentenceIndexer, texts_task(["", " ", "!"]), remove_punctuation=True)
    with pytest.raises(ComponentError, match="none of them at least 5 times"):
        build(SentenceIndexer, texts_task(TEXTS), min_count=5)
    with pytest.raises(ComponentError, match="holds int values"):
        build(SentenceIndexer, texts_task([1, 2]))


def test_checkpoint_vocabulary_is_checked() -> None:
    indexer = build(SentenceIndexer, texts_task(TEXTS))
    state = indexer.state_dict()
    assert state["_extra_state"]["vocabulary"][:4] == [PAD, EOS, UNK, "cat"]
    build(SentenceIndexer, texts_task(list(reversed(TEXTS)))).load_state_dict(state)
    other = build(SentenceIndexer, texts_task(["The cat sat"]))  # same first 6 words
    with pytest.raises(ComponentError, match=r"vocabulary differs .*\(9 entries there, 6 here\)"):
        other.load_state_dict(state)
    swapped = build(SentenceIndexer, texts_task(["ran dog a", *TEXTS[:2]]))
    with pytest.raises(ComponentError, match="entry 4 is 'sat' there but 'ran' here"):
        swapped.load_state_dict(state)


def test_label_indexer_from_training_labels_param_and_global() -> None:
    task = texts_task(["a", "b", "c"], ["sport", "business", "sport"])
    built = build(LabelIndexer, task)
    assert built.labels == ("business", "sport")
    out = built({"labels": ["sport", "tech", "business"]})["targets"]
    assert out.tolist() == [1, -100, 0] and out.dtype == torch.int64
    assert build(LabelIndexer, None, labels=["b", "a"])({"labels": ["a"]})["targets"].tolist() == [
        1
    ]
    mnist = {str(d): d for d in range(10)}
    from_global = build(
        LabelIndexer, None, {"label_word_mappings": mnist}, from_global=True, ignore_index=-1
    )
    assert from_global({"labels": ["7", "x"]})["targets"].tolist() == [7, -1]
    store = from_global._context.store
    assert store.get("num_classes", "t") == 10 and store.get("label_mappings", "t")["3"] == 3
    assert str(from_global.output_specs()["targets"]).startswith("[batch] int64")


def test_label_indexer_reverse_renamed_globals_and_errors() -> None:
    reverse = build(
        LabelIndexer, None, labels=["no", "yes"], reverse=True, renames={"num_classes": "answers"}
    )
    assert reverse({"targets": torch.tensor([1, 0, -100, 5])}) == {
        "labels": ["yes", "no", "<UNK>", "<UNK>"]
    }
    assert reverse._context.store.get("answers", "t") == 2
    assert reverse.artifacts() == {"labels.txt": "no\nyes\n"}
    with pytest.raises(ComponentError, match="both give the labels"):
        build(LabelIndexer, None, {"label_word_mappings": {"a": 0}}, labels=["a"], from_global=True)
    with pytest.raises(ComponentError, match=r"indices 0\.\.n-1"):
        build(LabelIndexer, None, {"label_word_mappings": {"a": 1}}, from_global=True)
    with pytest.raises(ComponentError, match="listed twice"):
        build(LabelIndexer, None, labels=["a", "a"])
    with pytest.raises(ComponentError, match="no training task"):
        build(LabelIndexer, None)
    with pytest.raises(ComponentError, match="labels differs"):
        build(LabelIndexer, None, labels=["a", "b"]).load_state_dict(
            build(LabelIndexer, None, labels=["b", "a"]).state_dict()
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_outputs_follow_the_component_to_its_device() -> None:
    indexer = build(SentenceIndexer, texts_task(TEXTS)).to("cuda")
    assert indexer({"tokens": [["the", "cat"]]})["word_indices"].device.type == "cuda"
    labels = build(LabelIndexer, None, labels=["a", "b"]).to("cuda")
    assert labels({"labels": ["b"]})["targets"].device.type == "cuda"


def test_outputs_for_a_gpu_are_made_on_the_host_and_copied_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tensor made on a GPU from a Python list is a copy from pageable memory, which waits
    for the GPU's queue: two such waits a step for each indexer. They are now made on the host
    and copied through `host_to_device` (pinned, non-blocking); the meta device stands in."""
    import torchloom.zoo.text.indexers as indexers
    import torchloom.zoo.text.label_indexer as label_indexer

    made_on: list[Any] = []
    copied: list[str] = []
    original_tensor, original_copy = torch.tensor, indexers.host_to_device

    def tensor(*args: Any, **kwargs: Any) -> torch.Tensor:
        made_on.append(kwargs.get("device"))
        return original_tensor(*args, **kwargs)

    def host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
        copied.append(host.device.type)
        return original_copy(host, device)

    sentences = build(SentenceIndexer, texts_task(TEXTS)).to("meta")
    labels = build(LabelIndexer, None, labels=["a", "b"]).to("meta")
    monkeypatch.setattr(indexers.torch, "tensor", tensor)
    monkeypatch.setattr(indexers, "host_to_device", host_to_device)
    monkeypatch.setattr(label_indexer, "host_to_device", host_to_device)
    out = sentences({"tokens": [["the", "cat"], ["a"]]})
    targets = labels({"labels": ["b", "a"]})["targets"]
    assert made_on == [None, None, None] and copied == ["cpu", "cpu", "cpu"]
    assert {out["word_indices"].device.type, out["lengths"].device.type} == {"meta"}
    assert targets.device.type == "meta"
