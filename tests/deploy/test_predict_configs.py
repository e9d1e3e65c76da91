"""Every shipped image and text config with a model, trained a few steps on tiny offline data,
goes through `loom export --format onnx` and `loom predict` as a user runs them: a PNG written
from a test sample for an image pipeline, a line of text for a text pipeline. The printed
labels are the task's class names (every class once with --top as large as the classes), the
probabilities are ordered, sum to 1 and are those of the trained torch graph. Where a config
cannot be exported or predicted, the refusal names the component (or task) and why.

The runs of mnist/lenet5.yml, mnist/ffn.yml and language/bbc_news_bow_ffn.yml are copies of
the session's runs (conftest.py), not trained again. Not covered, as in
test_export_configs.py: configs whose data is not on this machine (translation, CLEVR,
VQA-Med, the transplant of a trained encoder) and the MiniLM pipeline (its pretrained model
takes seconds to load; it is a FeedForwardNetwork after a python-side encoder, as
bbc_news_bow_ffn.yml is).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import torchloom
from cifar_fixtures import write_cifar10
from torchloom.cli.main import main
from torchloom.deploy.graph import InferenceGraph, task_batch
from torchloom.deploy.image_recipe import image_tensor
from torchloom.deploy.run_model import load_trained_run

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TEXT = "Shares fell as the bank reported lower profits and weaker sales in Europe."


@dataclass(frozen=True)
class Case:
    training: str  # the training task's overrides (YAML flow mapping)
    evaluation: str = "{subset: 16}"  # the validation and test tasks' overrides
    export: tuple[str, ...] = ()  # extra `loom export` arguments
    session_run: str | None = None  # a conftest run of this config, copied
    extra: str = ""  # more top-level YAML


MNIST = "{data_folder: MNIST_DATA, subset: 64}"
CIFAR = "{data_folder: CIFAR_DATA, validation_size: 6}"
# SGD at 0.05 on a few random CIFAR-like images drives a ResNet's logits to ~1e4, where float32
# rounding alone exceeds the export check's absolute 1e-4.
SLOWER = "training: {optimizer: {lr: 0.001}}\n"
SORT_OF_CLEVR = "{images: 8, data_folder: DATA/sort_of_clevr}"
PREDICTED = {
    "mnist/lenet5.yml": Case(MNIST, session_run="lenet_run"),
    "mnist/ffn.yml": Case(MNIST, session_run="ffn_run"),
    "mnist/convnet.yml": Case(MNIST),
    "mnist/2lenet5_2losses.yml": Case(MNIST),
    "mnist/kfold.yml": Case(MNIST, evaluation=""),
    "fashion_mnist/lenet5.yml": Case("{subset: 64}"),
    "fashion_mnist/resnet18.yml": Case("{subset: 32}"),
    "cifar10/resnet18.yml": Case(CIFAR, "{validation_size: 6}", extra=SLOWER),
    # 5 of the 20 cells (two of them reductions, as in the 20): the same operations, 15 s
    # here instead of 42 s.
    "nas/darts_v2_cifar10.yml": Case(
        CIFAR, "{validation_size: 6}", extra=SLOWER + "pipeline: {image_classifier: {cells: 5}}\n"
    ),
    "multitask/mnist_shared_encoder_two_heads.yml": Case(MNIST),
    "transplant/mnist_train_encoder.yml": Case(MNIST),
    "language/bbc_news_bow_ffn.yml": Case("", export=("--inputs", "bow"), session_run="bbc_run"),
    "language/language_id_bow.yml": Case("{subset: 200}", "{subset: 40}", ("--inputs", "bow")),
}
# config -> (export arguments, what the refusal names, a phrase of its reason)
EXPORT_REFUSED = {
    "language/bbc_news_embeddings_gru.yml": (
        Case("{subset: 60}", "{subset: 20}", ("--inputs", "word_indices,lengths")),
        "component 'classifier' (RecurrentNeuralNetwork)",
        "torch.onnx.export failed",
    ),
}
PREDICT_REFUSED = {
    "vqa/sort_of_clevr_cnn_mlp.yml": (
        Case(SORT_OF_CLEVR, "{images: 4}"),
        "task (SortOfCLEVR) has no raw-input recipe",
        "feed the graph's input tensors",
    ),
    "vqa/sort_of_clevr_cnn_rn.yml": (
        Case(SORT_OF_CLEVR, "{images: 4}"),
        "task (SortOfCLEVR) has no raw-input recipe",
        "feed the graph's input tensors",
    ),
    "language/language_model_ngram.yml": (
        Case("{subset: 400}", "{subset: 100}", ("--inputs", "word_indices")),
        "component 'context_indexer' (SentenceIndexer)",
        "reads the task's tokens",
    ),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, mnist_data: Path) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("predict_configs")
    write_cifar10(folder / "cifar10")
    return {
        "MNIST_DATA": str(mnist_data),
        "CIFAR_DATA": str(folder / "cifar10"),
        "DATA": str(folder),
    }


def trained(
    name: str, case: Case, data: dict[str, str], folder: Path, request: pytest.FixtureRequest
) -> Path:
    """A run folder of config `name`: a copy of the session's run, or four training steps."""
    if case.session_run is not None:
        source: Path = request.getfixturevalue(case.session_run)
        # without its exports and quantized models: other tests may have made them already
        ignored = shutil.ignore_patterns("exports", "quantized")
        return Path(shutil.copytree(source, folder / "run", ignore=ignored))
    overrides = case.training + "\n" + case.evaluation
    for key, value in data.items():
        overrides = overrides.replace(key, value)
    training, evaluation = overrides.split("\n")
    text = f"default_configs: [{CONFIGS / name}]\ntraining:\n"
    if training:
        text += f"  task: {training}\n"
    text += (
        "  dataloader: {batch_size: 8}\n"
        "  terminal_conditions: {epoch_limit: 1, episode_limit: 4, early_stopping: null}\n"
    )
    for section in ("validation", "test") if evaluation else ():
        text += f"{section}:\n  task: {evaluation}\n  dataloader: {{batch_size: 8}}\n"
    config = folder / "config.yml"
    config.write_text(text, encoding="utf-8")
    if case.extra:  # a later default than the shipped config: it overrides that
        (folder / "extra.yml").write_text(case.extra, encoding="utf-8")
        text = text.replace("]\n", f", {folder / 'extra.yml'}]\n", 1)
        config.write_text(text, encoding="utf-8")
    result = torchloom.train(config, expdir=str(folder / "runs"), analysis=False, tensorboard=0)
    return Path(result.run_dir)


def sample_png(run: Path, record: dict, folder: Path) -> tuple[Path, torch.Tensor]:
    """A PNG of the first test sample (its pixels again: the standardisation undone), and the
    tensor the task gives for it."""
    pipeline = load_trained_run(run).pipeline
    (name,) = [entry["name"] for entry in record["inputs"]]
    sample = task_batch(pipeline, "test", 1)[name][0]
    recipe = record["preprocessing"]
    pixels = sample
    if recipe["normalize"]:
        mean = torch.tensor(recipe["normalize"]["mean"])[:, None, None]
        std = torch.tensor(recipe["normalize"]["std"])[:, None, None]
        pixels = sample * std + mean
    array = (pixels * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    path = folder / "sample.png"
    Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array).save(path)
    return path, sample


def eager_probabilities(run: Path, graph_inputs: dict[str, np.ndarray], kind: str) -> np.ndarray:
    pipeline = load_trained_run(run).pipeline
    graph = InferenceGraph(pipeline, "test", inputs=list(graph_inputs)).eval()
    with torch.no_grad():
        scores = graph(*(torch.from_numpy(graph_inputs[n]) for n in graph.input_names))[0]
    return (scores.exp() if kind == "log-probabilities" else scores.softmax(dim=1))[0].numpy()


def predicted(folder: Path, given: str, capsys: pytest.CaptureFixture[str]) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", str(folder), given, "--top", "100000", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    result = json.loads(line)
    assert result["input"] == given
    return list(result["top"])


@pytest.mark.parametrize("name", sorted(PREDICTED))
def test_shipped_config_exports_and_predicts_raw_inputs(
    name: str,
    data: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = PREDICTED[name]
    run = trained(name, case, data, tmp_path, request)
    assert main(["export", str(run), "--repeats", "1", *case.export]) == 0, capsys.readouterr()
    folder = run / "exports" / "onnx"
    record = json.loads((folder / "sidecar.json").read_text(encoding="utf-8"))
    output = record["outputs"][0]
    assert output["kind"] in ("logits", "log-probabilities"), output
    if record["preprocessing"]["kind"] == "image":
        png, sample = sample_png(run, record, tmp_path)
        tensor = image_tensor(png, record["preprocessing"])
        # The sidecar's recipe gives back the task's tensor, to the PNG's 8-bit rounding.
        std = min((record["preprocessing"]["normalize"] or {"std": [1.0]})["std"])
        assert np.abs(tensor[0] - sample.numpy()).max() <= 0.5 / 255 / std + 1e-5
        given, feed = str(png), {record["inputs"][0]["name"]: tensor}
    else:
        from torchloom.deploy.text_inputs import text_feed

        given, feed = TEXT, text_feed(folder, record, [TEXT])
    top = predicted(folder, given, capsys)
    labels = [entry["label"] for entry in top]
    probabilities = np.array([entry["probability"] for entry in top])
    class_names = load_trained_run(run).pipeline.tasks["test"].class_names
    expected = eager_probabilities(run, feed, output["kind"])
    # Every class once (--top beyond the classes), named as the task names the output's classes
    assert len(labels) == len(expected) and len(set(labels)) == len(labels)
    # (the parity head's two classes are not the task's ten digits: indices)
    task_classes = list(class_names or ())
    assert output.get("labels") == (task_classes if len(expected) == len(task_classes) else None)
    names = output.get("labels") or [str(i) for i in range(len(expected))]
    assert set(labels) == set(names)
    assert np.all(np.diff(probabilities) <= 0) and abs(probabilities.sum() - 1) <= 1e-5
    # ... with the probabilities of the trained torch graph
    assert np.abs(probabilities - expected[[names.index(label) for label in labels]]).max() <= 1e-4


@pytest.mark.parametrize("name", sorted(EXPORT_REFUSED))
def test_shipped_config_whose_export_is_refused_names_the_component(
    name: str,
    data: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case, component, reason = EXPORT_REFUSED[name]
    run = trained(name, case, data, tmp_path, request)
    capsys.readouterr()
    assert main(["export", str(run), "--repeats", "1", *case.export]) == 2
    err = capsys.readouterr().err
    assert component in err and reason in err and "Traceback" not in err
    assert not (run / "exports" / "onnx").exists()


@pytest.mark.parametrize("name", sorted(PREDICT_REFUSED))
def test_shipped_config_predict_cannot_feed_names_what_prevents_it(
    name: str,
    data: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case, component, reason = PREDICT_REFUSED[name]
    run = trained(name, case, data, tmp_path, request)
    assert main(["export", str(run), "--repeats", "1", *case.export]) == 0
    png = tmp_path / "input.png"
    Image.fromarray(np.zeros((75, 75, 3), dtype=np.uint8)).save(png)
    capsys.readouterr()
    given = TEXT if "language/" in name else str(png)
    assert main(["predict", str(run), given]) == 2
    err = capsys.readouterr().err
    assert component in err and reason in err and "Traceback" not in err
