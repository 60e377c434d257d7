"""What the methods that draft with trained heads (Medusa, EAGLE) share: which prompts may
measure the heads, a short id for the heads in study names and cache keys, and a
candidate tree's predicted figures."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from autotune.errors import AutotuneError
from autotune.measure.costs import LatencyCurve
from autotune.measure.head_accuracy import HeadAccuracy
from autotune.progress import say
from autotune.training.job import trained_on
from autotune.tuners.medusa_tree import SizeChoice
from autotune.workspace import Workspace

WEIGHT_FILES = ("medusa_lm_head.*", "model.safetensors", "pytorch_model.bin")


def heads_id(heads_dir: str) -> str:
    """The heads' folder and their weights' sizes and mtimes, hashed."""
    folder = Path(heads_dir).resolve()
    files = sorted(p for pattern in WEIGHT_FILES for p in folder.glob(pattern))
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(repr((str(folder), stats)).encode()).hexdigest()[:8]


def unseen_search_prompts(ws: Workspace, heads_dir: str, announce: bool = False):
    """The search split less the prompts whose answers trained the heads: heads are
    measured on answers they were not trained on."""
    seen = trained_on(heads_dir, ws.prompts_path)
    unseen = [p for p in ws.search_prompts() if p.id not in seen]
    if len(unseen) < 4:
        raise AutotuneError(
            f"the heads in {heads_dir} were trained on nearly all the search "
            "prompts; pass other --prompts, or heads trained by `autotune "
            "heads train` (which leaves a third of them out)"
        )
    if seen and announce:
        say(f"measuring the heads on {len(unseen)} search prompts they were not trained on")
    return unseen


def confirm_and_calibration(search: list, confirm_prompts: int) -> tuple[list, list]:
    """Prompts for wall-clock trials, spread over the categories, and the rest, for
    calibration: trials never time a prompt the accuracy was measured on."""
    confirm = search[1 :: max(1, len(search) // max(confirm_prompts, 1))][:confirm_prompts]
    rest = [p for p in search if p not in confirm] or search
    return confirm, rest


def cached_accuracy(
    ws: Workspace,
    kind: str,
    heads_dir: str,
    calibration,
    detail: str,
    measure: Callable[[], HeadAccuracy],
) -> HeadAccuracy:
    """Heads' accuracy along ``calibration``, measured once per heads, calibration and
    ``detail`` (it does not depend on the device) and kept in the study database."""
    calibration_id = hashlib.sha256(repr(calibration).encode()).hexdigest()[:12]
    data = ws.cached_measurement(
        kind,
        f"{heads_id(heads_dir)}/{calibration_id}/{detail}",
        lambda: measure().as_dict(),
        device_bound=False,
    )
    return HeadAccuracy.from_dict(data)


def predicted_figures(size: SizeChoice, curve: LatencyCurve) -> dict[str, float]:
    """A candidate tree's predicted tokens per step and speedup over plain decoding (one
    target forward a token), for its row among the candidates."""
    return {
        "predicted_tokens_per_step": round(size.expected_tokens_per_step, 4),
        "predicted_speedup": round(size.tokens_per_second * curve(1), 4),
    }
