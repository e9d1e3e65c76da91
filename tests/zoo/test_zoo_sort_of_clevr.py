"""Sort-of-CLEVR (generation, answers, cache), the Relation Network and per-group accuracy."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from held_batches import check_batches_held_on_devices
from torchloom.cli.main import main
from torchloom.data import sort_of_clevr_scenes as scenes
from torchloom.data.sort_of_clevr_scenes import ANSWERS, COLOURS
from torchloom.errors import ComponentError, DataError
from torchloom.zoo.grouped_statistics import AccuracyByGroupStatistics
from torchloom.zoo.models.relational_network import RelationalNetwork
from torchloom.zoo.tasks import sort_of_clevr
from torchloom.zoo.tasks.sort_of_clevr import SortOfCLEVR

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "torchloom" / "configs" / "vqa"
SMALL = {"images": 12, "questions_per_type": 10}


def task(folder: Path, **params: object) -> SortOfCLEVR:
    return SortOfCLEVR.create(data_folder=str(folder), **{**SMALL, **params})  # type: ignore[return-value]


# ---- generation -----------------------------------------------------------------------------
def test_indices_count_from_the_end_and_stop_at_the_size(tmp_path: Path) -> None:
    split = task(tmp_path)
    size = len(split)
    assert split[-1]["indices"] == size - 1
    assert split[-size]["indices"] == 0
    for bad in (size, -size - 1):
        with pytest.raises(IndexError, match=f"index {bad} out of range for {size} samples"):
            split[bad]
    assert len(list(split)) == size  # plain iteration ends at the IndexError


def test_same_seed_gives_identical_bytes_and_another_seed_does_not(tmp_path: Path) -> None:
    first = task(tmp_path / "a", seed=3)
    first.prepare()
    second = task(tmp_path / "b", seed=3)
    second.prepare()
    assert first.cache_path.read_bytes() == second.cache_path.read_bytes()
    other = task(tmp_path / "c", seed=4).arrays()
    assert not np.array_equal(first.arrays()["images"], other["images"])
    # Image i depends on (seed, split, i) only: a smaller split is a prefix of a larger one,
    # and the splits differ from each other.
    larger = task(tmp_path / "d", seed=3, images=20).arrays()
    for name, array in first.arrays().items():
        assert np.array_equal(larger[name][:12], array), name
    validation = task(tmp_path / "e", seed=3, split="validation").arrays()
    assert not np.array_equal(validation["objects"], first.arrays()["objects"])


def _expected_answer(objects: list[tuple[int, int, int]], colour: int, subtype: int) -> str:
    """An independent reading of the questions, written from the paper's description."""
    x, y, shape = objects[colour]
    names = ("square", "circle")
    if subtype == 0:
        return names[shape]
    if subtype == 1:
        return "yes" if x < 75 / 2 else "no"
    if subtype == 2:
        return "yes" if y < 75 / 2 else "no"
    if subtype == 5:
        return str(sum(1 for _, _, s in objects if s == shape))
    distances = [(math.dist((x, y), (ox, oy)), index) for index, (ox, oy, _) in enumerate(objects)]
    others = [d for d in distances if d[1] != colour]
    _, chosen = min(others) if subtype == 3 else max(others, key=lambda d: (d[0], -d[1]))
    return names[objects[chosen][2]]


def test_every_answer_matches_a_recomputation_from_the_objects(tmp_path: Path) -> None:
    clevr = task(tmp_path, images=40)
    arrays = clevr.arrays()
    seen_subtypes: set[int] = set()
    for index in range(len(clevr)):
        sample = clevr[index]
        image, question = divmod(index, 20)
        objects = [tuple(int(v) for v in o) for o in arrays["objects"][image]]
        vector = sample["questions"]
        assert vector.shape == (11,) and float(vector.sum()) == 3.0
        colour = int(vector[:6].argmax())
        kind = int(vector[6:8].argmax())
        subtype = 3 * kind + int(vector[8:].argmax())
        assert kind == (question >= 10) == sample["question_types"]
        assert subtype == sample["question_subtypes"]
        expected = _expected_answer(objects, colour, subtype)  # type: ignore[arg-type]
        assert sample["labels"] == expected, (index, objects, colour, subtype)
        assert sample["targets"] == ANSWERS.index(expected)
        assert COLOURS[colour] in sample["question_texts"]
        seen_subtypes.add(subtype)
    assert seen_subtypes == set(range(6))


def test_images_show_six_separate_objects_in_their_colours(tmp_path: Path) -> None:
    clevr = task(tmp_path, images=30)
    arrays = clevr.arrays()
    for image, objects in zip(arrays["images"], arrays["objects"], strict=True):
        assert image.shape == (3, 75, 75) and image.dtype == np.uint8
        for colour, (x, y, shape) in enumerate(objects.astype(int)):
            assert 5 <= x <= 69 and 5 <= y <= 69 and shape in (0, 1)
            assert tuple(image[:, y, x]) == tuple(scenes.RGB[colour])
            # A square fills its corner, a circle leaves it white.
            corner = tuple(image[:, y - 5, x - 5])
            assert corner == (tuple(scenes.RGB[colour]) if shape == 0 else (255, 255, 255))
        gaps = np.abs(objects[:, None, :2].astype(int) - objects[None, :, :2]).max(axis=2)
        assert (gaps + np.eye(6, dtype=int) * 99).min() > 10  # no two boxes touch


def test_samples_and_batches_match_the_specs(tmp_path: Path) -> None:
    clevr = task(tmp_path)
    batch = clevr.collate([clevr[i] for i in (0, 15, 239)])
    specs = clevr.output_specs()
    assert set(batch) == set(specs)
    for name, spec in specs.items():
        value = batch[name]
        if spec.is_tensor:
            assert value.dtype in spec.dtypes, name
            assert tuple(d.size for d in spec.dims[1:]) == tuple(value.shape[1:]), name  # type: ignore[union-attr]
        else:
            assert isinstance(value, list) and all(isinstance(v, str) for v in value), name
    assert batch["indices"].tolist() == [0, 15, 239]
    assert batch["question_types"].tolist() == [0, 1, 1]
    assert float(batch["images"].min()) >= 0.0 and float(batch["images"].max()) == 1.0
    assert len(clevr) == 240 and clevr.sample_targets().shape == (240,)
    for stream in ("labels", "question_texts"):
        assert list(clevr.texts(stream)) == [clevr[i][stream] for i in range(len(clevr))]
    normalized = task(tmp_path, normalize=True)[0]["images"]
    white = (1.0 - torch.tensor(sort_of_clevr.PIXEL_MEAN)) / torch.tensor(sort_of_clevr.PIXEL_STD)
    assert torch.allclose(normalized[:, 0, 0], white)


@pytest.mark.parametrize("normalize", [False, True])
def test_fetched_batches_equal_the_collated_samples(tmp_path: Path, normalize: bool) -> None:
    clevr = task(tmp_path, normalize=normalize)
    indices = [239, 0, 15, 15, -1, 101]  # any order, repeats, counted from the end
    fetched = clevr.fetch(indices)
    collated = clevr.collate([clevr[i] for i in indices])
    assert set(fetched) == set(collated)
    for name, value in collated.items():
        if isinstance(value, torch.Tensor):
            assert fetched[name].dtype == value.dtype and torch.equal(fetched[name], value), name
        else:
            assert fetched[name] == value, name
    assert fetched["indices"].tolist() == [239, 0, 15, 15, 239, 101]
    with pytest.raises(IndexError, match="index 240 out of range"):
        clevr.fetch([0, 240])


@pytest.mark.parametrize("normalize", [False, True])
def test_a_split_held_on_a_device_gathers_its_batches_there(
    tmp_path: Path, normalize: bool
) -> None:
    """`hold_on` (`dataloader.on_device`) gives the host's batches, gathered on the device."""
    check_batches_held_on_devices(
        lambda: task(tmp_path, normalize=normalize), [239, 0, 15, 15, -1, 101]
    )


def test_globals_and_bad_parameters(tmp_path: Path) -> None:
    clevr = task(tmp_path, image_size=40, object_size=4)
    assert clevr.global_value("num_classes") == 10 and clevr.global_value("question_size") == 11
    assert clevr.global_value("input_height") == 40 and clevr.dimension_sizes() == {"classes": 10}
    assert clevr.arrays()["images"].shape == (12, 3, 40, 40)
    with pytest.raises(ComponentError, match="object_size 5 is too large"):
        task(tmp_path, image_size=40)
    with pytest.raises(ValidationError):
        task(tmp_path, images=0)


# ---- cache ------------------------------------------------------------------------------------
def test_the_cache_is_reused_without_generating_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = task(tmp_path)
    first.prepare()
    assert first.cache_path.name == "sort_of_clevr-v1-train-12img-10q-75px-5obj-seed0.npz"
    assert [p.name for p in tmp_path.iterdir()] == [first.cache_path.name]  # no temporary left

    def fail(*args: object) -> None:
        raise AssertionError("generated again")

    monkeypatch.setattr(sort_of_clevr, "generate", fail)
    again = task(tmp_path)
    again.prepare()
    assert np.array_equal(again.arrays()["answers"], first.arrays()["answers"])


@pytest.mark.parametrize("damage", ["truncate", "flip_a_byte", "tampered_array"])
def test_a_damaged_cache_is_reported_and_generated_again(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    reference = task(tmp_path)
    reference.prepare()
    path = reference.cache_path
    original = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(original[: len(original) // 2])
    elif damage == "flip_a_byte":
        data = bytearray(original)
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:  # readable, right shapes, but not what was generated: only the checksum tells
        arrays = dict(reference.arrays())
        recorded = scenes.checksum(arrays)
        arrays["answers"] = (arrays["answers"] + 1) % 10
        with open(path, "wb") as file:
            np.savez_compressed(file, checksum=np.array(recorded), **arrays)
    with caplog.at_level(logging.WARNING, logger="torchloom.data"):
        regenerated = task(tmp_path)
        regenerated.prepare()
    assert "damaged Sort-of-CLEVR cache" in caplog.text and str(path) in caplog.text
    assert path.read_bytes() == original
    assert np.array_equal(regenerated.arrays()["answers"], reference.arrays()["answers"])


def test_an_unwritable_data_folder_is_a_data_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DataError, match="cannot be written"):
        task(blocker / "inside").prepare()


# ---- Relation Network -----------------------------------------------------------------------
def _network(**params: object) -> RelationalNetwork:
    globals_ = {
        "feature_map_depth": 4,
        "feature_map_height": 2,
        "feature_map_width": 3,
        "question_size": 11,
        "prediction_size": 10,
    }
    return RelationalNetwork.create(globals=globals_, **params)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("aggregation", "distances"), [("sum", False), ("mean", False), ("sum", True)]
)
def test_relation_network_equals_a_naive_loop_over_pairs(aggregation: str, distances: bool) -> None:
    torch.manual_seed(0)
    network = _network(
        g_sizes=[8, 7], f_sizes=[6], dropout=0.0, aggregation=aggregation, pair_distances=distances
    ).eval()
    maps, questions = torch.randn(3, 4, 2, 3), torch.randn(3, 11)
    predictions = network({"feature_maps": maps, "questions": questions})["predictions"]
    assert predictions.shape == (3, 10)
    assert torch.allclose(predictions.exp().sum(1), torch.ones(3))

    g_layers = [network.g_first, torch.nn.ReLU(), *network.g_rest]
    expected = []
    for sample in range(3):
        objects, positions = [], []
        for row in range(2):
            for column in range(3):
                position = torch.tensor([[-1.0, 0.0, 1.0][column], [-1.0, 1.0][row]])
                objects.append(torch.cat([maps[sample, :, row, column], position]))
                positions.append(position)
        total = torch.zeros(7)
        for first, first_position in zip(objects, positions, strict=True):
            for second, second_position in zip(objects, positions, strict=True):
                pair = torch.cat([first, second, questions[sample]])
                if distances:
                    gap = (first_position - second_position).norm()
                    pair = torch.cat([pair, gap.reshape(1)])
                for layer in g_layers:
                    pair = layer(pair)
                total += pair
        if aggregation == "mean":
            total /= len(objects) ** 2
        expected.append(torch.log_softmax(network.f_phi(total), dim=0))
    assert torch.allclose(predictions, torch.stack(expected), atol=1e-5)


def test_relation_network_specs_options_and_gradients() -> None:
    network = _network(coordinates=False, g_sizes=[5])
    assert network.g_first.in_features == 2 * 4 + 11
    assert str(network.input_specs()["feature_maps"]) == "[batch, 4, 2, 3] " + (
        "float32|float16|bfloat16|float64"
    )
    assert str(network.output_specs()["predictions"]).startswith("[batch, classes=10]")
    maps = torch.randn(2, 4, 2, 3, requires_grad=True)
    out = network.train()({"feature_maps": maps, "questions": torch.randn(2, 11)})
    out["predictions"].sum().backward()
    assert maps.grad is not None and network.g_first.weight.grad is not None
    with pytest.raises(ValidationError):
        _network(g_sizes=[])


def test_feature_normalization_standardises_the_objects_features() -> None:
    network = _network(feature_normalization=True).train()
    maps = 5.0 + 3.0 * torch.randn(8, 4, 2, 3)
    objects = network.objects(maps)  # [8, 6, 4 + 2]
    features = objects[..., :4].reshape(-1, 4)
    assert torch.allclose(features.mean(0), torch.zeros(4), atol=1e-5)
    assert torch.allclose(features.std(0, unbiased=False), torch.ones(4), atol=1e-3)
    assert torch.equal(objects[0, :, 4:], network.positions)  # coordinates are left alone


# ---- grouped accuracy -----------------------------------------------------------------------
def test_grouped_accuracy_matches_a_hand_count_over_batches() -> None:
    statistic = AccuracyByGroupStatistics.create(group_names=["non_relational", "relational"])
    assert statistic.compute()["accuracy_relational"] != statistic.compute()["accuracy"]  # NaN
    # predicted classes: argmax of one-hot scores
    predicted = [1, 2, 3, 0, 4, 4, 1]
    targets = [1, 2, 0, 0, 4, -100, 2]
    groups = [0, 1, 1, 0, 7, 1, 1]  # 7 is no named group: counted overall only
    for batch in (slice(0, 3), slice(3, 7)):  # uneven batches
        statistic.update(
            {
                "predictions": torch.nn.functional.one_hot(torch.tensor(predicted[batch]), 5)
                .float()
                .log_softmax(1),
                "targets": torch.tensor(targets[batch]),
                "groups": torch.tensor(groups[batch]),
            }
        )
    values = statistic.compute()
    # group 0: samples 0 (hit), 3 (hit) -> 2/2; group 1: 1 (hit), 2 (miss), 6 (miss),
    # 5 ignored -> 1/3; overall: 6 counted, 4 hits (0, 1, 3, 4).
    assert values == {
        "accuracy": pytest.approx(4 / 6),
        "accuracy_non_relational": pytest.approx(1.0),
        "accuracy_relational": pytest.approx(1 / 3),
    }
    statistic.reset()
    assert math.isnan(statistic.compute()["accuracy"])


def test_grouped_accuracy_parameters() -> None:
    statistic = AccuracyByGroupStatistics.create(group_names=["a"], prefix="acc", ignore_index=None)
    statistic.update(
        {
            "predictions": torch.tensor([[0.1, 0.9], [0.8, 0.2]]),
            "targets": torch.tensor([1, -100]),
            "groups": torch.tensor([0, 0]),
        }
    )
    assert statistic.compute() == {"acc": 0.5, "acc_a": 0.5}
    assert set(statistic.input_specs()) == {"predictions", "targets", "groups"}
    for bad in ({"group_names": []}, {"group_names": ["a b"]}, {"group_names": ["a", "a"]}):
        with pytest.raises(ValidationError):
            AccuracyByGroupStatistics.create(**bad)


def test_grouped_accuracy_reads_the_group_names_from_a_global(tmp_path: Path) -> None:
    names = task(tmp_path).global_value("question_type_names")
    statistic = AccuracyByGroupStatistics.create(globals={"group_names": names})
    assert set(statistic.compute()) == {
        "accuracy",
        "accuracy_non_relational",
        "accuracy_relational",
    }


def test_the_task_names_the_question_subtypes_for_per_subtype_accuracy(tmp_path: Path) -> None:
    names = task(tmp_path).global_value("question_subtype_names")
    statistic = AccuracyByGroupStatistics.create(
        prefix="subtype_accuracy", globals={"group_names": names}
    )
    statistic.update(
        {
            "predictions": torch.log_softmax(torch.eye(10)[[2, 0, 5]], dim=1),
            "targets": torch.tensor([2, 1, 5]),
            "groups": torch.tensor([0, 1, 5]),  # shape, horizontal, count
        }
    )
    values = statistic.compute()
    assert values["subtype_accuracy_shape"] == 1.0
    assert values["subtype_accuracy_horizontal"] == 0.0
    assert values["subtype_accuracy_count"] == 1.0
    assert "subtype_accuracy_closest_shape" in values
    assert AccuracyByGroupStatistics.needed_globals(statistic.params) == {
        "group_names": "name of every group, in the order of the `groups` values"
    }
    for bad in ("relational", ["two words"], []):
        with pytest.raises(ComponentError, match="the global group_names"):
            AccuracyByGroupStatistics.create(globals={"group_names": bad})


# ---- shipped configs ------------------------------------------------------------------------
@pytest.mark.parametrize("config", ["sort_of_clevr_cnn_mlp.yml", "sort_of_clevr_cnn_rn.yml"])
def test_shipped_configs_pass_check(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(CONFIGS / config)]) == 0, capsys.readouterr().err
    assert "handshake: ok" in capsys.readouterr().out


def test_a_split_that_cannot_fit_in_memory_is_refused_before_it_is_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A million images took 15.7 GiB, after hours of drawing, then a bare MemoryError."""
    monkeypatch.setattr("torchloom.host_memory.available_memory", lambda: 2**30)
    with pytest.raises(ComponentError, match="use images <= 30828") as refused:
        task(tmp_path, images=50_000)  # 0.8 GiB of pixels, more than half of 1 GiB
    assert "50000 images of 75x75 pixels need about 0.8 GiB" in str(refused.value)
    assert not list(tmp_path.iterdir())  # refused before anything was drawn or written
    task(tmp_path, images=1000).prepare()
