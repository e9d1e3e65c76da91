"""`loom export` (ONNX checked in ONNX Runtime, pt2, safetensors) and `loom predict` on image
files, and the bad inputs that must stop them plainly (exit 2) without touching results."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from export_copies import digit_png, edit_sidecar, export_copy
from torchloom.cli.main import main
from torchloom.deploy.graph import InferenceGraph, task_batch
from torchloom.deploy.run_model import load_trained_run


def report_of(folder: Path) -> dict:
    return json.loads((folder / "export_report.json").read_text(encoding="utf-8"))


def test_onnx_export_matches_torch_in_onnx_runtime(onnx_folder: Path) -> None:
    report = report_of(onnx_folder)
    check = report["check"]
    assert check["tolerance"] == 1e-4
    assert check["max_abs_difference"] <= 1e-4
    assert check["samples"] == 128
    assert check["section"] == "test"  # the split the check batches came from
    assert (
        "real batches of the test split: max abs" in (onnx_folder / "export_report.md").read_text()
    )
    assert list(report["graph"]["inputs"]) == ["inputs"] and report["graph"]["outputs"] == [
        "predictions"
    ]
    assert set(report["latency_ms"]) == {"1", "32"}
    sidecar = json.loads((onnx_folder / "sidecar.json").read_text(encoding="utf-8"))
    assert sidecar["labels"] == [str(d) for d in range(10)]
    assert sidecar["preprocessing"]["normalize"] == {"mean": [0.1307], "std": [0.3081]}
    assert sidecar["outputs"][0]["kind"] == "log-probabilities"


def test_int8_onnx_is_smaller_and_agrees_with_float(onnx_folder: Path) -> None:
    int8 = report_of(onnx_folder)["int8"]
    assert (onnx_folder / "model_int8.onnx").stat().st_size == int8["bytes"]
    assert int8["bytes"] < 0.4 * int8["float_bytes"]
    assert int8["calibration_samples"] == 256
    assert int8["top1_agreement_with_float"] >= 0.9
    assert set(int8["latency_ms"]) == {"1", "32"}
    assert "## int8 ONNX" in (onnx_folder / "export_report.md").read_text(encoding="utf-8")


STANDALONE = """
import importlib.abc, importlib.util, json, sys
# No torchloom (nor torch): drop every path and import hook that could find them.
sys.path = [p for p in sys.path if "torchloom" not in p and "/src" not in p]
sys.meta_path = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
assert importlib.util.find_spec("torchloom") is None, "torchloom is importable"
import numpy as np, onnxruntime
folder = sys.argv[1]
session = onnxruntime.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
inputs = np.load(folder + "/../inputs.npy")
for size in (1, 7, len(inputs)):  # any batch size
    (out,) = session.run(["predictions"], {"inputs": inputs[:size]})
    assert out.shape == (size, 10), out.shape
np.save(folder + "/../onnx_out.npy", out)
print("torch" in sys.modules, "torchloom" in sys.modules)
"""


def test_onnx_export_runs_without_torchloom(onnx_folder: Path, lenet_run: Path) -> None:
    run = load_trained_run(lenet_run)
    graph = InferenceGraph(run.pipeline, "test")
    (inputs,) = graph.example_inputs(task_batch(run.pipeline, "test", 40))
    np.save(onnx_folder.parent / "inputs.npy", inputs.numpy())
    done = subprocess.run(
        [sys.executable, "-I", "-c", STANDALONE, str(onnx_folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
    produced = np.load(onnx_folder.parent / "onnx_out.npy")
    with torch.no_grad():
        (expected,) = graph(inputs)
    assert np.abs(produced - expected.numpy()).max() <= 1e-4


def test_predict_labels_png_files_as_the_model_does(
    onnx_folder: Path, lenet_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = load_trained_run(lenet_run)
    task = run.pipeline.tasks["test"]
    task.prepare()
    images = task._images[:6]
    if images.dtype != torch.uint8:  # standardised floats, kept by the task: pixels again
        images = ((images * 0.3081 + 0.1307) * 255).round().clamp(0, 255).to(torch.uint8)
    files = []
    for index, pixels in enumerate(images):
        path = tmp_path / f"digit{index}.png"
        Image.fromarray(pixels[0].numpy()).save(path)
        files.append(str(path))
    # The run folder stands for its ONNX export.
    assert main(["predict", str(lenet_run), *files, "--top", "2", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    graph = InferenceGraph(run.pipeline, "test")
    (inputs,) = graph.example_inputs(task_batch(run.pipeline, "test", 6))
    with torch.no_grad():
        (expected,) = graph(inputs)
    assert [line["input"] for line in lines] == files
    assert [line["top"][0]["label"] for line in lines] == [
        str(int(i)) for i in expected.argmax(dim=1)
    ]
    for line in lines:
        assert len(line["top"]) == 2
        assert 0 <= line["top"][1]["probability"] <= line["top"][0]["probability"] <= 1


def test_predict_refuses_what_it_cannot_read(
    onnx_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "fake.png"
    fake.write_text("not an image", encoding="utf-8")
    assert main(["predict", str(onnx_folder), str(fake)]) == 2
    err = capsys.readouterr().err
    assert f"input '{fake}'" in err and "cannot be read as an image" in err
    assert "Traceback" not in err
    assert main(["predict", str(onnx_folder), str(tmp_path / "missing.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["predict", str(onnx_folder), str(tmp_path)]) == 2  # said "does not exist"
    assert "is a folder, not an image (name its images:" in capsys.readouterr().err
    assert main(["predict", str(tmp_path), str(fake)]) == 2
    assert "is not an ONNX export" in capsys.readouterr().err


def test_pt2_export_reloads_with_torch_export_and_as_an_aoti_package(lenet_run: Path) -> None:
    args = ["export", str(lenet_run), "--format", "pt2", "--aoti", "--repeats", "3"]
    assert main(args) == 0
    folder = lenet_run / "exports" / "pt2"
    report = report_of(folder)
    assert report["check"]["max_abs_difference"] <= 1e-6
    assert report["check"]["tolerance"] == 1e-4 and report["check"]["section"] == "test"
    module = torch.export.load(str(folder / "model.pt2")).module()
    assert module(torch.zeros(3, 1, 28, 28))[0].shape == (3, 10)
    assert report["aoti"]["max_abs_difference"] <= 1e-4
    assert set(report["aoti"]["latency_ms"]) == {"1", "32"}
    package = torch._inductor.aoti_load_package(str(folder / "model_aoti.pt2"))
    assert package(torch.zeros(5, 1, 28, 28))[0].shape == (5, 10)  # any batch size


@pytest.mark.parametrize("error", [1.0, float("nan")])
def test_pt2_export_whose_reloaded_program_differs_is_refused(
    lenet_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: float,
) -> None:
    """The reloaded program is checked against eager torch with the tolerance of the other
    routes, and a NaN in its outputs does not pass that check."""
    real_load = torch.export.load

    class Perturbed:
        def __init__(self, path: str) -> None:
            self.program = real_load(path)

        def module(self):  # type: ignore[no-untyped-def]
            module = self.program.module()

            def call(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                outputs = [o.clone() for o in module(*inputs)]
                outputs[0][0, 0] += error
                return tuple(outputs)

            return call

    monkeypatch.setattr(torch.export, "load", Perturbed)
    run = tmp_path / "run"
    shutil.copytree(lenet_run, run, ignore=shutil.ignore_patterns("quantized", "exports"))
    assert main(["export", str(run), "--format", "pt2", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "torch.export check" in err and "tolerance 0.0001" in err
    assert "Traceback" not in err
    assert not (run / "exports" / "pt2").exists()


def test_safetensors_export_holds_every_weight(lenet_run: Path) -> None:
    from safetensors.torch import load_file

    import torchloom

    result = torchloom.export(lenet_run, "safetensors")
    assert result.folder == lenet_run / "exports" / "safetensors"
    saved = load_file(str(result.folder / "model.safetensors"))
    run = load_trained_run(lenet_run)
    own = run.pipeline.components["image_classifier"].state_dict()
    for key, value in own.items():
        assert torch.equal(saved[f"image_classifier.{key}"], value)
    # The load the report gives works as given (strict: every weight, nothing else).
    report = json.loads((result.folder / "export_report.json").read_text("utf-8"))
    assert report["load"].startswith("safetensors.torch.load_model(pipeline.registered, path)")
    from safetensors.torch import load_model

    fresh = load_trained_run(lenet_run).pipeline
    for parameter in fresh.registered.parameters():
        torch.nn.init.zeros_(parameter)
    load_model(fresh.registered, result.folder / "model.safetensors")
    assert all(
        torch.equal(v, own[k]) for k, v in fresh.components["image_classifier"].state_dict().items()
    )


def test_safetensors_export_of_a_pipeline_with_a_vocabulary_holds_its_weights(
    bbc_run: Path,
) -> None:
    """An indexer's vocabulary is its extra state, no tensor: the export failed with a
    traceback ("'dict' object has no attribute 'device'"); the file now holds the tensors,
    and the report says what is not in it and how to load the rest."""
    from safetensors.torch import load_file

    import torchloom

    result = torchloom.export(bbc_run, "safetensors", inputs=["bow"], force=True)
    report = json.loads((result.folder / "export_report.json").read_text("utf-8"))
    assert report["load"] == (
        "pipeline.registered.load_state_dict(safetensors.torch.load_file(path), strict=False) "
        "(keys: <component>.<weight>)"
    )
    assert list(report["not_in_file"]) == ["indexer"]
    assert "not in the file: indexer's extra state" in (
        result.folder / "export_report.md"
    ).read_text("utf-8")
    trained = load_trained_run(bbc_run).pipeline
    fresh = load_trained_run(bbc_run).pipeline
    for parameter in fresh.registered.parameters():
        torch.nn.init.zeros_(parameter)
    file = load_file(result.folder / "model.safetensors")
    missing, unexpected = fresh.registered.load_state_dict(file, strict=False)
    assert missing == ["indexer._extra_state"] and unexpected == []
    want = trained.registered.state_dict()
    got = fresh.registered.state_dict()
    assert [k for k, v in want.items() if torch.is_tensor(v) and not torch.equal(got[k], v)] == []


def test_safetensors_keeps_a_tied_weight_once_and_a_view_as_a_copy(tmp_path: Path) -> None:
    from safetensors.torch import load_file, load_model

    from torchloom.deploy.export import _safetensors

    encoder, decoder = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
    decoder.weight = encoder.weight  # tied, as a language model's input and output
    viewer = torch.nn.Module()
    viewer.register_buffer("row", encoder.weight.detach()[1])  # a view of the same memory
    components = torch.nn.ModuleDict({"encoder": encoder, "decoder": decoder, "viewer": viewer})
    found = _safetensors(components, tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(saved) == ["encoder.weight", "viewer.row"] and "not_in_file" not in found
    assert torch.equal(saved["viewer.row"], encoder.weight[1])
    # A view stored as a copy is what safetensors' load_model refuses ("unexpected"): the
    # report gives torch's load, which takes it, and the tie, once.
    assert found["load"].startswith("pipeline.registered.load_state_dict(")
    copy = torch.nn.ModuleDict(
        {"encoder": torch.nn.Embedding(5, 3), "decoder": torch.nn.Linear(3, 5, bias=False)}
    )
    copy["decoder"].weight = copy["encoder"].weight
    copy["viewer"] = torch.nn.Module()
    copy["viewer"].register_buffer("row", torch.zeros(3))
    missing, unexpected = copy.load_state_dict(saved, strict=False)
    assert (missing, unexpected) == (["decoder.weight"], [])  # the tie, loaded through encoder
    assert torch.equal(copy["decoder"].weight, encoder.weight)
    assert torch.equal(copy["viewer"].row, encoder.weight[1])
    tied_only = torch.nn.ModuleDict({"encoder": encoder, "decoder": decoder})
    assert _safetensors(tied_only, tmp_path / "tied")["load"].startswith(
        "safetensors.torch.load_model("
    )
    del copy["viewer"]
    load_model(copy, tmp_path / "tied" / "model.safetensors")  # strict, as the report says


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "onnnx"], "did you mean 'onnx'?"),
        (["--outputs", "prediction"], "did you mean 'predictions'?"),
        (["--outputs", "labels"], "is not a tensor stream"),
        (["--checkpoint", "nowhere.pt"], "has no checkpoint"),
        (["--format", "pt2", "--int8"], "applies to --format onnx only"),
        (["--format", "onnx", "--aoti"], "applies to --format pt2 only"),
        (["--inputs", "targets"], "no chosen output needs it"),
        (["--repeats", "0"], "--repeats: must be at least 1, got 0"),
        (["--int8", "--static-batch"], "export without --static-batch"),
    ],
)
def test_bad_export_input_is_a_plain_error_and_writes_nothing(
    lenet_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(lenet_run, run, ignore=shutil.ignore_patterns("quantized", "exports"))
    assert main(["export", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (run / "exports").exists()


def test_a_second_export_needs_force(
    onnx_folder: Path, lenet_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (onnx_folder / "model.onnx").read_bytes()
    assert main(["export", str(lenet_run), "--format", "onnx"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (onnx_folder / "model.onnx").read_bytes() == before


def torch_prediction(run: Path, text: str) -> tuple[str, float]:
    """The label the trained torch pipeline gives `text` (every component but the losses and
    statistics, in order, as the pipeline routes them)."""
    from torchloom.core.component import Loss, Statistic

    pipeline = load_trained_run(run).pipeline
    batch: dict = {"inputs": [text]}
    with torch.no_grad():
        for component in pipeline.components.values():
            if isinstance(component, (Loss, Statistic)):
                continue
            inputs = {k: batch[component.stream_name(k)] for k in component.input_specs()}
            for key, value in component(inputs).items():
                batch[component.stream_name(key)] = value
    probabilities = batch["predictions"].softmax(dim=1)[0]
    best = int(probabilities.argmax())
    return str(pipeline.tasks["test"].class_names[best]), float(probabilities[best])


def test_text_export_after_the_tokenizer_predicts_raw_texts_as_torch_does(
    bbc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(bbc_run), "--inputs", "bow", "--repeats", "3"]) == 0
    folder = bbc_run / "exports" / "onnx"
    assert (folder / "artifacts" / "indexer" / "vocabulary.txt").is_file()
    assert not list(folder.rglob("weights.safetensors"))  # nothing trained before the graph
    article = tmp_path / "article.txt"
    article.write_text("Shares fell as the bank reported lower profits and sales.", "utf-8")
    texts = [str(article), "The striker scored twice as the team won the cup final."]
    capsys.readouterr()
    assert main(["predict", str(folder), *texts, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = [
        torch_prediction(bbc_run, article.read_text("utf-8")),
        torch_prediction(bbc_run, texts[1]),
    ]
    for line, (label, probability) in zip(lines, expected, strict=True):
        assert line["top"][0]["label"] == label
        assert abs(line["top"][0]["probability"] - probability) < 1e-5
    # A mistyped file name was classified as a text of one word.
    assert main(["predict", str(folder), str(tmp_path / "articel.txt")]) == 2
    assert "is no file" in capsys.readouterr().err
    assert main(["predict", str(folder), "Goal!", "--json"]) == 0  # a one-word text still is
    # A whole article on the command line was an OSError (file name too long) traceback.
    assert main(["predict", str(folder), "The striker scored. " * 40, "--json"]) == 0
    assert "top" in capsys.readouterr().out


def test_an_opset_the_exporter_does_not_write_is_refused(
    lenet_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`--opset 5` exported opset 18 and recorded 5 in export_report.json (exit 0); without
    --opset the report said null. It records the opset the file holds."""
    run = tmp_path / "run"
    shutil.copytree(lenet_run, run, ignore=shutil.ignore_patterns("quantized", "exports"))
    assert main(["export", str(run), "--format", "onnx", "--repeats", "1"]) == 0
    report = json.loads((run / "exports" / "onnx" / "export_report.json").read_text("utf-8"))
    written = report["opset"]
    assert isinstance(written, int) and written >= 13
    capsys.readouterr()
    asked = ["export", str(run), "--format", "onnx", "--repeats", "1", "--force", "--opset", "5"]
    assert main(asked) == 2
    err = capsys.readouterr().err
    assert re.search(r"--opset 5: the exporter wrote opset \d+, not 5", err)
    # onnxscript's converter logged its traceback (on stderr, outside pytest) before ours.
    assert not [r for r in caplog.records if r.name.startswith("onnxscript")]
    for impossible in ("0", "99999"):  # checked before any export
        assert main([*asked[:-1], impossible]) == 2
        assert f"--opset {impossible}: is not an ONNX opset" in capsys.readouterr().err
    kept = json.loads((run / "exports" / "onnx" / "export_report.json").read_text("utf-8"))
    assert kept == report  # the export before is intact


def test_a_damaged_text_recipe_is_a_plain_error(
    bbc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A component parameter of the wrong type in sidecar.json was pydantic's traceback."""
    run = tmp_path / "run"
    shutil.copytree(bbc_run, run, ignore=shutil.ignore_patterns("exports", "quantized"))
    assert main(["export", str(run), "--inputs", "bow", "--repeats", "1"]) == 0
    sidecar = run / "exports" / "onnx" / "sidecar.json"
    record = json.loads(sidecar.read_text("utf-8"))
    record["before_graph"][0]["params"]["remove_punctuation"] = "maybe"
    sidecar.write_text(json.dumps(record), "utf-8")
    capsys.readouterr()
    assert main(["predict", str(run), "The striker scored twice."]) == 2
    err = capsys.readouterr().err
    assert "its text recipe cannot be applied" in err and "Traceback" not in err, err


TRAINED_BEFORE_THE_GRAPH = """\
pipeline:
  tokenizer: {type: SentenceTokenizer, remove_punctuation: true}
  indexer: {type: SentenceIndexer, build_from: inputs, remove_punctuation: true, min_count: 2}
  bow: {type: BOWEncoder, mode: binary}
  projection:
    type: FeedForwardNetwork
    hidden_sizes: []
    log_softmax: false
    streams: {inputs: bow, predictions: projected}
    globals: {input_size: vocabulary_size, prediction_size: num_classes}
  classifier:
    type: FeedForwardNetwork
    hidden_sizes: [16]
    streams: {inputs: projected}
    globals: {input_size: num_classes, prediction_size: num_classes}
  nllloss: {type: NLLLoss}
  accuracy: {type: AccuracyStatistics}
"""


def test_a_trained_component_before_the_graph_predicts_with_its_trained_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bbc_trainer: Callable[..., Path]
) -> None:
    """`loom predict` builds the components before the graph again from the sidecar: one the
    run trained (here a linear projection of the bag of words; a fine-tuned encoder alike)
    got its initial weights back, and the predictions were silently another model's. Its
    trained weights now travel with the export; components a rebuild gives back as trained
    (the tokenizer, the indexer with its vocabulary) carry none."""
    run = bbc_trainer(tmp_path, "loom://language/default_bbc_news.yml", TRAINED_BEFORE_THE_GRAPH)
    assert main(["export", str(run), "--inputs", "projected", "--repeats", "3"]) == 0
    folder = run / "exports" / "onnx"
    record = json.loads((folder / "sidecar.json").read_text("utf-8"))
    weights = {step["name"]: step.get("weights") for step in record["before_graph"]}
    assert weights == {
        "tokenizer": None,
        "indexer": None,
        "bow": None,
        "projection": "artifacts/projection/weights.safetensors",
    }
    assert "projection's trained weights" in (folder / "export_report.md").read_text("utf-8")
    text = "Shares fell as the bank reported lower profits and sales."
    capsys.readouterr()
    assert main(["predict", str(folder), text, "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    label, probability = torch_prediction(run, text)
    assert line["top"][0]["label"] == label
    assert abs(line["top"][0]["probability"] - probability) < 1e-5
    # A weights file that lacks one of them is refused, not half loaded.
    from safetensors.torch import load_file, save_file

    path = folder / "artifacts" / "projection" / "weights.safetensors"
    weights = load_file(str(path))
    assert sorted(weights) == ["layers.0.bias", "layers.0.weight"]
    save_file({"layers.0.weight": weights["layers.0.weight"]}, str(path))
    capsys.readouterr()
    assert main(["predict", str(folder), text]) == 2
    error = capsys.readouterr().err
    assert "does not hold component 'projection' (FeedForwardNetwork)'s weights" in error
    assert "missing layers.0.bias" in error and "Traceback" not in error
    bias = weights["layers.0.bias"]
    save_file({**weights, "layers.0.bias": torch.zeros(len(bias) + 1)}, str(path))
    assert main(["predict", str(folder), text]) == 2
    error = capsys.readouterr().err
    assert f"layers.0.bias of shape [{len(bias) + 1}], not [{len(bias)}]" in error


def _without_depth(record: dict) -> None:
    del record["preprocessing"]["depth"]


def _string_recipe(record: dict) -> None:
    record["preprocessing"] = "image"


def _other_input(record: dict) -> None:
    record["inputs"][0]["name"] = "pixels"


def _other_size(record: dict) -> None:
    record["preprocessing"].update(height=20, width=20, resizes=[[20, 20]])


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_without_depth, "preprocessing.depth is None"),
        (_string_recipe, "preprocessing is not a mapping"),
        (_other_input, "its model refused the inputs its sidecar.json describes"),
        (_other_size, "its model refused the inputs its sidecar.json describes"),
        (None, "cannot be loaded by ONNX Runtime"),
    ],
)
def test_a_damaged_export_is_a_plain_error(
    onnx_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Any,
    expected: str,
) -> None:
    """Each was a traceback (KeyError, AttributeError, onnxruntime's errors), exit 1."""
    folder = export_copy(onnx_folder, tmp_path)
    if damage is None:
        model = folder / "model.onnx"
        model.write_bytes(model.read_bytes()[:500])
    else:
        edit_sidecar(folder, damage)
    assert main(["predict", str(folder), str(digit_png(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err


@pytest.mark.parametrize("kind", ["values", "probabilities", "embeddings"])
def test_predict_refuses_an_output_that_holds_no_class_scores(
    onnx_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    folder = export_copy(onnx_folder, tmp_path, kind)
    assert main(["predict", str(folder), str(digit_png(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert f"export '{folder}'" in err and "output 'predictions'" in err
    assert "not class logits or log-probabilities" in err and "Traceback" not in err


def test_predict_refuses_an_output_that_is_not_batch_by_classes(
    onnx_folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import onnxruntime

    class ThreeDimensional:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [np.zeros((1, 4, 10), dtype=np.float32)]

    monkeypatch.setattr(onnxruntime, "InferenceSession", ThreeDimensional)
    folder = export_copy(onnx_folder, tmp_path)
    assert main(["predict", str(folder), str(digit_png(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert f"export '{folder}'" in err and "output 'predictions'" in err
    assert "(1, 4, 10)" in err and "Traceback" not in err


def test_predict_gives_exp_of_log_probabilities_and_softmax_of_logits(
    onnx_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxruntime

    from torchloom.deploy.image_recipe import image_tensor

    record = json.loads((onnx_folder / "sidecar.json").read_text(encoding="utf-8"))
    assert record["outputs"][0]["kind"] == "log-probabilities"  # LeNet5's log_softmax
    png = digit_png(tmp_path)
    session = onnxruntime.InferenceSession(str(onnx_folder / "model.onnx"))
    feed = {record["inputs"][0]["name"]: image_tensor(png, record["preprocessing"])}
    (values,) = session.run(["predictions"], feed)
    values = values[0].astype(np.float64)
    softmax = np.exp(values - values.max()) / np.exp(values - values.max()).sum()
    for kind, expected in (("log-probabilities", np.exp(values)), ("logits", softmax)):
        folder = export_copy(onnx_folder, tmp_path / kind, kind)
        assert main(["predict", str(folder), str(png), "--top", "10", "--json"]) == 0
        (line,) = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
        found = {int(entry["label"]): entry["probability"] for entry in line["top"]}
        assert np.allclose([found[i] for i in range(10)], expected, rtol=1e-6, atol=1e-9)


HOLD_LOCK = """
import sys, time
from pathlib import Path
from torchloom.engine.run_lock import RunLock
RunLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_run_still_training_is_not_exported_nor_quantized(
    lenet_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both took a run in its first epoch: its best.pt then moved on, and the export and the
    report (naming best.pt) were of weights the run no longer had, silently."""
    # Held by another process, as `loom train` holds it while it trains (a hook of the run
    # itself, in the process that holds it, may export).
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lenet_run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for command in (["export", str(lenet_run)], ["quantize", str(lenet_run)]):
            assert main(command) == 2
            err = capsys.readouterr().err
            assert "is still training (held by process" in err and "--checkpoint PATH" in err
        copy = tmp_path / "best.pt"
        shutil.copy(lenet_run / "checkpoints" / "best.pt", copy)
        args = ["export", str(lenet_run), "--checkpoint", str(copy), "--format", "safetensors"]
        assert main([*args, "--force"]) == 0  # a copy does not move
    finally:
        holder.kill()
        holder.wait()
    report = report_of(lenet_run / "exports" / "safetensors")
    assert report["checkpoint_progress"] == {"epoch": 1, "episode": 24, "batch_in_epoch": 0}
    assert (
        "saved at epoch 1, episode 24"
        in (lenet_run / "exports" / "safetensors" / "export_report.md").read_text()
    )


def test_a_safetensors_export_needs_no_onnx(
    lenet_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opset check imported onnx (the deploy extra's) for every format."""
    import torchloom

    monkeypatch.setitem(sys.modules, "onnx", None)  # as where it is not installed
    result = torchloom.export(lenet_run, "safetensors", force=True)
    assert (result.folder / "model.safetensors").is_file()
