"""`autotune latency`: this device's verify-latency curve for one model, on its own weights
or, before they are here, on random weights of its architecture."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.errors import AutotuneError
from autotune.measure.roofline import Roofline, measure_roofline

DEFAULT_REPEATS = 7
# The sizes `--roofline` times (the others interpolated): every size to 16, then sparser;
# all 64 sizes x 7 repeats of a 135M model take minutes on 2 cores.
ROOFLINE_GRID = (*range(1, 17), 20, 24, 32, 40, 48, 56, 64)
DEFAULT_MAX_TOKENS, ROOFLINE_MAX_TOKENS = 16, 64  # the sizes timed unless --max-tokens says


@dataclass
class LatencyRequest:
    model: str
    model_path: str | None = None
    random_weights: bool = False
    max_tokens: int = DEFAULT_MAX_TOKENS
    dtype: str = "auto"  # auto, float32, bfloat16, float16 (autotune.hardware)
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    repeats: int = DEFAULT_REPEATS
    roofline: bool = False  # also measure this machine's floor (``measure.roofline``)

    def sizes(self) -> list[int]:
        """The sizes timed: all of them, or with the roofline its grid's (and the last)."""
        if not self.roofline:
            return list(range(1, self.max_tokens + 1))
        return sorted({n for n in ROOFLINE_GRID if n < self.max_tokens} | {self.max_tokens})


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
    timed: list[int]  # the sizes timed; the others' seconds are interpolated
    roofline: Roofline | None = None

    @property
    def relative(self) -> list[float]:
        return [s / self.seconds[0] for s in self.seconds]

    def floor(self) -> list[float]:
        """Seconds under which each size's forward cannot go here (with the roofline)."""
        if self.roofline is None:
            return []
        return [self.roofline.floor(n) for n in range(1, len(self.seconds) + 1)]

    def as_dict(self) -> dict:
        data = {**asdict(self), "relative": [round(r, 4) for r in self.relative]}
        if self.roofline is not None:
            data["roofline"] = {
                **asdict(self.roofline),
                **self.roofline.summary(),
                "floor_ms": [round(f * 1e3, 3) for f in self.floor()],
                "x_floor": [round(r, 3) for r in self.roofline.ratios(self.seconds)],
            }
        return data


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
    sizes = request.sizes()
    label = f"latency: verify curve n = 1..{request.max_tokens}"
    with step(label, request.repeats + 1) as advance:
        curve = measure_latency_curve(
            runner, request.max_tokens, request.repeats, progress=advance, sizes=sizes
        )
    roofline = None
    if request.roofline:
        with step("latency: memory bandwidth and GEMM peak", 1) as advance:
            roofline = measure_roofline(runner)
            advance()
    return DeviceLatency(
        model=name,
        random_weights=request.random_weights,
        num_layers=runner.num_layers,
        hidden_size=runner.config.hidden_size,
        dtype=str(runner.dtype).removeprefix("torch."),
        hardware=hardware.describe(device),
        context_tokens=CONTEXT_TOKENS,
        seconds=curve.seconds,
        timed=sizes,
        roofline=roofline,
    )


def latency_heading(result: DeviceLatency) -> str:
    hw = result.hardware
    weights = "true" if result.random_weights else "false"
    return (
        f"verify latency of {result.model} (random_weights: {weights}, {result.dtype}, "
        f"{result.num_layers} layers) on {hw['device']} ({hw['device_name']}, "
        f"{hw['threads']} threads), after a {result.context_tokens}-token context"
    )


def roofline_line(result: DeviceLatency) -> str | None:
    """The floor's formula with this machine's numbers, and where it turns compute-bound."""
    roofline = result.roofline
    if roofline is None:
        return None
    knee = roofline.knee()
    if knee < 1:
        bound = "compute-bound at every n"
    else:
        bound = f"memory-bound up to n = {int(knee)}, compute-bound past it"
    interpolated = len(result.timed) < len(result.seconds)
    return f"{roofline.formula()}: {bound}" + (
        "; only the sizes timed are shown" if interpolated else ""
    )


def latency_table(result: DeviceLatency):
    from rich.table import Table

    headers = ["new tokens", "ms", "relative to 1"]
    if result.roofline is not None:
        headers += ["floor ms", "x floor"]
    table = Table()
    for header in headers:
        table.add_column(header, justify="right")
    floor, relative = result.floor(), result.relative
    for n in result.timed:
        seconds = result.seconds[n - 1]
        row = [str(n), f"{seconds * 1e3:.2f}", f"{relative[n - 1]:.3f}"]
        if floor:
            row += [f"{floor[n - 1] * 1e3:.2f}", f"{seconds / floor[n - 1]:.2f}"]
        table.add_row(*row)
    return table
