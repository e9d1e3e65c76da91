"""`loom check` refuses config bombs quickly, with exit 2 and the limit named (issue #14).

Without the loading limits each of these takes minutes or gigabytes, or ends in a
RecursionError traceback, so they run in one child process that caps its own memory and
gives each bomb a deadline: a regression fails these tests instead of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchloom

BOMB_SECONDS = 15  # each bomb's deadline in the child: far above the milliseconds it takes
MEMORY_BYTES = 6 * 1024**3  # the child's address space: torch alone maps about 3.3 GB

# Runs `loom check` on each file named in argv, in this process, under a deadline, and prints
# one JSON object per file: exit status, what it printed to stderr, seconds taken.
HARNESS = f"""
import contextlib, io, json, resource, signal, sys, time, traceback
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_BYTES}, {MEMORY_BYTES}))
import torchloom.cli.check  # torch and the command imported before any clock starts
from torchloom.cli.main import main

class Deadline(BaseException):
    pass

def expire(signum, frame):
    raise Deadline()

signal.signal(signal.SIGALRM, expire)
results = {{}}
for path in sys.argv[1:]:
    err = io.StringIO()
    start = time.perf_counter()
    signal.alarm({BOMB_SECONDS})
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(["check", path])
    except Deadline:
        status = "no answer in {BOMB_SECONDS} s"
    except BaseException:
        status = 1
        err.write(traceback.format_exc()[-3000:])
    finally:
        signal.alarm(0)
    results[path] = {{"status": status, "err": err.getvalue()[-3000:],
                      "seconds": time.perf_counter() - start}}
print(json.dumps(results))
"""


def alias_bomb() -> str:
    """The billion laughs in about 500 bytes: each list holds nine of the one before."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, 9):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def doubling(first: str, levels: int) -> str:
    """`x_n: "${.x_{n-1}}${.x_{n-1}}"`: each string twice the one before."""
    lines = [f'x0: "{first}"']
    lines += [f'x{n}: "${{.x{n - 1}}}${{.x{n - 1}}}"' for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def many_keys(count: int) -> str:
    return "".join(f"k{index}: {index}\n" for index in range(count))


def nested(levels: int) -> str:
    return "a: " + "{a: " * levels + "1" + "}" * levels + "\n"


BOMBS: dict[str, tuple[str, str]] = {  # name: (file text, the limit it must be refused by)
    "alias-bomb": (alias_bomb(), "max_values"),
    "interpolation-doubling": (doubling("lol", 36), "max_interpolation_steps"),
    "interpolated-string-length": (doubling("x" * 4000, 36), "max_string_length"),
    "million-keys": (many_keys(1_600_000), "max_file_bytes"),
    "deep-nesting": (nested(100), "max_depth"),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("bombs")
    paths = []
    for name, (text, _) in BOMBS.items():
        path = folder / f"{name}.yml"
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    source_root = str(Path(torchloom.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, *paths],
        capture_output=True,
        text=True,
        timeout=BOMB_SECONDS * len(paths) + 120,
        env={"PYTHONPATH": source_root, "PATH": "/usr/bin:/bin", "HOME": str(folder)},
        cwd=folder,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {Path(path).stem: outcome for path, outcome in results.items()}


def test_the_bombs_are_small() -> None:
    # What makes them bombs: a few hundred bytes ask for gigabytes (the key list is the
    # exception, refused by its size on disk before it is parsed).
    assert len(BOMBS["alias-bomb"][0]) < 600
    assert len(BOMBS["interpolation-doubling"][0]) < 1200


@pytest.mark.parametrize("name", BOMBS)
def test_a_bomb_is_refused_quickly_with_the_limit_named(
    name: str, refusals: dict[str, dict[str, Any]]
) -> None:
    outcome = refusals[name]
    limit = BOMBS[name][1]
    assert outcome["status"] == 2, outcome
    assert "Traceback" not in outcome["err"], outcome["err"]
    assert f"{name}.yml" in outcome["err"]
    assert f"loading limit {limit}" in outcome["err"], outcome["err"]
    assert "docs/user-guide.md" in outcome["err"]
    # Milliseconds in fact; the bound only has to be far below the minutes they took.
    assert outcome["seconds"] < 5, outcome
