"""default_configs nesting: merge order, packaged loom:// configs, include errors, where()."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from torchloom.config import PACKAGED_PREFIX, LoadedConfig, load_config
from torchloom.config import loading as loading_module
from torchloom.errors import ConfigError


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # where() shows paths relative to the working directory; make that tmp_path.
    monkeypatch.chdir(tmp_path)


def test_plain_file_loads_with_metadata(tmp_path: Path) -> None:
    top = write(tmp_path, "top.yml", "a: 1\nb: {c: hello}\n")
    cfg = load_config("top.yml")
    assert isinstance(cfg, LoadedConfig)
    assert cfg.data == {"a": 1, "b": {"c": "hello"}}
    assert cfg.path == top.resolve()
    assert cfg.files == [top.resolve()]
    assert cfg.overrides == []


def test_empty_file_is_an_empty_mapping(tmp_path: Path) -> None:
    write(tmp_path, "empty.yml", "# nothing here\n")
    assert load_config(tmp_path / "empty.yml").data == {}


def test_including_file_wins_and_mappings_merge_key_by_key(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "optimizer: {type: Adam, lr: 0.1}\nseed: 1\n")
    write(tmp_path, "top.yml", "default_configs: [base.yml]\noptimizer: {lr: 0.5}\n")
    cfg = load_config("top.yml")
    assert cfg.data == {"optimizer": {"type": "Adam", "lr": 0.5}, "seed": 1}
    assert "default_configs" not in cfg.data


def test_later_include_wins_over_earlier(tmp_path: Path) -> None:
    write(tmp_path, "first.yml", "value: first\nonly_first: 1\n")
    write(tmp_path, "second.yml", "value: second\n")
    write(tmp_path, "top.yml", "default_configs: [first.yml, second.yml]\n")
    cfg = load_config("top.yml")
    assert cfg.data == {"value": "second", "only_first": 1}
    assert cfg.files == [(tmp_path / n).resolve() for n in ("first.yml", "second.yml", "top.yml")]


def test_single_string_include_is_accepted(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "x: 1\n")
    write(tmp_path, "top.yml", "default_configs: base.yml\n")
    assert load_config("top.yml").data == {"x": 1}


def test_three_levels_merge_depth_first_relative_to_each_file(tmp_path: Path) -> None:
    write(tmp_path, "deep/deepest/level3.yml", "a: 3\nb: 3\nc: 3\nd: 3\n")
    write(tmp_path, "deep/level2.yml", "default_configs: [deepest/level3.yml]\nb: 2\nc: 2\n")
    write(tmp_path, "sibling.yml", "c: sibling\n")
    write(tmp_path, "top.yml", "default_configs: [deep/level2.yml, sibling.yml]\nd: top\n")
    cfg = load_config("top.yml")
    assert cfg.data == {"a": 3, "b": 2, "c": "sibling", "d": "top"}
    names = [p.name for p in cfg.files]
    assert names == ["level3.yml", "level2.yml", "sibling.yml", "top.yml"]


def test_diamond_include_is_allowed_and_listed_once(tmp_path: Path) -> None:
    write(tmp_path, "common.yml", "shared: common\nleft: common\n")
    write(tmp_path, "left.yml", "default_configs: [common.yml]\nleft: left\n")
    write(tmp_path, "right.yml", "default_configs: [common.yml]\nright: right\n")
    write(tmp_path, "top.yml", "default_configs: [left.yml, right.yml]\n")
    cfg = load_config("top.yml")
    # right.yml is merged as a whole (common.yml, then right.yml) over left.yml's result.
    assert cfg.data == {"shared": "common", "left": "common", "right": "right"}
    assert [p.name for p in cfg.files] == ["common.yml", "left.yml", "right.yml", "top.yml"]


def test_broken_file_in_a_diamond_is_reported_once(tmp_path: Path) -> None:
    write(tmp_path, "common.yml", "a: [1\n")
    write(tmp_path, "left.yml", "default_configs: [common.yml]\n")
    write(tmp_path, "right.yml", "default_configs: [common.yml]\n")
    write(tmp_path, "top.yml", "default_configs: [left.yml, right.yml]\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    assert len(caught.value.problems) == 1
    assert "common.yml:2" in str(caught.value)


def test_lists_are_replaced_whole(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "layers: [1, 2, 3]\nnested: {items: [{x: 1}, {x: 2}]}\n")
    write(tmp_path, "top.yml", "default_configs: [base.yml]\nlayers: [9]\nnested: {items: []}\n")
    assert load_config("top.yml").data == {"layers": [9], "nested": {"items": []}}


def test_list_and_mapping_replace_each_other(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "a: [1, 2]\nb: {x: 1}\nc: {x: 1}\n")
    write(tmp_path, "top.yml", "default_configs: [base.yml]\na: {y: 2}\nb: [3]\nc: 5\n")
    assert load_config("top.yml").data == {"a": {"y": 2}, "b": [3], "c": 5}


def test_home_directory_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write(tmp_path, "home/configs/base.yml", "from_home: true\n")
    write(tmp_path, "top.yml", "default_configs: [~/configs/base.yml]\n")
    assert load_config("top.yml").data == {"from_home": True}


def test_packaged_configs_are_included_with_loom_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packaged = tmp_path / "packaged"
    write(packaged, "mnist/default.yml", "task: {type: MNIST}\nbatch_size: 64\n")
    monkeypatch.setattr(loading_module, "packaged_configs_root", lambda: packaged)
    write(tmp_path, "top.yml", f"default_configs: [{PACKAGED_PREFIX}mnist/default.yml]\n")
    cfg = load_config("top.yml")
    assert cfg.data == {"task": {"type": "MNIST"}, "batch_size": 64}
    # The top-level file may be a packaged one too.
    assert load_config(f"{PACKAGED_PREFIX}mnist/default.yml").data == cfg.data


def test_packaged_configs_root_points_inside_the_package() -> None:
    root = loading_module.packaged_configs_root()
    assert root.name == "configs" and root.parent.name == "torchloom"


def test_missing_include_names_including_file_line_and_suggestion(tmp_path: Path) -> None:
    write(tmp_path, "defaults.yml", "x: 1\n")
    write(tmp_path, "top.yml", "seed: 1\ndefault_configs:\n  - defualts.yml\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    message = str(caught.value)
    assert "top.yml:3" in message
    assert "defualts.yml" in message
    assert "did you mean 'defaults.yml'?" in message


def test_every_missing_include_is_reported_at_once(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "default_configs: [one.yml, two.yml]\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    assert len(caught.value.problems) == 2
    assert "one.yml" in str(caught.value) and "two.yml" in str(caught.value)


def test_missing_packaged_include_suggests_close_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "packaged", "lenet5.yml", "x: 1\n")
    monkeypatch.setattr(loading_module, "packaged_configs_root", lambda: tmp_path / "packaged")
    write(tmp_path, "top.yml", "default_configs: ['loom://lenet.yml']\n")
    # As it is written: 'lenet5.yml' would be read beside top.yml
    with pytest.raises(ConfigError, match=r"lenet\.yml.*did you mean 'loom://lenet5\.yml'"):
        load_config("top.yml")


def test_include_cycle_shows_the_chain(tmp_path: Path) -> None:
    write(tmp_path, "a.yml", "default_configs: [b.yml]\n")
    write(tmp_path, "b.yml", "x: 1\ndefault_configs: [a.yml]\n")
    with pytest.raises(ConfigError) as caught:
        load_config("a.yml")
    message = str(caught.value)
    assert "a.yml -> b.yml -> a.yml" in message
    assert "b.yml:2" in message


def test_file_including_itself_is_a_cycle(tmp_path: Path) -> None:
    write(tmp_path, "self.yml", "default_configs: [./self.yml]\n")
    with pytest.raises(ConfigError, match=r"self\.yml -> self\.yml"):
        load_config("self.yml")


@pytest.mark.parametrize(
    ("entries", "culprit"),
    [("5", "default_configs"), ("{a: b.yml}", "default_configs"), ("[ok.yml, 7]", "7")],
)
def test_default_configs_must_be_a_list_of_strings(
    tmp_path: Path, entries: str, culprit: str
) -> None:
    write(tmp_path, "ok.yml", "x: 1\n")
    write(tmp_path, "top.yml", f"name: x\ndefault_configs: {entries}\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    assert "top.yml:2" in str(caught.value)
    assert culprit in str(caught.value)


def test_missing_top_level_file_suggests_close_names(tmp_path: Path) -> None:
    write(tmp_path, "lenet5.yml", "x: 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config("lenet.yml")
    assert "lenet.yml" in str(caught.value)
    assert "did you mean 'lenet5.yml'?" in str(caught.value)
    # Names compared without their suffix: every config shares ".yml", which made
    # 'nofile.yml' look like 'l.yml'.
    write(tmp_path, "l.yml", "x: 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config("nofile.yml")
    assert "did you mean" not in str(caught.value)


def test_top_level_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="folder"):
        load_config("folder")


def test_problem_in_an_included_file_names_that_file(tmp_path: Path) -> None:
    write(tmp_path, "broken.yml", "a: [1, 2\n")
    write(tmp_path, "top.yml", "default_configs: [broken.yml]\n")
    with pytest.raises(ConfigError, match=r"broken\.yml:2"):
        load_config("top.yml")


def test_unsupported_yaml_values_are_errors_at_their_line(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "a: 1\nwhen: !!timestamp 2024-01-31\n")
    with pytest.raises(ConfigError, match=r"top\.yml:2.*key 'when'"):
        load_config("top.yml")


def test_where_points_at_include_top_file_and_override(tmp_path: Path) -> None:
    write(
        tmp_path,
        "configs/base.yml",
        """
        training:
          optimizer:
            type: Adam
            lr: 0.1
          layers:
            - size: 8
            - size: 16
        """,
    )
    write(
        tmp_path,
        "configs/top.yml",
        """
        default_configs: [base.yml]
        training:
          optimizer:
            lr: 0.5
        """,
    )
    cfg = load_config("configs/top.yml", ["training.optimizer.type=SGD", "+extra.deep.key=1"])
    assert cfg.where("training", "optimizer", "lr") == "configs/top.yml:4"
    assert cfg.where("training", "layers", 1, "size") == "configs/base.yml:7"
    assert cfg.where("training", "layers", "1") == "configs/base.yml:7"
    assert cfg.where("training", "optimizer", "type") == (
        "command-line override 'training.optimizer.type=SGD'"
    )
    assert cfg.where("extra", "deep") == "command-line override '+extra.deep.key=1'"
    # A mapping set in a file names the overrides that changed its keys (a check across
    # them fails at the mapping).
    assert cfg.where("training", "optimizer") == (
        "configs/top.yml:3 (changed by command-line override 'training.optimizer.type=SGD')"
    )
    # Deepest known prefix, then the top file when nothing is known.
    assert cfg.where("training", "optimizer", "not_a_key") == "configs/top.yml:3"
    assert cfg.where("nothing", "here") == "configs/top.yml"


def test_where_forgets_values_that_were_replaced_or_deleted(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "items:\n  - {a: 1}\n  - {b: 2}\nold: {x: 1}\n")
    write(tmp_path, "top.yml", "default_configs: [base.yml]\nitems: [{c: 3}]\n")
    cfg = load_config("top.yml", ["~old.x"])
    assert cfg.where("items", 0, "a") == "top.yml:2"  # base.yml's item 0 is gone
    assert cfg.where("items", 1) == "top.yml:2"
    assert cfg.where("old", "x") == "base.yml:4"


def test_where_shows_absolute_path_outside_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = write(tmp_path, "top.yml", "a: 1\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_config(top).where("a") == f"{top.resolve()}:1"


def test_mandatory_marker_does_not_erase_an_included_value(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "lr: 0.1\n")
    write(tmp_path, "top.yml", "default_configs: [base.yml]\nlr: ???\n")
    cfg = load_config("top.yml")
    assert cfg.data == {"lr": 0.1}
    assert cfg.where("lr") == "base.yml:1"


def test_a_mapping_of_another_type_replaces_the_included_one(tmp_path: Path) -> None:
    (tmp_path / "base.yml").write_text(
        "training:\n  scheduler: {type: CosineAnnealingLR, T_max: 10}\n"
        "  optimizer: {type: Adam, lr: 0.001}\n"
    )
    (tmp_path / "top.yml").write_text(
        "default_configs: [base.yml]\n"
        "training:\n  scheduler: {type: StepLR, step_size: 2}\n  optimizer: {lr: 0.01}\n"
    )
    data = load_config(tmp_path / "top.yml").data["training"]
    assert data["scheduler"] == {"type": "StepLR", "step_size": 2}  # no T_max left behind
    assert data["optimizer"] == {"type": "Adam", "lr": 0.01}  # same type: merged key by key
    overridden = load_config(tmp_path / "top.yml", ["training.optimizer={type: SGD, lr: 0.1}"])
    assert overridden.data["training"]["optimizer"] == {"type": "SGD", "lr": 0.1}


def test_a_mapping_is_loaded_as_its_yaml_would_be_without_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    def no_temporary_files(*args: object, **kwargs: object) -> None:
        raise AssertionError("a mapping config must not go through a temporary file")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", no_temporary_files)
    monkeypatch.setattr(tempfile, "mkstemp", no_temporary_files)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yml").write_text("training: {seed: 3, rate: 0.1}\n", encoding="utf-8")
    loaded = load_config(
        {"default_configs": ["base.yml"], "training": {"rate": "${training.seed}"}},
        ["training.seed=5"],
    )
    assert loaded.data == {"name": "python_pipeline", "training": {"seed": 5, "rate": 5}}
    assert loaded.where("training", "rate") == "config mapping 'python_pipeline', key training.rate"
    assert loaded.where("training", "seed") == "command-line override 'training.seed=5'"
    with pytest.raises(ConfigError) as raised:
        load_config({"name": "mine", "training": {"x": "${training.nowhere}"}})
    assert "config mapping 'mine', key training.x" in raised.value.format()


def test_a_misspelt_packaged_include_is_told_its_loom_path(tmp_path: Path) -> None:
    """It suggested 'lenet5.yml', which written so resolves beside the including file."""
    config = tmp_path / "mine.yml"
    config.write_text("default_configs: [loom://mnist/lenet.yml]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"did you mean 'loom://mnist/lenet5\.yml'\?"):
        load_config(config)
