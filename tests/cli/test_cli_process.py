"""The few `loom` checks that need a real process: help without torch, the exit status of a
user error and of an internal bug, and what each prints on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from loom_cli_harness import GOOD_CONFIG, MNIST_CONFIGS, run_loom_process, write_config

HELP_PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from torchloom.cli.main import main
    results = {}
    for argv in (["--help"], ["check", "--help"], ["config", "--help"],
                 ["components", "--help"], ["train", "--help"]):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                main(argv)
            status = None
        except SystemExit as exit_:
            status = exit_.code
        results[" ".join(argv)] = {"status": status, "out": out.getvalue()}
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision"))
    print(json.dumps({"results": results, "heavy": heavy}))
    """
)


def test_help_never_imports_torch() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", HELP_PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(probe.stdout)
    assert report["heavy"] == [], "help imported: " + ", ".join(report["heavy"][:5])
    for argv, result in report["results"].items():
        assert result["status"] == 0, argv
        assert result["out"].startswith("usage: loom"), (argv, result["out"][:200])
    top = report["results"]["--help"]["out"]
    for command in ("check", "config", "components", "train", "--debug"):
        assert command in top
    check = report["results"]["check --help"]["out"]
    for part in ("config", "OVERRIDE", "--disable"):
        assert part in check


def test_user_error_exits_2_without_traceback_and_writes_nothing(tmp_path: Path) -> None:
    configs, work = tmp_path / "configs", tmp_path / "work"
    configs.mkdir()
    work.mkdir()
    bad = write_config(configs, GOOD_CONFIG + "training:\n  optimiser: {}\n")
    done = run_loom_process("check", str(bad), cwd=work)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "bad.yml:9" in done.stderr and "did you mean 'optimizer'?" in done.stderr
    assert done.stdout == ""
    assert list(work.iterdir()) == []


BROKEN_PLUGIN = '''
"""A component with a bug in it: building it raises what no user could fix."""
from torchloom.core.component import Component


class Broken(Component):
    def __init__(self, params, context):
        super().__init__(params, context)
        self.ratio = 1 / 0

    def forward(self, inputs):
        return {}
'''


def test_internal_bug_exits_1_with_its_traceback(tmp_path: Path) -> None:
    plugins, work = tmp_path / "plugins", tmp_path / "work"
    plugins.mkdir()
    work.mkdir()
    (plugins / "loom_cli_broken_plugin.py").write_text(BROKEN_PLUGIN, encoding="utf-8")
    config = write_config(
        tmp_path, GOOD_CONFIG + "  broken: {type: 'loom_cli_broken_plugin:Broken'}\n", "buggy.yml"
    )
    done = run_loom_process("check", str(config), cwd=work, extra_path=plugins)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback (most recent call last)" in done.stderr
    assert "ZeroDivisionError" in done.stderr
    assert "loom_cli_broken_plugin.py" in done.stderr
    assert list(work.iterdir()) == []


def loom_into_closed_pipe(*argv: str, cwd: Path) -> tuple[int, str]:
    """`loom ARGV... | head -0`: the reader of stdout is gone before loom writes a byte (as
    `head` is once it has its lines). The exit status and what loom printed on stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "torchloom.cli.main", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read()
    return process.wait(timeout=120), stderr


def fake_runs(expdir: Path, count: int) -> None:
    for number in range(count):
        folder = expdir / "mlp" / f"20240101_{number:06d}"
        folder.mkdir(parents=True)
        summary = {"pipeline": "mlp", "status": "epoch_limit", "epochs": number}
        (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


def test_a_closed_stdout_pipe_ends_every_command_quietly(tmp_path: Path) -> None:
    fake_runs(tmp_path / "runs", 3)
    for argv in (["runs", "runs"], ["components"], ["--help"]):
        status, stderr = loom_into_closed_pipe(*argv, cwd=tmp_path)
        assert stderr == "", (argv, stderr)
        # 128 + SIGPIPE, as for a program that SIGPIPE ended; argparse writes its help
        # ignoring OSError, and exits 0.
        assert status == (0 if argv == ["--help"] else 141), (argv, status)


def test_loom_runs_piped_into_head_prints_its_first_line_and_no_traceback(tmp_path: Path) -> None:
    fake_runs(tmp_path / "runs", 1500)  # a table far larger than a pipe's buffer
    done = subprocess.run(
        f"'{sys.executable}' -m torchloom.cli.main runs runs | head -2",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.splitlines()[0].split()[:3] == ["pipeline", "date", "status"]
    assert len(done.stdout.splitlines()) == 2
    assert done.stderr == ""


# Sends the process a real SIGINT from inside its interpreter's shutdown (an atexit callback,
# run after `main` has returned), exactly where a late Ctrl-C lands.
LATE_SIGINT = textwrap.dedent(
    """
    import atexit, os, signal, sys
    from torchloom.cli.main import main
    atexit.register(os.kill, os.getpid(), signal.SIGINT)
    sys.argv = ["loom", *sys.argv[1:]]
    sys.exit(main())
    """
)


def test_a_sigint_during_interpreter_shutdown_is_ignored(tmp_path: Path) -> None:
    fake_runs(tmp_path / "runs", 2)
    done = subprocess.run(
        [sys.executable, "-c", LATE_SIGINT, "runs", "runs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stderr == "", done.stderr
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 4, "the table: header, separator, two runs"


IMPORT_PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from torchloom.cli.main import main
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(sys.argv[1:])
    heavy = sorted({m.split(".")[0] if not m.startswith("torch._dynamo") else "torch._dynamo"
                    for m in sys.modules
                    if m.split(".")[0] in ("torch", "torchvision", "torchmetrics")})
    print(json.dumps({"status": status, "heavy": heavy}))
    """
)


def _imports_of(*argv: str) -> dict[str, object]:
    probe = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(probe.stdout.strip().splitlines()[-1]))


def test_listing_components_imports_no_torch() -> None:
    # `loom components` reads families and descriptions from the source (core/catalog.py).
    assert _imports_of("components") == {"status": 0, "heavy": []}


def test_check_imports_only_what_the_pipeline_needs() -> None:
    # LeNet-5 on MNIST needs torch, not torchvision (its transforms are made when data is
    # loaded), torchmetrics (statistics count when a worker makes them ready) or torch._dynamo
    # (which building an optimizer imports; `loom check` only checks its arguments).
    report = _imports_of("check", str(MNIST_CONFIGS / "lenet5.yml"))
    assert report == {"status": 0, "heavy": ["torch"]}


# A launched worker's fast exit (cli/train.py) with an exit handler registered before it, as
# a user's plugin or coverage registers one.
FAST_EXIT = textwrap.dedent(
    """
    import atexit, pathlib, sys
    from torchloom.cli.train import _exit_at_once
    atexit.register(pathlib.Path(sys.argv[1]).write_text, "ran")
    atexit.register(_exit_at_once)
    sys.exit(3)
    """
)


def test_a_workers_fast_exit_runs_the_other_exit_handlers(tmp_path: Path) -> None:
    """The fast exit skips the interpreter's teardown (2 s of a launch), not the exit
    handlers registered before it (they take milliseconds); it ends the process itself, with
    status 0 (the status the script asked for, 3, is never reached)."""
    marker = tmp_path / "handler"
    done = subprocess.run(
        [sys.executable, "-c", FAST_EXIT, str(marker)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran"
