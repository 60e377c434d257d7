"""The GPU check's closing table: each bar of issue 40's "done when" beside what the check
measured, pass or fail, with the card, torch, CUDA, date and commit. Pure functions of the
steps' results (the dict ``check.py`` writes as JSON), so a table can be rebuilt from an
old run's file and tested on made-up ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PASS, FAIL, NOT_RUN, NOT_MEASURED = "pass", "FAIL", "not run", "not measured"


@dataclass(frozen=True)
class Row:
    bar: str
    measured: str
    verdict: str


def _data(results: dict, step: str) -> dict | None:
    """A step's measurements, or None where it did not run to the end."""
    result = results.get(step) or {}
    return result.get("data") if result.get("status") == "ok" else None


def _why_not(results: dict, step: str) -> str:
    result = results.get(step)
    if not result:
        return f"{step} did not run"
    return f"{step}: {result.get('status')}: {result.get('why', '')}".rstrip(": ")


def _at_most(value: float, bar: float) -> str:
    return PASS if value <= bar else FAIL


def floor_one(results: dict) -> Row:
    bar = "latency: one token <= 1.3x its floor"
    data = _data(results, "latency")
    if data is None or not data.get("roofline"):
        return Row(bar, _why_not(results, "latency"), NOT_RUN)
    ratio = data["roofline"]["x_floor"][0]
    ms, floor = data["seconds"][0] * 1e3, data["roofline"]["floor_ms"][0]
    return Row(bar, f"{ratio:.2f}x ({ms:.2f} ms, floor {floor:.2f} ms)", _at_most(ratio, 1.3))


def floor_every(results: dict) -> Row:
    bar = "latency: every n <= 64 within 1.5x of its floor"
    data = _data(results, "latency")
    if data is None or not data.get("roofline"):
        return Row(bar, _why_not(results, "latency"), NOT_RUN)
    ratios = data["roofline"]["x_floor"]
    worst = max(data["timed"], key=lambda n: ratios[n - 1])
    measured = f"worst n={worst}: {ratios[worst - 1]:.2f}x (n timed: {len(data['timed'])})"
    return Row(bar, measured, _at_most(ratios[worst - 1], 1.5))


def over_graph_reference(results: dict) -> Row:
    """autotune's forward over n tokens against transformers' graph-captured forward of the
    same shapes, at every n both timed; the worst n decides."""
    bar = "latency <= 1.05x a graph-captured transformers forward"
    ours, theirs = _data(results, "latency"), _data(results, "hf_reference")
    if ours is None or theirs is None:
        why = _why_not(results, "latency" if ours is None else "hf_reference")
        return Row(bar, why, NOT_RUN)
    graph = {int(n): row.get("graph_ms") for n, row in theirs["sizes"].items()}
    ratios = {
        n: ours["seconds"][n - 1] * 1e3 / ms
        for n, ms in graph.items()
        if ms and n <= len(ours["seconds"])
    }
    if not ratios:
        return Row(bar, "no graph-captured size was timed (on a CPU: none)", NOT_MEASURED)
    worst = max(ratios, key=lambda n: ratios[n])
    first = f"n=1: {ratios[1]:.2f}x; " if 1 in ratios else ""
    measured = f"{first}worst n={worst}: {ratios[worst]:.2f}x ({len(ratios)} sizes)"
    return Row(bar, measured, _at_most(ratios[worst], 1.05))


def greedy_speed(results: dict) -> Row:
    bar = "embedded model: plain greedy >= 600 tokens/s"
    data = _data(results, "greedy")
    if data is None:
        return Row(bar, _why_not(results, "greedy"), NOT_RUN)
    speed = data["engine_tokens_per_s"]
    return Row(bar, f"{speed:.1f} tokens/s", PASS if speed >= 600 else FAIL)


def greedy_over_transformers(results: dict) -> Row:
    bar = "embedded greedy >= 1.0x graph-captured transformers decoding"
    data = _data(results, "greedy")
    if data is None:
        return Row(bar, _why_not(results, "greedy"), NOT_RUN)
    ratio, (low, high) = data["engine_over_transformers"], data["interval"]
    measured = (
        f"{ratio:.2f}x [{low:.2f}, {high:.2f}] ({data['transformers_tokens_per_s']:.1f} "
        f"tokens/s, {data['transformers']})"
    )
    if not data.get("compiled"):
        return Row(bar, measured + "; not graph-captured", NOT_MEASURED)
    return Row(bar, measured, PASS if ratio >= 1.0 else FAIL)


def profile_in_budget(results: dict) -> Row:
    bar = "profile ends within its budget, exit 0"
    result = results.get("profile")
    if not result or result.get("status") in (None, "skipped"):
        return Row(bar, _why_not(results, "profile"), NOT_RUN)
    seconds, budget = result.get("seconds", 0.0), result.get("budget_s", 0.0)
    code = result.get("returncode")
    measured = f"exit {code}, {seconds:.0f} s of a {budget:.0f} s budget"
    return Row(bar, measured, PASS if code == 0 and seconds <= budget else FAIL)


def profile_facts(document: dict) -> dict:
    """What the bars read of a profile (the YAML, loaded): its device, the recommended
    method and its held-back figures, the methods tuned in studies, the heads trained
    (the run's "train KIND heads" phases that spent time) and how long they took."""
    diagnostics = document.get("diagnostics") or {}
    # the deployable part first holds the recommended method; diagnostics hold them all
    methods = {**(diagnostics.get("methods") or {}), **(document.get("methods") or {})}
    verdict = {**(diagnostics.get("verdict") or {}), **(document.get("verdict") or {})}
    recommended = document.get("recommended") or verdict.get("recommended") or "none"
    training = [
        phase
        for phase in verdict.get("time") or []
        if str(phase.get("phase", "")).startswith("train ") and phase.get("spent_s", 0) > 0
    ]
    return {
        "device": (document.get("hardware") or {}).get("device", "?"),
        "recommended": recommended,
        "measured": (methods.get(recommended) or {}).get("measured"),
        "studies": sorted(name for name, block in methods.items() if (block or {}).get("study")),
        "heads_trained": [phase["phase"].split()[1] for phase in training],
        "training_s": round(sum(phase["spent_s"] for phase in training), 1),
    }


def _profile(results: dict) -> dict | None:
    data = _data(results, "profile")
    return (data or {}).get("profile")


def profile_on_gpu(results: dict) -> Row:
    """Its trials held the GPU: the profile was measured on CUDA, its studies ran (on Ray
    Tune, the only way autotune runs them) and trials reserved a GPU."""
    bar = "profile: studies' trials on Ray Tune holding the GPU"
    profile = _profile(results)
    if profile is None:
        return Row(bar, _why_not(results, "profile"), NOT_RUN)
    device = profile.get("device", "?")
    studies = profile.get("studies", [])
    gpus = (results.get("profile") or {}).get("gpus_per_trial", 0)
    measured = f"device {device}, {len(studies)} studies, {gpus:g} GPU a trial"
    ok = device.startswith("cuda") and bool(studies) and gpus > 0
    return Row(bar, measured, PASS if ok else FAIL)


def profile_heads(results: dict) -> Row:
    bar = "profile: heads trained on the GPU"
    profile = _profile(results)
    if profile is None:
        return Row(bar, _why_not(results, "profile"), NOT_RUN)
    trained = profile.get("heads_trained", [])
    measured = (
        f"trained: {', '.join(trained) or 'none'} (training {profile.get('training_s', 0):.0f} s)"
    )
    ok = bool(trained) and profile.get("device", "").startswith("cuda")
    return Row(bar, measured, PASS if ok else FAIL)


def profile_recommended(results: dict) -> Row:
    bar = "profile: recommended >= 2.0x greedy, interval above 1.5, lossless"
    profile = _profile(results)
    if profile is None:
        return Row(bar, _why_not(results, "profile"), NOT_RUN)
    method, measured = profile.get("recommended", "none"), profile.get("measured")
    if not measured:
        return Row(bar, f"recommended: {method}, nothing measured held back", FAIL)
    low, high = measured.get("speedup_interval") or (0.0, 0.0)
    speedup, lossless = measured["speedup"], measured.get("lossless")
    text = f"{method} {speedup:.2f}x [{low:.2f}, {high:.2f}], lossless {lossless}"
    ok = speedup >= 2.0 and low > 1.5 and lossless is True
    return Row(bar, text, PASS if ok else FAIL)


def profile_over_default(results: dict) -> Row:
    """The recommended method's tuned setting over its family's fastest published default,
    both measured on the profile's held-back prompts by ``against_defaults.py``; the
    interval is the ratio's own, paired over prompts."""
    bar = "profile: tuned >= 1.15x its family's published default"
    if _profile(results) is None:
        return Row(bar, _why_not(results, "profile"), NOT_RUN)
    data = _data(results, "against_defaults")
    if data is None:
        return Row(bar, _why_not(results, "against_defaults"), NOT_RUN)
    ratio = data.get("ratio")
    if ratio is None:
        return Row(bar, data.get("no_default") or "no ratio was measured", NOT_MEASURED)
    low, high = ratio["interval"]
    lossless = ((data.get("variants") or {}).get(data["method"]) or {}).get("lossless")
    measured = (
        f"{data['method']} {ratio['value']:.2f}x [{low:.2f}, {high:.2f}] over "
        f"{ratio['best_default']}, {ratio['prompts']} prompts, lossless {lossless}"
    )
    return Row(bar, measured, PASS if ratio["value"] >= 1.15 else FAIL)


def contract_suite(results: dict) -> Row:
    bar = "drafter contract (and static step) suite passes on the GPU"
    result = results.get("tests")
    if not result or result.get("status") == "skipped" or "data" not in result:
        return Row(bar, _why_not(results, "tests"), NOT_RUN)
    data = result["data"]
    counts = ", ".join(f"{data.get(k, 0)} {k}" for k in ("passed", "failed", "errors", "skipped"))
    measured = f"{counts} on {data.get('device', '?')}"
    if data.get("failed") or data.get("errors") or not data.get("passed"):
        return Row(bar, measured, FAIL)
    return Row(bar, measured, PASS if str(data.get("device")).startswith("cuda") else NOT_MEASURED)


BARS: list[Callable[[dict], Row]] = [
    floor_one,
    floor_every,
    over_graph_reference,
    greedy_speed,
    greedy_over_transformers,
    profile_in_budget,
    profile_on_gpu,
    profile_heads,
    profile_recommended,
    profile_over_default,
    contract_suite,
]


def rows(results: dict) -> list[Row]:
    return [bar(results) for bar in BARS]


def heading(results: dict) -> str:
    env = (results.get("environment") or {}).get("data") or {}
    nvml = env.get("nvml_gpus", env.get("gpus"))
    return (
        f"GPU check on {env.get('device_name', '?')}: torch {env.get('torch', '?')}, "
        f"CUDA {env.get('cuda') or 'none'}, transformers {env.get('transformers', '?')}, "
        f"{env.get('date', '?')}, commit {env.get('commit') or '?'}"
        + (
            f" (NVIDIA's management library counts {nvml if nvml is not None else 'no'} "
            f"GPUs where torch sees {env.get('gpus')}: Ray is told torch's count)"
            if env.get("gpus") and nvml != env.get("gpus")
            else ""
        )
    )


def forward_lines(results: dict) -> list[str]:
    """Beside the bars, the forwards behind them at n = 1 and the largest n: transformers'
    (eager, graph-captured) and the engine's step each way graph_step.py times it."""
    lines = []
    reference = _data(results, "hf_reference")
    for n, row in ((reference or {}).get("sizes") or {}).items():
        if n in ("1", max((reference or {})["sizes"], key=int)):
            cells = ", ".join(f"{key.removesuffix('_ms')} {ms:.2f} ms" for key, ms in row.items())
            lines.append(f"transformers, n={n}: {cells}")
    columns = (_data(results, "graph_step") or {}).get("columns") or {}
    eager = (columns.get("eager") or {}).get("ms") or {}
    for n in [k for k in eager if k in ("1", max(eager, key=int))]:
        cells = [
            f"{way} {column['ms'][n]:.2f} ms ({column['ms'][n] / eager[n]:.2f}x)"
            for way, column in columns.items()
            if "ms" in column
        ]
        lines.append(f"engine step (graph_step.py), n={n}: " + ", ".join(cells))
    lines += kernel_lines((_data(results, "graph_step") or {}).get("kernels") or {})
    greedy = _data(results, "greedy") or {}
    if "around_step_us" in greedy:  # what a token costs besides its recorded run
        lines.append(
            f"embedded greedy, a decode step: {greedy['decode_step_us']:.0f} us, its step "
            f"replayed alone {greedy['step_replay_us']:.0f} us, around it "
            f"{greedy['around_step_us']:.0f} us"
        )
    plain = {k: us for k, us in greedy.items() if k.startswith("step_replay_us_plain_")}
    if plain:  # the layers' fused forms turned off in turn: what each saves
        lines.append(
            "embedded step replayed with one fused form off: "
            + ", ".join(
                f"{key.removeprefix('step_replay_us_').replace('_', ' ')} {us:.0f} us"
                for key, us in plain.items()
            )
            + f" (every form on: {greedy['step_replay_us']:.0f} us)"
        )
    if "prefill_parts_ms" in greedy:  # which way a long prompt's prefill is faster
        lines.append(
            f"embedded prefill of {greedy['prefill_tokens']} tokens: in parts of the step "
            f"{greedy['prefill_parts_ms']:.2f} ms, one eager call "
            f"{greedy['prefill_eager_ms']:.2f} ms (the engine took "
            f"{'parts' if greedy['prefill_in_parts'] else 'the eager call'})"
        )
    return lines


def kernel_lines(kernels: dict, most: int = 3) -> list[str]:
    """graph_step.py's kernels by name (``--kernels``): per size, the count and time a
    forward; then the kernels whose time grew most from the smallest size to the largest
    (what makes the verify curve rise; a name the smaller size does not list counts 0)."""
    sizes = sorted((n for n, found in kernels.items() if "top" in found), key=int)
    lines = [
        f"engine step kernels, n={n}: {kernels[n]['kernels']:g} a forward, "
        f"{kernels[n]['total_us']:.0f} us"
        for n in sizes
    ]
    if len(sizes) >= 2:
        small, large = (
            {row["name"]: row["us"] for row in kernels[n]["top"]} for n in (sizes[0], sizes[-1])
        )
        grew = sorted(large, key=lambda name: small.get(name, 0.0) - large[name])[:most]
        cells = [f"{name[:60]} {small.get(name, 0.0):.0f} -> {large[name]:.0f} us" for name in grew]
        lines.append(f"grew most from n={sizes[0]} to n={sizes[-1]}: " + "; ".join(cells))
    return lines


def table(results: dict) -> str:
    """The heading, one line per bar (bar | measured | verdict), then the forwards."""
    lines = rows(results)
    widths = [max(len(getattr(r, f)) for r in lines) for f in ("bar", "measured")]
    out = [heading(results)]
    for row in lines:
        out.append(f"{row.bar:<{widths[0]}}  {row.measured:<{widths[1]}}  {row.verdict}")
    out += forward_lines(results)
    met = sum(row.verdict == PASS for row in lines)
    out.append(f"{met} of {len(lines)} bars met")
    return "\n".join(out)
