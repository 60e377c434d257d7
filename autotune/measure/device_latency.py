"""`autotune latency`: this device's verify-latency curve for one model, on its own weights
or, before they are here, on random weights of its architecture."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.errors import AutotuneError

DEFAULT_REPEATS = 7  # every size timed; the tuners time a sparse grid (Workspace.verify_curve)


@dataclass
class LatencyRequest:
    model: str
    model_path: str | None = None
    random_weights: bool = False
    max_tokens: int = 16
    dtype: str = "auto"  # auto, float32, bfloat16, float16 (autotune.hardware)
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    repeats: int = DEFAULT_REPEATS


@dataclass
class DeviceLatency:
    model: str
    random_weights: bool
    num_layers: int
    hidden_size: int
    dtype: str
    hardware: dict  # autotune.hardware.describe
    context_tokens: int
    seconds: list[float]  # seconds[n - 1]: one forward over n new tokens after the context

    @property
    def relative(self) -> list[float]:
        return [s / self.seconds[0] for s in self.seconds]

    def as_dict(self) -> dict:
        return {**asdict(self), "relative": [round(r, 4) for r in self.relative]}


def measure_device_latency(request: LatencyRequest) -> DeviceLatency:
    from autotune import hardware
    from autotune.engine.runner import Runner
    from autotune.measure.costs import CONTEXT_TOKENS, measure_latency_curve
    from autotune.models.loading import placement
    from autotune.progress import step

    dtype, device = placement(request.dtype, request.device)
    tokens = CONTEXT_TOKENS + request.max_tokens  # the KV cache one curve fills
    if request.random_weights:
        from autotune.models import random_weights_model

        if request.model_path is not None:
            raise AutotuneError("--random-weights reads no weights: leave --model-path out")
        model, name = random_weights_model(request.model, dtype, device, tokens)
        runner = Runner(model)
    else:
        from autotune.models import load_target

        target = load_target(request.model, request.model_path, dtype, device, tokens)
        name, runner = target.name, Runner(target.model)
    label = f"latency: verify curve n = 1..{request.max_tokens}"
    with step(label, request.repeats + 1) as advance:
        curve = measure_latency_curve(runner, request.max_tokens, request.repeats, progress=advance)
    return DeviceLatency(
        model=name,
        random_weights=request.random_weights,
        num_layers=runner.num_layers,
        hidden_size=runner.config.hidden_size,
        dtype=str(runner.dtype).removeprefix("torch."),
        hardware=hardware.describe(device),
        context_tokens=CONTEXT_TOKENS,
        seconds=curve.seconds,
    )


def latency_heading(result: DeviceLatency) -> str:
    hw = result.hardware
    weights = "true" if result.random_weights else "false"
    return (
        f"verify latency of {result.model} (random_weights: {weights}, {result.dtype}, "
        f"{result.num_layers} layers) on {hw['device']} ({hw['device_name']}, "
        f"{hw['threads']} threads), after a {result.context_tokens}-token context"
    )


def latency_table(result: DeviceLatency):
    from rich.table import Table

    table = Table()
    for header in ("new tokens", "ms", "relative to 1"):
        table.add_column(header, justify="right")
    for n, (seconds, relative) in enumerate(zip(result.seconds, result.relative), 1):
        table.add_row(str(n), f"{seconds * 1e3:.2f}", f"{relative:.3f}")
    return table
