"""The documentation cannot go stale: every example in README.md and docs/*.md is run.

Fenced blocks are classified by their language and by an optional marker, an HTML comment on
the line right before the fence:

- ```yaml: a complete pipeline config (a `pipeline:` key and a training task, or
  `default_configs`) must pass `loom check`, and is trained by `loom train` for a few steps
  on a few samples (an episode limit, and a `subset` of every task that takes one), so that
  an example that passes the check but fails in training (a setting that resolves to null in
  online mode) cannot go unnoticed. Markers: `<!-- as: NAME.yml -->` (written under
  that name, for commands shown later on the page), `<!-- expect-error: NAME.yml -->` (must
  fail with exit status 2), `<!-- file: PATH -->` (a copy of a repository file: it must equal
  that file, and the file must pass `loom check`), `<!-- fragment -->` (part of a config,
  deliberately not checked). An unmarked block that is not a complete config fails the test,
  so nothing is skipped silently.
- ```python: executed in a fresh namespace with a temporary folder as the working directory.
  `<!-- module: NAME.py -->` blocks (of any page) are instead assembled, in order, into that
  module, which the other blocks and the configs import (`type: my_components:Class`,
  `import my_models`).
- ```console: a block with one `$ loom check ...` or `$ loom config ...` command (optionally
  prefixed by `PYTHONPATH=.`) must print exactly the rest of the block. Output that cannot be
  reproduced (training runs: dates, seeds, timings) is marked `<!-- illustrative -->`.
- ```toml in docs/writing-a-component.md: its `torchloom.components` entry points are
  installed as a distribution in the temporary folder, so the plugin example is checked too.

docs/reference/components.md must equal what tools/gen_reference.py generates now.
"""

from __future__ import annotations

import difflib
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from script_modules import load_script
from torchloom.analysis.schema import ITEMS, AnalysisConfig, OutputSpec, settings_model
from torchloom.cli.main import main
from torchloom.config import load_config
from torchloom.core.registry import clear_cache, resolve

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMPONENT_GUIDE = REPO / "docs" / "writing-a-component.md"
MODULE_NAME = "my_components"
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
CONSOLE_COMMAND = re.compile(r"^\$ (?:PYTHONPATH=\. )?loom (check|config) (.+)$")
NAMED = ("as", "expect-error", "file", "module")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str  # the preceding HTML comment's text, or ""

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    @property
    def marker_kind(self) -> str:
        return self.marker.split(":", 1)[0].strip()

    @property
    def marker_value(self) -> str:
        return self.marker.split(":", 1)[1].strip() if ":" in self.marker else ""


def parse_blocks(doc: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = doc.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].rstrip() == "```")
        previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.match(previous.strip())
        text = "".join(line + "\n" for line in lines[index + 1 : end])
        blocks.append(
            Block(doc, index + 1, opening.group(1), text, marker.group(1) if marker else "")
        )
        index = end + 1
    return blocks


ALL_BLOCKS = [block for doc in DOCS for block in parse_blocks(doc)]


def is_complete_config(text: str) -> bool:
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        return False
    training = data.get("training")
    has_training_task = isinstance(training, dict) and "task" in training
    return "default_configs" in data or ("pipeline" in data and has_training_task)


def problem_with(block: Block) -> str:
    """Why a block is neither checked nor deliberately marked, or '' when it is fine."""
    kind = block.marker_kind
    if block.lang == "yaml":
        if kind in ("fragment", "file", "expect-error"):
            return ""
        if kind not in ("", "as"):
            return f"unknown marker '{block.marker}' on a yaml block"
        if not is_complete_config(block.text):
            return "not a complete config: complete it or mark it <!-- fragment -->"
    elif block.lang == "python":
        if kind not in ("", "fragment", "module"):
            return f"unknown marker '{block.marker}' on a python block"
    elif block.lang == "console":
        if kind in ("illustrative", "fragment"):
            return ""
        commands = [line for line in block.text.splitlines() if line.startswith("$ ")]
        if len(commands) != 1 or not CONSOLE_COMMAND.match(block.text.splitlines()[0]):
            return "not one `$ loom check|config` command: mark it <!-- illustrative -->"
    return ""


def checked(lang: str, *kinds: str) -> list[Any]:
    return [
        pytest.param(block, id=block.id)
        for block in ALL_BLOCKS
        if block.lang == lang and block.marker_kind in kinds
    ]


# ---- the environment every example runs in ------------------------------------------------
def module_sources() -> dict[str, str]:
    """Every `<!-- module: NAME.py -->` module of the docs: NAME -> its blocks, in order."""
    parts: dict[str, list[str]] = {}
    for block in ALL_BLOCKS:
        if block.lang == "python" and block.marker_kind == "module":
            parts.setdefault(block.marker_value.removesuffix(".py"), []).append(block.text)
    return {name: "\n\n".join(texts) for name, texts in parts.items()}


def module_source() -> str:
    return module_sources()[MODULE_NAME]


def plugin_entry_points() -> dict[str, str]:
    (toml_block,) = [b for b in parse_blocks(COMPONENT_GUIDE) if b.lang == "toml"]
    project = tomllib.loads(toml_block.text)["project"]
    return dict(project["entry-points"]["torchloom.components"])


def install_fake_distribution(folder: Path) -> None:
    """What `pip install` of the documented package leaves behind, as far as entry points go:
    importlib.metadata finds a *.dist-info folder on sys.path."""
    dist_info = folder / "my_components-0.1.0.dist-info"
    dist_info.mkdir()
    metadata = "Metadata-Version: 2.1\nName: my-components\nVersion: 0.1.0\n"
    (dist_info / "METADATA").write_text(metadata, encoding="utf-8")
    lines = ["[torchloom.components]"]
    lines += [f"{name} = {target}" for name, target in plugin_entry_points().items()]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def docs_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder holding my_components.py (importable and installed as a plugin), the docs'
    other modules and every named config of the docs; it is the working directory, and HOME
    points inside it so that data tasks fill their `~/data/...` folders there."""
    modules = module_sources()
    for name, source in modules.items():
        (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
    install_fake_distribution(tmp_path)
    for block in ALL_BLOCKS:
        if block.lang == "yaml" and block.marker_kind in ("as", "expect-error"):
            path = tmp_path / block.marker_value
            assert not path.exists(), f"{block.id}: two blocks are named {block.marker_value}"
            path.write_text(block.text, encoding="utf-8")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    sys.path.insert(0, str(tmp_path))
    for name in modules:
        sys.modules.pop(name, None)
    clear_cache()
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in modules:
            sys.modules.pop(name, None)
        clear_cache()


def loom(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


# ---- the tests -----------------------------------------------------------------------------
def test_every_block_is_checked_or_deliberately_marked() -> None:
    problems = [f"{b.id}: {problem_with(b)}" for b in ALL_BLOCKS if problem_with(b)]
    assert not problems, "\n".join(problems)
    # The parser found what it should: a broken fence pattern would make every test vacuous.
    assert len([b for b in ALL_BLOCKS if b.lang == "yaml" and not b.marker_kind]) >= 5
    assert len(checked("python", "")) >= 3
    assert len(checked("console", "")) >= 4


@pytest.mark.parametrize("block", checked("yaml", "", "as"))
def test_config_passes_loom_check(
    block: Block, docs_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = docs_env / (block.marker_value or f"block_{block.line}.yml")
    path.write_text(block.text, encoding="utf-8")
    status, output = loom(capsys, "check", str(path))
    assert status == 0, f"{block.id} fails `loom check`:\n{output}"


# A docs config trained for a few steps: each epoch of a 64-sample subset is a batch or two, so
# three steps also pass epoch ends (schedulers, validation, checkpoints) and the test pass.
TRAINING_STEPS = 3
SUBSET = 64
FINISHED = ("episode_limit", "epoch_limit", "early_stopped", "converged")


@pytest.fixture(scope="module")
def data_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HOME for every trained example, so that data tasks fill `~/data/...` once."""
    return tmp_path_factory.mktemp("home")


def few_steps(path: Path) -> list[str]:
    """Overrides that train the config at `path` for a few steps on a few samples."""
    overrides = [f"++training.terminal_conditions.episode_limit={TRAINING_STEPS}"]
    written = yaml.safe_load(path.read_text(encoding="utf-8"))
    data = load_config(path).data
    if "analysis" not in data:  # the analysis of a few steps, unless the example is about it
        overrides.append("++analysis.preset=minimal")
    for section in ("training", "validation", "test"):
        if isinstance((written.get(section) or {}).get("task"), str):
            continue  # `task: ${training.task}`: the training task's subset is its subset
        task = (data.get(section) or {}).get("task")
        if isinstance(task, dict) and "subset" in resolve(task.get("type")).Params.model_fields:
            overrides.append(f"++{section}.task.subset={SUBSET}")
    return overrides


def trainable(lang: str, *kinds: str) -> list[Any]:
    return [
        block
        for block in checked(lang, *kinds)
        if is_complete_config(block.values[0].text)  # an included part has no pipeline
    ]


@pytest.mark.parametrize("block", trainable("yaml", "", "as", "file"))
def test_config_trains_for_a_few_steps(
    block: Block,
    docs_env: Path,
    data_home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if block.marker_kind == "file":
        path = REPO / block.marker_value
    else:
        path = docs_env / (block.marker_value or f"block_{block.line}.yml")
        path.write_text(block.text, encoding="utf-8")
    monkeypatch.setenv("HOME", str(data_home))
    expdir = docs_env / "runs"
    argv = ["train", str(path), *few_steps(path), "--expdir", str(expdir), "--quiet"]
    status, output = loom(capsys, *argv, "--tensorboard", "0")
    assert status == 0, f"{block.id} fails `loom train` ({' '.join(argv[2:])}):\n{output}"
    (summary,) = expdir.glob("*/*/summary.json")
    assert yaml.safe_load(summary.read_text(encoding="utf-8"))["status"] in FINISHED


@pytest.mark.parametrize("block", checked("yaml", "expect-error"))
def test_broken_config_is_rejected(
    block: Block, docs_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, output = loom(capsys, "check", block.marker_value)
    assert status == 2, f"{block.id} was meant to be rejected:\n{output}"


@pytest.mark.parametrize("block", checked("yaml", "file"))
def test_copy_of_a_repository_file_is_current_and_passes(
    block: Block, docs_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = REPO / block.marker_value
    assert block.text == path.read_text(encoding="utf-8"), f"{block.id} differs from {path}"
    if is_complete_config(block.text):  # an included part (default_mnist.yml) has no pipeline
        status, output = loom(capsys, "check", str(path))
        assert status == 0, f"{path} fails `loom check`:\n{output}"


@pytest.mark.parametrize("block", checked("console", ""))
def test_command_output_is_what_the_docs_show(
    block: Block,
    docs_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, *expected = block.text.splitlines()
    match = CONSOLE_COMMAND.match(first)
    assert match, block.id
    arguments = shlex.split(match.group(2))
    # Shipped configs are named from the repository root; the docs' own configs are in docs_env.
    if (REPO / arguments[0]).exists():
        monkeypatch.chdir(REPO)
    _, output = loom(capsys, match.group(1), *arguments)
    shown, now = normalized("\n".join(expected)), normalized(output)
    diff = difflib.unified_diff(shown.splitlines(), now.splitlines(), "docs", "now", lineterm="")
    assert now == shown, f"{block.id} is stale:\n" + "\n".join(diff)


@pytest.mark.parametrize("block", checked("python", ""))
def test_python_example_runs(block: Block, docs_env: Path) -> None:
    code = compile(block.text, block.id, "exec")
    exec(code, {"__name__": "__main__"})


def test_component_module_runs_in_a_fresh_namespace_and_registers(
    docs_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace: dict[str, Any] = {"__name__": "my_components_as_text"}
    exec(compile(module_source(), "my_components.py", "exec"), namespace)
    for name in plugin_entry_points():
        assert name in namespace, f"the toml block registers {name}, which the module lacks"
    status, output = loom(capsys, "components", "MLPClassifier")
    assert status == 0, output
    assert "hidden_size (int, default 32): Width of the hidden layer." in output
    assert "predictions: [batch, classes=3]" in output


def load_generator() -> Any:
    return load_script(REPO / "tools" / "gen_reference.py")


def test_component_reference_is_generated_from_the_current_code() -> None:
    generated = load_generator().generate()
    current = (REPO / "docs" / "reference" / "components.md").read_text(encoding="utf-8")
    assert current == generated, (
        "docs/reference/components.md is stale: run .venv/bin/python tools/gen_reference.py"
    )


def test_analysis_settings_are_generated_from_the_schema() -> None:
    page = (REPO / "docs" / "analysis.md").read_text(encoding="utf-8")
    assert page == load_generator().analysis_page(page), (
        "the settings tables of docs/analysis.md are stale: run "
        ".venv/bin/python tools/gen_reference.py"
    )


def test_every_analysis_setting_is_described() -> None:
    models = [AnalysisConfig, OutputSpec, *filter(None, map(settings_model, ITEMS))]
    undescribed = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not undescribed, f"fields without a description (the docs show it): {undescribed}"


def test_the_guide_lists_exactly_the_keys_a_resume_may_override() -> None:
    from torchloom.engine.resume import SAFE_RESUME_KEYS

    guide = (REPO / "docs" / "user-guide.md").read_text(encoding="utf-8")
    start = guide.index("**Overrides to `--resume` may change only")
    listed = set(re.findall(r"`(\.?[a-z_.]+)`", guide[start : guide.index("Anything else", start)]))
    written = set()
    for key in listed:  # `.episode_limit` continues the key before it
        written.add(key if not key.startswith(".") else "training.terminal_conditions" + key)
    assert written == set(SAFE_RESUME_KEYS)
