"""The handshake: every stream's shape and type is checked before a single batch is read.

For each section with a task, walk the components in execution order starting from the
task's output specs, and check each input: present; same rank; equal fixed sizes; symbolic
dimensions consistent across the whole graph (a model's `classes` is the task's); accepted
element type. Also: no stream is produced twice, a training section has a loss, and there
is something to train unless everything is frozen. Every problem is collected; the caller
raises them together.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchloom.core.component import Component
from torchloom.core.pipeline import Pipeline
from torchloom.core.streams import Dim, StreamSpec
from torchloom.errors import HandshakeError, Problem, Where, did_you_mean


@dataclass
class _Produced:
    spec: StreamSpec
    producer: str  # label of the component or task that writes it


class _Symbols:
    """Sizes bound to symbolic dimension names within one section."""

    def __init__(self) -> None:
        self.sizes: dict[str, tuple[int, str]] = {}

    def size_of(self, dim: Dim) -> int | None:
        if dim.size is not None:
            return dim.size
        if dim.name and dim.name in self.sizes:
            return self.sizes[dim.name][0]
        return None

    def bind(self, name: str, size: int, origin: str) -> str | None:
        """Bind name=size; returns a message when the name is already bound to another size."""
        known = self.sizes.get(name)
        if known is None:
            self.sizes[name] = (size, origin)
            return None
        if known[0] != size:
            return f"dimension '{name}' is {size} here but {known[0]} at {known[1]}"
        return None


def _check_input(
    stream: str, produced: _Produced, expected: StreamSpec, symbols: _Symbols, origin: str
) -> list[str]:
    """Messages for one consumed stream (empty when it fits)."""
    messages = []
    if not expected.accepts_dtype_of(produced.spec):
        messages.append(
            f"stream '{stream}': expected element type {expected.dtype_text()}, "
            f"received {produced.spec.dtype_text()} from {produced.producer}"
        )
    if expected.dims is None or produced.spec.dims is None:
        return messages
    if len(expected.dims) != len(produced.spec.dims):
        messages.append(
            f"stream '{stream}': expected rank {len(expected.dims)} "
            f"{expected.shape_text()}, received rank {len(produced.spec.dims)} "
            f"{produced.spec.shape_text()} from {produced.producer}"
        )
        return messages
    for axis, (want, got) in enumerate(zip(expected.dims, produced.spec.dims, strict=True)):
        want_size, got_size = symbols.size_of(want), symbols.size_of(got)
        if want_size is not None and got_size is not None and want_size != got_size:
            name = f" ('{want.name}')" if want.name else ""
            messages.append(
                f"stream '{stream}': dimension {axis}{name} expected {want_size}, "
                f"received {got_size} from {produced.producer} (expected "
                f"{expected.shape_text()}, received {produced.spec.shape_text()})"
            )
            continue
        size = got_size if got_size is not None else want_size
        for dim in (want, got):
            if dim.name and size is not None:
                clash = symbols.bind(dim.name, size, f"stream '{stream}' of {produced.producer}")
                if clash:
                    messages.append(f"stream '{stream}': {clash}")
    return messages


def _bind_declared(spec: StreamSpec, symbols: _Symbols, origin: str) -> list[str]:
    """A spec that names a dimension and fixes its size binds that name."""
    messages = []
    for dim in spec.dims or ():
        if dim.name and dim.size is not None:
            clash = symbols.bind(dim.name, dim.size, origin)
            if clash:
                messages.append(clash)
    return messages


def _check_section(section: str, pipeline: Pipeline, where: Where) -> list[Problem]:
    task = pipeline.tasks[section]
    task_where = where(section, "task")
    symbols = _Symbols()
    problems: list[Problem] = []
    for name, size in task.dimension_sizes().items():
        symbols.bind(task.dim_name(name), size, f"{section}.task ({type(task).__name__})")
    available: dict[str, _Produced] = {}
    for key, spec in task.pipeline_specs(task.output_specs()).items():
        label = f"{section}.task ({type(task).__name__})"
        available[task.stream_name(key)] = _Produced(spec, label)
        for message in _bind_declared(spec, symbols, f"stream '{key}' of {label}"):
            problems.append(Problem(task_where, label, message))

    for component in pipeline.components.values():
        comp_where = where("pipeline", component.name)
        for key, expected in component.pipeline_specs(component.input_specs()).items():
            stream = component.stream_name(key)
            renamed = f" (its '{key}')" if stream != key else ""
            if stream not in available:
                problems.append(
                    Problem(
                        comp_where,
                        f"[{section}] {component.label}",
                        f"reads stream '{stream}'{renamed}, which nothing before it produces",
                        did_you_mean(stream, available)
                        or f"available: {', '.join(sorted(available)) or 'none'}; rename with "
                        "`streams:`",
                    )
                )
                continue
            for message in _check_input(
                stream, available[stream], expected, symbols, component.label
            ):
                problems.append(Problem(comp_where, f"[{section}] {component.label}", message))
        for key, spec in component.pipeline_specs(component.output_specs()).items():
            stream = component.stream_name(key)
            if stream in available:
                problems.append(
                    Problem(
                        comp_where,
                        f"[{section}] {component.label}",
                        f"writes stream '{stream}', already produced by "
                        f"{available[stream].producer}",
                        "give one of them another name with a `streams:` mapping",
                    )
                )
                continue
            available[stream] = _Produced(spec, component.label)
            for message in _bind_declared(spec, symbols, f"stream '{stream}' of {component.label}"):
                problems.append(Problem(comp_where, f"[{section}] {component.label}", message))
    return problems


def _trainable(components: list[Component]) -> bool:
    return any(p.requires_grad for c in components for p in c.parameters())


def _merge_sections(problems: list[Problem]) -> list[Problem]:
    """One problem per mistake: the same message in training, validation and test (they
    share the pipeline) is listed once, naming every section it occurs in."""
    merged: dict[tuple[str, str, str, str], list[str]] = {}
    for problem in problems:
        section, _, subject = problem.subject.partition("] ")
        key = (problem.where, subject, problem.message, problem.suggestion)
        merged.setdefault(key, []).append(section.lstrip("["))
    return [
        Problem(where, f"[{', '.join(sections)}] {subject}", message, suggestion)
        for (where, subject, message, suggestion), sections in merged.items()
    ]


def handshake_problems(pipeline: Pipeline, where: Where) -> list[Problem]:
    problems = _merge_sections(
        [p for section in pipeline.tasks for p in _check_section(section, pipeline, where)]
    )
    if "training" in pipeline.tasks:
        if not pipeline.losses:
            problems.append(
                Problem(
                    where("pipeline"),
                    "training",
                    "the pipeline has no loss component to minimise",
                    "add e.g. `nllloss: {type: NLLLoss}` to the pipeline",
                )
            )
        components = list(pipeline.components.values())
        everything_frozen = all(c.frozen for c in components if any(True for _ in c.parameters()))
        if not _trainable(components) and not (
            everything_frozen and any(c.frozen for c in components)
        ):
            problems.append(
                Problem(
                    where("pipeline"),
                    "training",
                    "no component has trainable parameters",
                    "add a model, or unfreeze one",
                )
            )
    return problems


def handshake(pipeline: Pipeline, where: Where) -> None:
    """Raise one HandshakeError listing every problem, or return when the graph fits."""
    problems = handshake_problems(pipeline, where)
    if problems:
        raise HandshakeError(problems)
