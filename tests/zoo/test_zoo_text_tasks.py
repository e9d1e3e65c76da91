"""The language tasks on small files written here in the real formats (BBC News class folders,
CSV/TSV, WiLI-2018, chatterbot-corpus YAML, WikiText, manythings.org pairs), plus the packaged
BBC News and chatterbot-corpus copies: streams, seeded splits that never overlap, and the
errors that name the file."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import torch

from torchloom.data.text_sources import collate_text_samples, dedupe_key, split_positions
from torchloom.errors import ComponentError, DataError
from torchloom.zoo.tasks.language_identification import LanguageIdentification
from torchloom.zoo.tasks.language_modeling import LanguageModeling
from torchloom.zoo.tasks.text_classification import TextClassification
from torchloom.zoo.tasks.translation import TranslationPairs

SPLITS = ("train", "validation", "test")


def text_task(**params: object) -> TextClassification:
    task = TextClassification.create(**params)
    assert isinstance(task, TextClassification)
    return task


# ---- the shared helpers -----------------------------------------------------------------------
def test_split_positions_are_stratified_disjoint_and_seeded() -> None:
    classes = [0] * 10 + [1] * 20
    parts = {s: split_positions(classes, s, 0.2, 0.3, seed=5) for s in SPLITS}
    assert [len(parts[s]) for s in SPLITS] == [15, 6, 9]
    assert sorted(parts["train"] + parts["validation"] + parts["test"]) == list(range(30))
    assert sorted(classes[i] for i in parts["test"]) == [0] * 3 + [1] * 6
    assert split_positions(classes, "test", 0.2, 0.3, seed=5) == parts["test"]
    assert split_positions(classes, "test", 0.2, 0.3, seed=6) != parts["test"]


def test_collate_keeps_text_as_lists() -> None:
    batch = collate_text_samples(
        [{"i": 0, "t": "a b", "w": ["a", "b"]}, {"i": 3, "t": "c", "w": ["c", "d"]}]
    )
    assert batch["i"].dtype == torch.int64 and batch["i"].tolist() == [0, 3]
    assert batch["t"] == ["a b", "c"] and batch["w"] == [["a", "b"], ["c", "d"]]
    assert dedupe_key(" Hello\u00a0 World! ") == dedupe_key("hello world!")


# ---- TextClassification -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def news(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("news")
    for name, count in (("tech", 10), ("sport", 20)):
        (root / name).mkdir()
        for i in range(count):
            (root / name / f"{i:03d}.txt").write_text(f"{name} story {i}\n\nbody {i}\n")
    (root / "sport" / "notes.md").write_text("not a document")
    (root / ".cache").mkdir()
    return root


def test_class_folders_streams_and_globals(news: Path) -> None:
    task = text_task(data_folder=str(news), validation_fraction=0.2, test_fraction=0.3)
    assert task.global_value("label_word_mappings") == {"sport": 0, "tech": 1}
    assert task.global_value("num_classes") == 2 and task.dimension_sizes() == {"classes": 2}
    assert len(task) == 15
    sample = task[0]
    assert sample["inputs"].startswith(sample["labels"]) and sample["indices"] == 0
    assert task.class_names[sample["targets"]] == sample["labels"]
    batch = task.collate([task[0], task[1]])
    assert batch["targets"].dtype == torch.int64 and isinstance(batch["inputs"], list)
    assert list(task.texts("inputs")) == [task[i]["inputs"] for i in range(len(task))]
    assert task.sample_targets().bincount().tolist() == [10, 5]
    specs = task.output_specs()
    assert specs["inputs"].dtypes == (str,) and specs["targets"].dtypes == (torch.int64,)


def test_class_folder_splits_never_overlap(news: Path) -> None:
    fractions = {"validation_fraction": 0.2, "test_fraction": 0.3}
    texts = {}
    for split in SPLITS:
        task = text_task(data_folder=str(news), split=split, **fractions)
        texts[split] = set(task.texts("inputs"))
    assert [len(texts[s]) for s in SPLITS] == [15, 6, 9]
    assert not texts["train"] & texts["test"] and not texts["validation"] & texts["test"]
    assert not texts["train"] & texts["validation"]
    again = text_task(data_folder=str(news), split="test", **fractions)
    assert set(again.texts("inputs")) == texts["test"]
    subset = text_task(data_folder=str(news), subset=4, **fractions)
    assert (
        list(subset.texts("inputs"))
        == list(text_task(data_folder=str(news), **fractions).texts("inputs"))[:4]
    )


def test_latin1_file_is_named_unless_a_fallback_is_given(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "1.txt").write_text(f"{name} text", encoding="utf-8")
    (tmp_path / "b" / "2.txt").write_bytes("costs \u00a315".encode("latin-1"))
    params = {"data_folder": str(tmp_path), "validation_fraction": 0.0, "test_fraction": 0.0}
    with pytest.raises(DataError, match=r"2\.txt.*not valid utf-8.*0xa3.*fallback_encoding"):
        text_task(**params).prepare()
    texts = set(text_task(fallback_encoding="latin-1", **params).texts("inputs"))
    assert "costs \u00a315" in texts
    with pytest.raises(pydantic.ValidationError, match="unknown text encoding"):
        text_task(encoding="utf-9", **params)


def test_missing_folder_names_the_layout_and_the_source(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing.*does not exist.*sub-folder per class.*ucd"):
        text_task(data_folder=str(tmp_path / "missing"), packaged=False)
    # Given classes, building touches nothing; reading then names the missing folder.
    task = text_task(data_folder=str(tmp_path / "missing"), packaged=False, classes=["a", "b"])
    with pytest.raises(DataError, match="does not exist"):
        task.prepare()
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=r"class 'a'.*no documents"):
        text_task(data_folder=str(tmp_path / "empty")).prepare()
    with pytest.raises(ComponentError, match="repeated"):
        text_task(data_folder=str(tmp_path), classes=["a", "a"])


def test_csv_and_tsv_files(tmp_path: Path) -> None:
    rows = [f'"text {i}, with a comma",{"pos" if i % 2 else "neg"}' for i in range(20)]
    (tmp_path / "reviews.csv").write_text(
        "label_x,text,label\n" + "\n".join(f"x,{row}" for row in rows) + "\n\n"
    )
    task = text_task(
        data_folder=str(tmp_path), file="reviews.csv", validation_fraction=0.0, test_fraction=0.0
    )
    assert task.class_names == ["neg", "pos"] and len(task) == 20
    assert all(task[i]["inputs"].endswith("with a comma") for i in range(20))
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f'{"b" if i < 3 else "a"}\tsay "{i}"\n' for i in range(6)))
    task = text_task(
        data_folder=str(tmp_path / "elsewhere"),
        file=str(tsv),
        header=False,
        text_column=1,
        label_column=0,
        validation_fraction=0.0,
        test_fraction=0.0,
    )
    assert sorted(task.texts("inputs")) == [f'say "{i}"' for i in range(6)]
    assert sorted(task.texts("labels")) == ["a"] * 3 + ["b"] * 3
    with pytest.raises(DataError, match=r"no column 'body' \(the text_column\).*header is"):
        text_task(data_folder=str(tmp_path), file="reviews.csv", text_column="body")
    with pytest.raises(DataError, match=r"labels that are not among the classes: \['pos'\]"):
        text_task(data_folder=str(tmp_path), file="reviews.csv", classes=["neg"]).prepare()
    with pytest.raises(pydantic.ValidationError, match="must be indices"):
        text_task(data_folder=str(tmp_path), file="pairs.tsv", header=False)
    # An empty label was a class of its own (''), shifting every other class's index.
    (tmp_path / "unlabelled.csv").write_text("text,label\na text,a\nno label here,\nb text,b\n")
    with pytest.raises(DataError, match=r"unlabelled\.csv:3: data file: row has an empty label"):
        text_task(data_folder=str(tmp_path), file="unlabelled.csv")


def test_a_section_that_draws_another_split_of_the_collection_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A validation_fraction of 0.2 in the validation section alone drew another split of
    BBC News: 236 of its 444 articles were training ones."""
    from torchloom.cli.main import main

    config = "loom://language/bbc_news_bow_ffn.yml"
    assert main(["check", config, "++validation.task.validation_fraction=0.2"]) == 2
    error = capsys.readouterr().err
    assert "validation_fraction is 0.2 where the training task's is 0.1" in error
    assert main(["check", config, "++test.task.split_seed=3"]) == 2
    assert main(["check", config]) == 0


def test_packaged_bbc_news_when_the_folder_is_missing(tmp_path: Path) -> None:
    params = {"data_folder": str(tmp_path / "bbc"), "fallback_encoding": "latin-1"}
    tasks = {split: text_task(split=split, **params) for split in SPLITS}
    names = ["business", "entertainment", "politics", "sports", "tech"]
    assert tasks["train"].class_names == names
    texts = {split: set(task.texts("inputs")) for split, task in tasks.items()}
    # 2,225 articles, 101 of them repeats: one copy of each is kept, so that no article is in
    # two splits (15 validation and 27 test articles were training ones).
    assert sum(len(task) for task in tasks.values()) == 2124
    assert len(texts["train"] | texts["validation"] | texts["test"]) == 2124
    assert not texts["train"] & (texts["validation"] | texts["test"])
    assert not texts["validation"] & texts["test"]
    assert tasks["test"].sample_targets().bincount().tolist() == [101, 74, 81, 100, 69]
    assert any("\u00a3" in text for text in texts["train"] | texts["validation"] | texts["test"])


# ---- LanguageIdentification -------------------------------------------------------------------
def write_wili(folder: Path) -> None:
    train = [(f"english sentence {i}", "eng") for i in range(10)]
    train += [(f"deutscher Satz {i}", "deu") for i in range(10)]
    train += [("shared line", "eng"), ("Shared  LINE", "deu"), ("in both", "eng")]
    train.append(("has a\u2028line separator", "deu"))
    test = [("in both", "eng"), ("english test", "eng"), ("deutscher Test", "deu")]
    for part, pairs in (("train", train), ("test", test)):
        (folder / f"x_{part}.txt").write_text("".join(f"{x}\n" for x, _ in pairs))
        (folder / f"y_{part}.txt").write_text("".join(f"{y}\n" for _, y in pairs))


def test_wili_format_dedupes_and_keeps_test_sentences_out_of_training(tmp_path: Path) -> None:
    write_wili(tmp_path)

    def create(split: str) -> LanguageIdentification:
        task = LanguageIdentification.create(
            format="wili", data_folder=str(tmp_path), split=split, validation_fraction=0.2
        )
        assert isinstance(task, LanguageIdentification)
        return task

    tasks = {split: create(split) for split in SPLITS}
    assert tasks["train"].global_value("label_word_mappings") == {"deu": 0, "eng": 1}
    texts = {split: list(task.texts("inputs")) for split, task in tasks.items()}
    assert sorted(texts["test"]) == ["deutscher Test", "english test", "in both"]
    # 10 + 10, the separator line; "in both" is a test sentence; "shared line" is ambiguous
    assert len(texts["train"]) + len(texts["validation"]) == 21
    # one sentence, not two lines (its separator becomes a space, as every run of spaces)
    assert "has a line separator" in texts["train"] + texts["validation"]
    assert len(texts["validation"]) == 4 and not set(texts["train"]) & set(texts["validation"])
    assert not any("shared" in text.lower() for text in texts["train"] + texts["validation"])
    labels = dict(zip(tasks["test"].texts("inputs"), tasks["test"].texts("labels"), strict=True))
    assert labels["deutscher Test"] == "deu"
    with pytest.raises(pydantic.ValidationError, match="test_fraction does not apply"):
        LanguageIdentification.create(format="wili", data_folder=str(tmp_path), test_fraction=0.1)
    (tmp_path / "y_test.txt").write_text("eng\n")
    with pytest.raises(DataError, match=r"x_test.txt.*3 lines but y_test.txt has 1"):
        create("test").prepare()


def test_a_blank_line_in_both_wili_files_is_no_language(tmp_path: Path) -> None:
    """A blank last line in x_train.txt and y_train.txt made '' a language; the task then
    failed, telling the user to check `languages`, which they had not set."""
    write_wili(tmp_path)
    for name in ("x_train.txt", "y_train.txt"):
        with (tmp_path / name).open("a", encoding="utf-8") as file:
            file.write("\n")
    task = LanguageIdentification.create(format="wili", data_folder=str(tmp_path))
    assert task.global_value("label_word_mappings") == {"deu": 0, "eng": 1}
    task.prepare()
    assert "" not in set(task.texts("labels"))


def test_wili_missing_files_say_where_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"y_train.txt.*missing.*WiLI-2018.*zenodo"):
        LanguageIdentification.create(format="wili", data_folder=str(tmp_path))
    task = LanguageIdentification.create(
        format="wili", data_folder=str(tmp_path), languages=["eng", "deu"]
    )
    with pytest.raises(DataError, match=r"x_test.txt.*missing.*zenodo"):
        task.prepare()


def write_chatterbot(folder: Path) -> None:
    conversations = {
        "english": ["- - Hello there\n  - How are you?\n", "- - Fine thanks\n  - yes\n"],
        "spanish": ["- - Hola amigo\n  - ¿Cómo estás?\n", "- - hello there\n  - 42\n"],
    }
    for language, items in conversations.items():
        (folder / language).mkdir()
        for i, item in enumerate(items):
            text = f"categories:\n- talk\nconversations:\n{item}"
            (folder / language / f"topic{i}.yml").write_text(text, encoding="utf-8")


def test_chatterbot_lines_are_samples_of_their_folder_language(tmp_path: Path) -> None:
    write_chatterbot(tmp_path)
    task = LanguageIdentification.create(
        format="chatterbot",
        data_folder=str(tmp_path),
        languages=["spanish", "english"],
        validation_fraction=0.0,
        test_fraction=0.0,
    )
    assert isinstance(task, LanguageIdentification)
    pairs = sorted(zip(task.texts("inputs"), task.texts("labels"), strict=True))
    # "hello there" is under both languages: dropped; `yes` and 42 are not strings in YAML.
    assert pairs == [
        ("Fine thanks", "english"),
        ("Hola amigo", "spanish"),
        ("How are you?", "english"),
        ("¿Cómo estás?", "spanish"),
    ]
    assert task.global_value("label_word_mappings") == {"spanish": 0, "english": 1}
    missing = LanguageIdentification.create(
        format="chatterbot", data_folder=str(tmp_path), languages=["english", "klingon"]
    )
    with pytest.raises(DataError, match=r"language 'klingon'.*found there: english, spanish"):
        missing.prepare()
    (tmp_path / "english" / "broken.yml").write_text("conversations: [[unclosed\n")
    with pytest.raises(DataError, match=r"broken.yml.*cannot be read"):
        LanguageIdentification.create(
            format="chatterbot", data_folder=str(tmp_path), languages=["english", "spanish"]
        ).prepare()


def test_packaged_chatterbot_corpus_splits_never_share_a_sentence() -> None:
    tasks = {split: LanguageIdentification.create(split=split) for split in SPLITS}
    names = tasks["train"].global_value("label_word_mappings")
    assert len(names) >= 10 and "english" in names and "telugu" not in names
    keys = {split: {dedupe_key(t) for t in task.texts("inputs")} for split, task in tasks.items()}
    assert not keys["train"] & keys["test"] and not keys["validation"] & keys["test"]
    assert not keys["train"] & keys["validation"]
    test_counts = tasks["test"].sample_targets().bincount(minlength=len(names))
    assert int(test_counts.min()) >= 30  # every language is in the test split, in earnest


# ---- LanguageModeling -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wikitext(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wikitext")
    (root / "wiki.train.tokens").write_text(" \n = Title = \n \n the cat sat on the mat . \n")
    (root / "wiki.valid.tokens").write_text(" a b c d e f g \n")
    (root / "wiki.test.tokens").write_text(" x y \n")
    return root


def test_ngram_mode_context_and_next_word(wikitext: Path) -> None:
    task = LanguageModeling.create(data_folder=str(wikitext), ngram_size=3)
    assert isinstance(task, LanguageModeling)
    words = ["=", "Title", "=", "<eos>", "the", "cat", "sat", "on", "the", "mat", ".", "<eos>"]
    assert task.corpus_words() == words
    assert len(task) == len(words) - 2
    assert task[0] == {"indices": 0, "inputs": "= Title", "tokens": ["=", "Title"], "labels": "="}
    assert task[-1]["tokens"] == ["mat", "."] and task[-1]["labels"] == "<eos>"
    assert list(task.texts("labels")) == words[2:]
    batch = task.collate([task[0], task[1]])
    assert batch["tokens"] == [["=", "Title"], ["Title", "="]] and batch["labels"] == ["=", "<eos>"]
    assert task.output_specs()["tokens"].shape_text() == "[batch, 2]"


def test_sequence_mode_targets_are_shifted_by_one(wikitext: Path) -> None:
    task = LanguageModeling.create(
        data_folder=str(wikitext), split="validation", mode="sequence", sequence_length=3
    )
    # a..g and <eos>: windows start every 3 words while a next word is left
    assert [s["tokens"] for s in (task[0], task[1])] == [["a", "b", "c"], ["d", "e", "f"]]
    assert task[1]["target_tokens"] == ["e", "f", "g"] and len(task) == 2
    overlapping = LanguageModeling.create(
        data_folder=str(wikitext), split="validation", mode="sequence", sequence_length=3, stride=1
    )
    assert len(overlapping) == 5 and overlapping[4]["target_tokens"] == ["f", "g", "<eos>"]
    assert "labels" not in overlapping.output_specs()
    assert list(overlapping.texts("target_tokens"))[1] == ["c", "d", "e"]
    with pytest.raises(DataError, match=r"2 words.*too few"):
        LanguageModeling.create(
            data_folder=str(wikitext), split="test", ngram_size=3, end_of_line=None
        ).prepare()


def test_a_document_repeated_in_a_corpus_is_in_one_split_only(tmp_path: Path) -> None:
    """BBC News holds 101 repeated articles: copies fell in training and in test alike."""
    for i in range(10):
        (tmp_path / f"doc{i}.txt").write_text(f"Document {i} says: hello, world!\n")
    for i in range(10):
        (tmp_path / f"copy{i}.txt").write_text("A repeated story.\n")
    params = {"format": "text", "data_folder": str(tmp_path), "tokenizer": "words"}
    corpora = {s: LanguageModeling.create(split=s, **params).corpus_words() for s in SPLITS}
    assert sum(corpora[s].count("repeated") for s in SPLITS) == 1


def test_plain_text_corpus_splits_by_document(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"doc{i}.txt").write_text(f"Document {i} says: hello, world!\n")
    params = {"format": "text", "data_folder": str(tmp_path), "tokenizer": "words"}
    corpora = {s: LanguageModeling.create(split=s, **params).corpus_words() for s in SPLITS}
    assert [corpora[s].count("Document") for s in SPLITS] == [8, 1, 1]
    numbers = {s: {w for w in words if w.isdigit()} for s, words in corpora.items()}
    assert not numbers["train"] & numbers["test"] and not numbers["validation"] & numbers["test"]
    assert corpora["test"][2:] == ["says", ":", "hello", ",", "world", "!", "<eos>"]
    single = tmp_path / "lines.txt"
    single.write_text("One two\n\nthree four\nfive six\n")
    words = LanguageModeling.create(
        format="text",
        data_folder=str(single),
        lowercase=True,
        validation_fraction=0.0,
        test_fraction=0.0,
    ).corpus_words()
    assert sorted(words) == sorted(["one", "two", "three", "four", "five", "six", *["<eos>"] * 3])


def test_language_modeling_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"wiki.valid.tokens.*missing.*WikiText"):
        LanguageModeling.create(data_folder=str(tmp_path), split="validation").prepare()
    with pytest.raises(DataError, match=r"does not exist.*packaged: true"):
        LanguageModeling.create(format="text", data_folder=str(tmp_path / "none")).prepare()
    with pytest.raises(ComponentError, match="format text only"):
        LanguageModeling.create(packaged=True)


def test_packaged_bbc_news_as_a_plain_text_corpus(tmp_path: Path) -> None:
    task = LanguageModeling.create(
        format="text",
        data_folder=str(tmp_path / "missing"),
        packaged=True,
        fallback_encoding="latin-1",
        split="test",
        test_fraction=0.05,
        ngram_size=4,
    )
    assert len(task) > 20_000 and len(task[0]["tokens"]) == 3


# ---- TranslationPairs -------------------------------------------------------------------------
MANYTHINGS = [
    ("Go.", "Va !"),
    ("Go.", "Marche."),
    ("Go.", "Bouge !"),
    ("I am cold.", "J'ai froid."),
    ("I am tired.", "Je suis fatigué."),
    ("He is here.", "Il est ici."),
    ("I'm sure it's going to be a really long day today.", "Ce sera une très longue journée."),
] + [(f"I am number {i}.", f"Je suis le numéro {i}.") for i in range(20)]


def write_pairs(folder: Path) -> Path:
    path = folder / "eng-fra.txt"
    attribution = "CC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wild_Cat)"
    path.write_text("".join(f"{e}\t{f}\t{attribution}\n" for e, f in MANYTHINGS))
    return path


def test_translation_pairs_streams_filters_and_normalisation(tmp_path: Path) -> None:
    write_pairs(tmp_path)
    params = {"data_folder": str(tmp_path), "validation_fraction": 0.0, "test_fraction": 0.0}
    task = TranslationPairs.create(**params)
    assert isinstance(task, TranslationPairs)
    assert len(task) == len(MANYTHINGS)
    pairs = set(zip(task.texts("inputs"), task.texts("references"), strict=True))
    assert ("I am tired.", "Je suis fatigué.") in pairs
    batch = task.collate([task[0], task[1]])
    assert isinstance(batch["inputs"], list) and batch["indices"].tolist() == [0, 1]
    french = TranslationPairs.create(
        reverse=True, lowercase=True, normalization="ascii", max_length=6, **params
    )
    pairs = set(zip(french.texts("inputs"), french.texts("references"), strict=True))
    assert ("je suis fatigue.", "i am tired.") in pairs
    assert len(pairs) == len(MANYTHINGS) - 1  # the long day has 12 English tokens
    prefixed = TranslationPairs.create(source_prefixes=["I am", "He is"], **params)
    assert len(prefixed) == 23
    english = TranslationPairs.create(reverse=True, target_prefixes=["He is"], **params)
    assert list(english.texts("inputs")) == ["Il est ici."]


def test_translation_splits_keep_each_source_sentence_in_one_split(tmp_path: Path) -> None:
    write_pairs(tmp_path)
    tasks = {
        s: TranslationPairs.create(
            data_folder=str(tmp_path), split=s, validation_fraction=0.3, test_fraction=0.3
        )
        for s in SPLITS
    }
    sources = {s: list(task.texts("inputs")) for s, task in tasks.items()}
    assert sum(len(v) for v in sources.values()) == len(MANYTHINGS)
    assert not set(sources["train"]) & set(sources["test"])
    assert not set(sources["validation"]) & (set(sources["test"]) | set(sources["train"]))
    go = [s for s, v in sources.items() if "Go." in v]
    assert len(go) == 1 and sources[go[0]].count("Go.") == 3


def test_translation_errors_name_the_file_and_the_source(tmp_path: Path) -> None:
    task = TranslationPairs.create(data_folder=str(tmp_path))
    with pytest.raises(DataError, match=r"eng-fra.txt.*missing.*tab.*manythings.org/anki"):
        task.prepare()
    (tmp_path / "eng-fra.txt").write_text("Go.\tVa !\nno tab here\n")
    with pytest.raises(DataError, match=r"eng-fra.txt:2.*not a tab-separated sentence pair"):
        TranslationPairs.create(data_folder=str(tmp_path)).prepare()
