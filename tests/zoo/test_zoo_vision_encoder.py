"""GenericImageEncoder: outputs match their specs, weights load from a local file (and a file
that does not fit is a WeightsError naming it), freezing, and build-time geometry errors.
Only resnet18 runs; the big networks are built once at most. The vision configs pass the
handshake (`loom check` reads no data)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torchvision

from torchloom.core.streams import StreamSpec
from torchloom.engine.assemble import assemble
from torchloom.errors import ComponentError, WeightsError
from torchloom.zoo.models.generic_image_encoder import GenericImageEncoder

CONFIGS = Path(__file__).parents[2] / "src" / "torchloom" / "configs"


def image_globals(depth: int = 3, size: int = 32) -> dict[str, int]:
    return {"input_depth": depth, "input_height": size, "input_width": size}


def assert_matches(value: torch.Tensor, spec: StreamSpec, batch_size: int) -> None:
    assert spec.dims is not None and spec.dtypes is not None
    assert value.dtype in spec.dtypes
    assert list(value.shape) == [batch_size if d.name == "batch" else d.size for d in spec.dims]


def run(encoder: GenericImageEncoder, inputs: torch.Tensor) -> torch.Tensor:
    assert_matches(inputs, encoder.input_specs()["inputs"], inputs.shape[0])
    ((name, spec),) = encoder.output_specs().items()
    output = encoder({"inputs": inputs})[name]
    assert_matches(output, spec, inputs.shape[0])
    return output


def build(**params: object) -> GenericImageEncoder:
    globals_ = params.pop("globals", image_globals())
    encoder = GenericImageEncoder.create(globals=globals_, **params)  # type: ignore[arg-type]
    assert isinstance(encoder, GenericImageEncoder)
    return encoder


def test_resnet18_vector_and_projection() -> None:
    torch.manual_seed(0)
    encoder = build()
    assert encoder.global_value("feature_size") == 512
    assert encoder.output_specs()["outputs"].shape_text() == "[batch, 512]"
    run(encoder, torch.randn(2, 3, 32, 32))

    projected = build(output_size=10, globals=image_globals(depth=1, size=40))
    assert projected.global_value("feature_size") == 10
    output = run(projected, torch.randn(3, 1, 40, 40))  # one channel, repeated into three
    output.square().mean().backward()
    assert all(p.grad is not None for p in projected.parameters())


def test_resnet18_feature_maps() -> None:
    encoder = build(output="feature_maps", globals=image_globals(size=64))
    sizes = [encoder.global_value(f"feature_map_{k}") for k in ("depth", "height", "width")]
    assert sizes == [512, 2, 2]
    assert encoder.output_specs()["feature_maps"].shape_text() == "[batch, 512, 2, 2]"
    run(encoder.eval(), torch.randn(2, 3, 64, 64))


def test_a_local_weights_file_loads_into_the_backbone(tmp_path: Path) -> None:
    torch.manual_seed(1)
    network = torchvision.models.resnet18(weights=None)  # as torchvision's .pth files hold it
    path = tmp_path / "resnet18.pth"
    torch.save(network.state_dict(), path)

    torch.manual_seed(2)
    encoder = build(pretrained=str(path))
    fresh = build()
    loaded, random = encoder.backbone.state_dict(), fresh.backbone.state_dict()
    assert not torch.equal(loaded["conv1.weight"], random["conv1.weight"])
    for name in ("conv1.weight", "layer4.1.bn2.running_var"):
        assert torch.equal(loaded[name], network.state_dict()[name])
    with torch.no_grad():
        images = torch.randn(2, 3, 32, 32)
        expected = network.avgpool(
            torch.nn.Sequential(*list(network.children())[:-2]).eval()(images)
        ).flatten(1)
        assert torch.allclose(encoder.eval()({"inputs": images})["outputs"], expected, atol=1e-5)


def test_a_weights_file_that_does_not_fit_is_a_weights_error(tmp_path: Path) -> None:
    state = torchvision.models.resnet18(weights=None).state_dict()
    state["layer1.0.conv1.weight"] = torch.zeros(3, 3)
    del state["layer4.1.bn2.weight"]
    state["head.extra"] = torch.zeros(1)
    path = tmp_path / "other.pth"
    torch.save(state, path)
    with pytest.raises(WeightsError) as error:
        build(pretrained=str(path))
    message = str(error.value)
    assert str(path) in message
    assert "layer4.1.bn2.weight" in message and "head.extra" in message
    assert "layer1.0.conv1.weight [3, 3] instead of [64, 64, 3, 3]" in message
    with pytest.raises(WeightsError, match="does not exist"):
        build(pretrained=str(tmp_path / "missing.pth"))


def test_torchvision_weights_come_from_the_weights_api(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real call downloads; here the weights API is replaced, so nothing is fetched.
    asked: list[object] = []
    get_model = torchvision.models.get_model

    def offline(name: str, **config: object) -> torch.nn.Module:
        asked.append(config.get("weights"))
        if config.get("weights") is not None:
            raise OSError("no network")
        return get_model(name, **config)

    monkeypatch.setattr(torchvision.models, "get_model", offline)
    with pytest.raises(WeightsError) as error:
        build(pretrained="torchvision")
    assert asked == ["DEFAULT"]
    assert "DEFAULT weights for resnet18" in str(error.value)
    assert "no network" in str(error.value) and "set pretrained to its path" in str(error.value)
    assert torchvision.models.ResNet18_Weights.verify("DEFAULT") is not None


def test_freeze_backbone_keeps_weights_and_statistics() -> None:
    encoder = build(freeze_backbone=True, output_size=4)
    trainable, frozen = encoder.parameter_counts()
    assert trainable == 512 * 4 + 4 and frozen > 10_000_000
    encoder.train()
    assert not encoder.backbone.training and encoder.projection is not None
    assert encoder.projection.training
    before = encoder.backbone.state_dict()["bn1.running_mean"].clone()
    encoder({"inputs": torch.randn(4, 3, 32, 32)})
    assert torch.equal(encoder.backbone.state_dict()["bn1.running_mean"], before)


def test_build_errors_name_the_problem() -> None:
    with pytest.raises(ComponentError, match="too small for densenet121"):
        build(model_type="densenet121", globals=image_globals(size=28))
    build(model_type="densenet121", globals=image_globals(size=29))  # it said 31 were needed
    with pytest.raises(ComponentError, match="takes 1 or 3"):
        build(globals=image_globals(depth=4))
    with pytest.raises(ComponentError, match="output is feature_maps"):
        build(output="feature_maps", output_size=8)


def test_the_other_networks_build_and_dry_run() -> None:
    # Construction only (vgg16 takes about 2 s, mostly its discarded classifier); resnet152
    # is resnet50 with more blocks and stays out of the test run.
    start = time.perf_counter()
    densenet = build(model_type="densenet121", output="feature_maps")
    assert densenet.global_value("feature_map_depth") == 1024
    assert build(model_type="resnet50").global_value("feature_size") == 2048
    vgg = build(model_type="vgg16", output="feature_maps")
    assert vgg.output_specs()["feature_maps"].shape_text() == "[batch, 512, 1, 1]"
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("config", ["fashion_mnist/lenet5.yml", "cifar10/resnet18.yml"])
def test_the_vision_configs_pass_the_handshake(config: str) -> None:
    assembled = assemble(CONFIGS / config)
    assert set(assembled.pipeline.tasks) == {"training", "validation", "test"}
