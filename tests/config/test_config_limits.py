"""Loading limits (torchloom.config.limits): each bounded where it is cheap to check, named in
the error, generous for real configs (every shipped one is far inside), documented.

Configs that would explode without a limit are loaded in a child process that caps its memory
and is given a deadline, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import torchloom
from torchloom.config import load_config, packaged_configs_root
from torchloom.config.interpolation_bounds import check_interpolation_bounds
from torchloom.config.limits import (
    LIMITS,
    MAX_ALIASES,
    MAX_CHARS,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_INTERPOLATION_STEPS,
    MAX_STRING_LENGTH,
    MAX_VALUES,
)
from torchloom.config.yaml_reader import parse_config_text
from torchloom.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

GUARDED_LOAD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))
from torchloom.config import load_config
from torchloom.errors import ConfigError
start = time.perf_counter()
try:
    load_config(sys.argv[1], sys.argv[2:])
    error = None
except ConfigError as caught:
    error = str(caught)
print(json.dumps({"error": error, "seconds": time.perf_counter() - start}))
"""


def load_guarded(path: Path, *overrides: str) -> dict[str, Any]:
    """load_config in a child process (2 GB of memory, 20 s): its error and its seconds."""
    source_root = str(Path(torchloom.__file__).resolve().parents[1])
    try:
        done = subprocess.run(
            [sys.executable, "-c", GUARDED_LOAD, str(path), *overrides],
            capture_output=True,
            text=True,
            timeout=20,
            env={"PYTHONPATH": source_root, "PATH": "/usr/bin:/bin"},
            cwd=path.parent,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path.name} took over 20 s: it is not bounded")
    assert done.returncode == 0, done.stderr[-3000:]  # a MemoryError or RecursionError
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def refused(path: Path, limit: str, *overrides: str, seconds: float = 2) -> str:
    """The error of loading `path`, which must name `limit` and come within `seconds` (a
    bomb's refusal takes milliseconds; the bound only has to be robust on a busy machine)."""
    outcome = load_guarded(path, *overrides)
    assert outcome["error"] is not None, f"{path.name} was loaded"
    assert f"loading limit {limit}" in outcome["error"], outcome["error"]
    assert outcome["seconds"] < seconds, outcome
    return str(outcome["error"])


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


# ---- the YAML document: counted on the node graph, aliases still shared ---------------------
def test_an_alias_bomb_is_refused_at_the_line_it_passes_the_limit(tmp_path: Path) -> None:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]" for n in range(1, 9)]
    path = write(tmp_path, "laughs.yml", "\n".join(lines) + "\n")
    # 10 + 100 + 1,000 + 10,000 list items (plus keys) pass 10,000 on the fourth line.
    assert "laughs.yml:4: loading limit max_values" in refused(path, "max_values")


def test_aliases_are_counted(tmp_path: Path) -> None:
    uses = ", ".join(["*a"] * MAX_ALIASES)
    assert parse_config_text(f"a: &a 1\nb: [{uses}]\n", "ok.yml").size.aliases == MAX_ALIASES
    path = write(tmp_path, "aliases.yml", f"a: &a 1\nb: [{uses}]\nc: [*a]\n")
    assert "aliases.yml:3" in refused(path, "max_aliases")


def test_the_values_limit_counts_keys_and_list_items_exactly() -> None:
    at_limit = "a: [" + ", ".join(["0"] * (MAX_VALUES - 1)) + "]\n"  # 1 key + items
    assert parse_config_text(at_limit, "ok.yml").size.values == MAX_VALUES
    with pytest.raises(ConfigError, match="max_values"):
        parse_config_text(at_limit.replace("[", "[0, "), "over.yml")


def test_characters_are_counted_with_aliases_expanded(tmp_path: Path) -> None:
    text = "x" * 100_000
    times = MAX_CHARS // len(text) + 1
    path = write(tmp_path, "chars.yml", f"a: &a {text}\nb: [{', '.join(['*a'] * times)}]\n")
    refused(path, "max_chars")


def key_path(levels: int) -> str:
    """A mapping whose longest key path has `levels` keys."""
    return "{a: " * (levels - 1) + "{a: 1" + "}" * levels + "\n"


def test_nesting_up_to_the_limit_loads_and_one_more_level_is_refused(tmp_path: Path) -> None:
    deepest = load_config(write(tmp_path, "deep.yml", key_path(MAX_DEPTH))).data
    for _ in range(MAX_DEPTH - 1):
        deepest = deepest["a"]
    assert deepest == {"a": 1}  # OmegaConf and every later step cope with this depth
    path = write(tmp_path, "deeper.yml", key_path(MAX_DEPTH + 1))
    assert "deeper.yml:1" in refused(path, "max_depth")


def test_interpolations_nested_in_one_string_are_bounded(tmp_path: Path) -> None:
    nested = "${oc.select:" * (MAX_DEPTH + 1) + "x" + "}" * (MAX_DEPTH + 1)
    refused(write(tmp_path, "nested.yml", f'x: 1\ny: "{nested}"\n'), "max_depth")


# ---- files: their size, how many are read, what they add up to ------------------------------
def test_a_big_file_is_refused_by_its_size_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "huge.yml"
    with path.open("wb") as stream:  # 100 MB, sparse: nothing is written but its length
        stream.truncate(100 * 1024**2)
    message = refused(path, "max_file_bytes")
    assert f"larger than {MAX_FILE_BYTES:,} bytes" in message
    # Not a syntax error: the limit is checked before the (here invalid) text is read.
    write(tmp_path, "just_over.yml", "# " + "x" * MAX_FILE_BYTES + "\n")
    refused(tmp_path / "just_over.yml", "max_file_bytes")


def test_an_include_that_repeats_a_file_at_every_level_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "f0.yml", "a: 1\n")
    for level in range(1, 12):  # 2**11 reads without the limit
        write(tmp_path, f"f{level}.yml", f"default_configs: [f{level - 1}.yml, f{level - 1}.yml]\n")
    message = refused(tmp_path / "f11.yml", "max_files")
    assert f"more than {MAX_FILES} files read" in message


def test_values_are_added_up_across_included_files(tmp_path: Path) -> None:
    half = MAX_VALUES // 2 + 1
    for name in ("one", "two"):
        write(tmp_path, f"{name}.yml", f"{name}: [" + ", ".join(["0"] * half) + "]\n")
    path = write(tmp_path, "top.yml", "default_configs: [one.yml, two.yml]\n")
    # Not a bomb: two real files, each parsed in full (about a second) before they add up.
    assert "keys and list items together" in refused(path, "max_values", seconds=15)


# ---- overrides ------------------------------------------------------------------------------
def test_an_override_nested_too_deep_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "cfg.yml", "a: 1\n")
    key = ".".join(["k"] * (MAX_DEPTH + 1))
    assert "command line" in refused(path, "max_depth", f"+{key}=1")
    uses = ", ".join(["*x"] * (MAX_ALIASES + 1))
    message = refused(path, "max_aliases", f"+b={{x: &x 1, y: [{uses}]}}")
    assert "override '+b=" in message


# ---- interpolation: estimated from the graph before anything is resolved -------------------
def doubling(first: str, levels: int, form: str = '"${{.x{n}}}${{.x{n}}}"') -> str:
    lines = [f"x0: {first}"]
    lines += [f"x{n}: " + form.format(n=n - 1) for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_string_doubling_chain_is_refused_by_its_steps(tmp_path: Path) -> None:
    path = write(tmp_path, "doubling.yml", doubling("lol", 40))
    # x13 needs 2 + 6 + ... = 16,382 references resolved: over 10,000.
    assert "doubling.yml:14: loading limit max_interpolation_steps: 'x13'" in refused(
        path, "max_interpolation_steps"
    )


def test_a_long_interpolated_string_is_refused_by_its_length(tmp_path: Path) -> None:
    path = write(tmp_path, "long.yml", doubling("x" * 2_000, 40))
    # x6 is 2,000 * 2**6 = 128,000 characters, after only 126 steps.
    message = refused(path, "max_string_length")
    assert "long.yml:7" in message and "'x6' builds a string of up to 128,0" in message


def test_a_mapping_doubled_by_interpolation_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "copies.yml", doubling("{a: 1}", 40, '["${{x{n}}}", "${{x{n}}}"]'))
    refused(path, "max_values")


def test_a_doubling_through_a_resolver_is_bounded_too(tmp_path: Path) -> None:
    form = '"${{oc.select:x{n}}}${{oc.select:x{n},none}}"'
    refused(write(tmp_path, "select.yml", doubling("lol", 40, form)), "max_interpolation_steps")


def test_an_environment_variable_counts_with_its_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOM_TEST_LONG", "v" * (MAX_STRING_LENGTH // 2 + 1))
    path = write(tmp_path, "env.yml", 'a: "${oc.env:LOOM_TEST_LONG}${oc.env:LOOM_TEST_LONG}"\n')
    with pytest.raises(ConfigError, match=r"env\.yml:1: loading limit max_string_length: 'a'"):
        load_config(path)


def test_a_long_chain_of_interpolations_is_refused(tmp_path: Path) -> None:
    lines = ["x0: 1", *(f"x{n}: ${{x{n - 1}}}" for n in range(1, 200))]
    # Declared last-first, so that the walk meets the whole chain at once.
    path = write(tmp_path, "chain.yml", "\n".join(reversed(lines)) + "\n")
    assert "chain of more than 50 interpolations" in refused(path, "max_depth")


def test_interpolations_within_the_limits_resolve_as_before(tmp_path: Path) -> None:
    text = """\
models: {small: {width: 8}, large: {width: 64}}
choice: large
model: ${models.${choice}}
copy: {a: "${..choice}-${.b}", b: "${oc.select:models.small.width,0}"}
pair: ["${model}", "${model}"]
"""
    data = load_config(write(tmp_path, "fine.yml", text)).data
    assert data["model"] == {"width": 64}
    assert data["copy"] == {"a": "large-8", "b": 8}
    assert data["pair"] == [{"width": 64}, {"width": 64}]


def test_a_key_computed_by_a_resolver_cannot_be_bounded(tmp_path: Path) -> None:
    path = write(tmp_path, "dyn.yml", "models: {a: 1}\nmodel: ${models.${oc.env:HOME}}\n")
    with pytest.raises(ConfigError, match=r"dyn\.yml:2: key 'model': cannot bound") as caught:
        load_config(path)
    assert "computed by a resolver" in str(caught.value)


# ---- generous for real configs, and documented ----------------------------------------------
def shipped_configs() -> list[Path]:
    return sorted(packaged_configs_root().rglob("*.yml"))


def longest_string(value: Any) -> int:
    if isinstance(value, dict):
        return max([longest_string(v) for v in value.values()], default=0)
    if isinstance(value, list):
        return max([longest_string(v) for v in value], default=0)
    return len(value) if isinstance(value, str) else 0


# The mandatory values (`???`) shipped configs leave to the command line, set as a user would.
MANDATORY = {"mnist_transplant_encoder.yml": ["pipeline.image_encoder.load.file=x.pt"]}


def nowhere(keys: tuple[Any, ...]) -> str:
    return ""


def unresolved(file: Path) -> dict[str, Any]:
    data = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items() if k != "default_configs"}


def test_every_shipped_config_is_far_inside_every_limit() -> None:
    used: dict[str, int] = dict.fromkeys((limit.name for limit in LIMITS), 0)
    for path in shipped_configs():
        text = path.read_text(encoding="utf-8")
        size = parse_config_text(text, path.name).size
        used["max_file_bytes"] = max(used["max_file_bytes"], len(text.encode()))
        used["max_aliases"] = max(used["max_aliases"], size.aliases)
        loaded = load_config(path, MANDATORY.get(path.name, []))
        resolved = check_interpolation_bounds(loaded.data, nowhere)
        # Steps are counted on the unresolved files: each reference, and what it follows.
        steps = sum(
            check_interpolation_bounds(unresolved(file), nowhere).steps for file in loaded.files
        )
        used["max_files"] = max(used["max_files"], len(loaded.files))
        used["max_values"] = max(used["max_values"], resolved.values)
        used["max_chars"] = max(used["max_chars"], resolved.chars)
        used["max_depth"] = max(used["max_depth"], resolved.depth)
        used["max_string_length"] = max(used["max_string_length"], longest_string(loaded.data))
        used["max_interpolation_steps"] = max(used["max_interpolation_steps"], steps)
    assert len(shipped_configs()) >= 20
    assert used["max_values"] > 100 and used["max_depth"] >= 5  # the walk measured something
    for limit in LIMITS:
        assert used[limit.name] * 8 < limit.value, (limit.name, used[limit.name], limit.value)


def test_the_user_guide_documents_every_limit_with_its_value() -> None:
    guide = (REPO / "docs" / "user-guide.md").read_text(encoding="utf-8")
    section = guide.split("### Loading limits", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([\d,]+)", section, re.M)}
    assert rows == {limit.name: f"{limit.value:,}" for limit in LIMITS}
    assert MAX_STRING_LENGTH == 100_000 and MAX_INTERPOLATION_STEPS == 10_000  # as shown
