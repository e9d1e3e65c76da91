"""Every shipped config with a model either exports as one tensor graph, or the export names the
component that prevents it. Pipelines are built with their initial weights (the graph does
not depend on training); a few are exported to ONNX and checked in ONNX Runtime.

Not covered: configs whose data or files are not on this machine (translation, CLEVR,
VQA-Med, the transplant of a trained encoder) and the MiniLM pipeline (its pretrained model
takes seconds to load); the first three fail to build with a data error before any export.
language/language_id_bow.yml is built like bbc_news_bow_ffn.yml (its tokenizer is named).
test_predict_configs.py trains each of these a few steps, exports it with `loom export` and
runs `loom predict` on a PNG or a line of text.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchloom.core.pipeline import Pipeline
from torchloom.deploy.graph import InferenceGraph
from torchloom.deploy.onnx_export import export_onnx, max_difference, onnx_session
from torchloom.deploy.sidecar import sidecar
from torchloom.engine.assemble import assemble
from torchloom.errors import DeployError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GRAPHS = [
    "mnist/lenet5.yml",
    "mnist/convnet.yml",
    "mnist/ffn.yml",
    "mnist/2lenet5_2losses.yml",
    "mnist/kfold.yml",
    "fashion_mnist/lenet5.yml",
    "fashion_mnist/resnet18.yml",
    "cifar10/resnet18.yml",
    "multitask/mnist_shared_encoder_two_heads.yml",
    "nas/darts_v2_cifar10.yml",
    "transplant/mnist_train_encoder.yml",
    "vqa/sort_of_clevr_cnn_mlp.yml",
    "vqa/sort_of_clevr_cnn_rn.yml",
]
EXPORTED = {"vqa/sort_of_clevr_cnn_rn.yml"}  # two inputs; LeNet-5 in test_export.py
NAMED = {
    "language/bbc_news_bow_ffn.yml": "component 'tokenizer' (SentenceTokenizer)",
    "language/bbc_news_embeddings_gru.yml": "component 'tokenizer' (SentenceTokenizer)",
    "language/language_model_ngram.yml": "component 'context_indexer' (SentenceIndexer)",
}


def built(name: str) -> tuple[Pipeline, str]:
    pipeline = assemble(CONFIGS / name).pipeline.eval()
    return pipeline, next(s for s in ("test", "validation", "training") if s in pipeline.tasks)


def random_inputs(graph: InferenceGraph, batch: int = 3) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(
        torch.randn(*[batch if d.name == "batch" else int(d.size or 1) for d in spec.dims or ()])
        for spec in graph.input_specs.values()
    )


@pytest.mark.parametrize("name", GRAPHS)
def test_image_configs_are_one_tensor_graph(name: str, tmp_path: Path) -> None:
    pipeline, section = built(name)
    graph = InferenceGraph(pipeline, section).eval()
    assert graph.input_names and graph.output_names
    inputs = random_inputs(graph)
    with torch.no_grad():
        outputs = graph(*inputs)
    assert all(o.shape[0] == 3 for o in outputs)
    if name in EXPORTED:
        path = tmp_path / "model.onnx"
        export_onnx(graph, random_inputs(graph, 2), path, None, dynamic=True)
        assert max_difference(graph, onnx_session(path), [inputs]) <= 1e-4


@pytest.mark.parametrize(("name", "component"), sorted(NAMED.items()))
def test_text_configs_name_the_component_the_graph_cannot_hold(name: str, component: str) -> None:
    pipeline, section = built(name)
    with pytest.raises(DeployError) as caught:
        InferenceGraph(pipeline, section)
    message = caught.value.format()
    assert component in message and "a graph of tensors cannot hold it" in message
    assert "--inputs" in message


def test_inputs_start_a_text_graph_after_its_python_side_components(tmp_path: Path) -> None:
    pipeline, section = built("language/bbc_news_bow_ffn.yml")
    graph = InferenceGraph(pipeline, section, inputs=["bow"]).eval()
    assert [c.name for c in graph.chosen] == ["classifier"]
    inputs = random_inputs(graph)
    path = tmp_path / "model.onnx"
    export_onnx(graph, random_inputs(graph, 2), path, None, dynamic=True)
    assert max_difference(graph, onnx_session(path), [inputs]) <= 1e-4
    record = sidecar(pipeline, section, graph)
    assert record["preprocessing"]["kind"] == "tensors"
    before = {entry["name"]: entry for entry in record["before_graph"]}
    assert list(before) == ["tokenizer", "indexer", "bow"]
    assert before["indexer"]["artifacts"], "the vocabulary goes with the export"
    assert before["tokenizer"]["params"]["remove_punctuation"] is True
