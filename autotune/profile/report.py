"""A profile's verdict for people: one table (method, tuned setting, held-back speedup with
its interval, lossless) and the same as a picture written beside the profile."""

from __future__ import annotations

from pathlib import Path

from autotune.files import atomic_path
from autotune.profile.blocks import Figures, MethodSettings, field_names
from autotune.profile.schema import ProfileBase

SETTING_WIDTH = 48


def setting_summary(block: MethodSettings) -> str:
    """The method's own settings in one short line (``key=value``, nested blocks
    flattened), cut to fit a table column."""
    shared = set(MethodSettings.model_fields)
    data = block.model_dump(mode="json", exclude_none=True)
    parts = []
    for key in field_names(type(block)):
        if key in shared or key not in data or key in ("head", "heads"):
            continue
        value = data[key]
        if isinstance(value, dict):
            if value.get("enabled") is False:
                continue
            value = ",".join(f"{k}={v}" for k, v in value.items() if not isinstance(v, dict))
        elif isinstance(value, list) and len(value) > 4:
            value = f"[{len(value)} items]"
        parts.append(f"{key}={value}")
    text = " ".join(parts)
    return text if len(text) <= SETTING_WIDTH else text[: SETTING_WIDTH - 1] + "…"


def _interval(figures: Figures) -> str:
    if figures.speedup_interval is None:
        return f"{figures.speedup:.2f}x"
    low, high = figures.speedup_interval
    return f"{figures.speedup:.2f}x [{low:.2f}, {high:.2f}]"


def verdict_table(profile: ProfileBase):
    """A rich table of every measured method, best first, the recommended one marked."""
    from rich.table import Table

    table = Table(title="held-back prompts, against plain greedy decoding (95% interval)")
    for column, justify in (
        ("method", "left"),
        ("tuned setting", "left"),
        ("speedup", "right"),
        ("tokens/step", "right"),
        ("lossless", "center"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for name, block in _measured(profile):
        assert block.measured is not None
        mark = " *" if name == profile.recommended else ""
        table.add_row(
            f"{name}{mark}",
            setting_summary(block),
            _interval(block.measured),
            f"{block.measured.tokens_per_step:.2f}",
            {True: "yes", False: "NO", None: "-"}[block.measured.lossless],
        )
    return table


def _measured(profile: ProfileBase) -> list[tuple[str, MethodSettings]]:
    blocks = [(n, b) for n, b in profile.method_blocks().items() if b.measured is not None]
    return sorted(blocks, key=lambda item: -item[1].measured.speedup)  # type: ignore[union-attr]


def plot_path(profile_path: Path) -> Path:
    return profile_path.with_suffix(".png")


def _load_panel(ax, name: str, load) -> None:
    """Speedup against requests in flight: the scheduled setting with its interval, the
    tuned setting kept at every level, the 1.0 line and the crossover."""
    levels = load.levels
    xs = [level.concurrency for level in levels]
    ys = [level.speedup for level in levels]
    lows = [y - (lv.speedup_interval or [y, y])[0] for y, lv in zip(ys, levels)]
    highs = [(lv.speedup_interval or [y, y])[1] - y for y, lv in zip(ys, levels)]
    ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=f"{name}, scheduled")
    tuned = [(lv.concurrency, lv.tuned_speedup) for lv in levels if lv.tuned_speedup is not None]
    if tuned:
        ax.plot(*zip(*tuned), marker="x", linestyle=":", label=f"{name}, tuned setting kept")
    for x, y, level in zip(xs, ys, levels):
        ax.annotate(level.setting, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    if load.crossover:
        ax.axvline(load.crossover, color="grey", linewidth=1, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("throughput speedup over plain")
    ax.set_title("under load: held-back rounds")
    ax.legend(fontsize="small")


def write_verdict_plot(profile: ProfileBase, path: Path) -> Path | None:
    """Speedup with its interval per method (and per workload category, when the prompts
    carry one), the 1.0 line drawn; None when nothing was measured."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    measured = _measured(profile)
    if not measured:
        return None
    categories = sorted({c for _, b in measured for c in (b.measured.by_category or {})})  # type: ignore[union-attr]
    groups = ["all"] + categories
    load = getattr(profile.block(profile.recommended), "load", None)
    bars_width = max(6.0, 1.2 * len(groups) * len(measured) / 2 + 3)
    if load is not None and load.levels:
        fig, (ax, load_ax) = plt.subplots(
            1, 2, figsize=(bars_width + 5, 4), gridspec_kw={"width_ratios": [bars_width, 5]}
        )
        _load_panel(load_ax, profile.recommended, load)
    else:
        fig, ax = plt.subplots(figsize=(bars_width, 4))
    _speedup_bars(ax, measured, categories, profile.recommended)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("speedup over plain greedy (95% interval)")
    ax.set_title(f"{profile.model.name}: held-back prompts")
    ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        with atomic_path(path) as temp:
            fig.savefig(temp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path


def _speedup_bars(
    ax, measured: list[tuple[str, MethodSettings]], categories: list[str], recommended: str | None
) -> None:
    """One bar a method in each group (all prompts, then each category), with its
    interval as error bars."""
    width = 0.8 / len(measured)
    for i, (name, block) in enumerate(measured):
        assert block.measured is not None
        figures = [block.measured] + [(block.measured.by_category or {}).get(c) for c in categories]
        xs, ys, lows, highs = [], [], [], []
        for g, fig_g in enumerate(figures):
            if fig_g is None:
                continue
            low, high = fig_g.speedup_interval or (fig_g.speedup, fig_g.speedup)
            xs.append(g + (i - (len(measured) - 1) / 2) * width)
            ys.append(fig_g.speedup)
            lows.append(fig_g.speedup - low)
            highs.append(high - fig_g.speedup)
        label = f"{name} (recommended)" if name == recommended else name
        ax.bar(xs, ys, width, yerr=[lows, highs], capsize=3, label=label)
