"""Exports of a GLIDE profile.

No serving engine of autotune's list runs a draft that reads the target's KV cache, so
each says why (``CANNOT``). GLIDE is deployed with its reference code
(NonvolatileMemory/GliDe_with_a_CaPE_ICML_24; ColossalAI's inference engine has a
variant): ``reference_config`` writes the settings, the draft's folder and the CAPE table
in the form that code takes (its ``--bin`` list, ``prob_to_top[floor(10 p)]``), with a
warning for every setting it cannot express. Write it with

    python -m autotune.methods.glide PROFILE [--out FILE]

``REFERENCE`` is its exporter record for ``autotune export``: it is offered once the
engine name ``glide-ref`` is in ``autotune.export.engines.ENGINES``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autotune.errors import AutotuneError
from autotune.export.base import Deployment, Exporter, Rendered, json_text, provenance
from autotune.export.engines import ENGINES
from autotune.files import write_atomic
from autotune.methods.glide.settings import GlideSettings

ENGINE = "glide-ref"
TITLE = "the GLIDE reference code"
VERSION = (
    "NonvolatileMemory/GliDe_with_a_CaPE_ICML_24 at edf4c9a: glide/glideModel.py "
    "smallLlamaForCausalLM.medusa_generate, its CAPE table passed as --bin "
    "(inference/cape/benchmark_cape.py)"
)
REFERENCE_DRAFT_TOKENS = 4  # medusa_forward stops at MaxLengthCriteria(4 + input length)
REFERENCE_ROPE_THETA = 10000.0  # its LlamaCrossAttention._init_rope passes no base
TABLE_SIZE = 12  # the reference's --bin list: prob_to_top[int(10 p)], p in [0, 1]


def cape_table(cape) -> tuple[list[int], list[str]]:
    """The reference's table (tokens per step by floor(10 p)) for a fitted CAPE block, and
    a warning when a bin edge falls inside a tenth (the table cannot follow it there)."""
    policy = cape.policy()
    table = [policy.tokens_at(min((i + 0.5) / 10, 1.0)) for i in range(11)]
    table += table[-1:] * (TABLE_SIZE - len(table))
    inside = [e for e in policy.edges[:-1] if abs(e * 10 - round(e * 10)) > 1e-6]
    warnings = []
    if inside:
        warnings.append(
            f"the reference bins confidence by tenths (floor(10 p)); the fitted edges "
            f"{inside} fall inside a tenth, where the table takes the tenth's midpoint"
        )
    return table, warnings


def _draft_record(head: str, base_dir: Path | None) -> dict | None:
    """Our layout's ``glide`` entry of the draft's config.json (None: the reference's
    layout, or a folder not on this machine)."""
    folder = Path(head).expanduser()
    if not folder.is_absolute() and base_dir is not None:
        folder = base_dir / folder
    try:
        record = json.loads((folder / "config.json").read_text()).get("glide")
    except (OSError, ValueError, AttributeError):
        return None
    return record if isinstance(record, dict) else None


def reference_config(
    block: GlideSettings, base_dir: Path | None = None
) -> tuple[dict, list[str], list[str]]:
    """(settings for the reference code, warnings, notes)."""
    warnings: list[str] = []
    notes: list[str] = []  # a CAPE table's, where there is one
    cape = block.cape if block.cape is not None and block.cape.enabled else None
    length = (cape.chain_depth if cape else None) or block.draft.max_tokens
    config: dict = {
        "method": "glide",
        "draft_model": block.head,
        "num_draft_tokens": length,
        "exit_threshold": block.draft.exit_threshold,
        "draft_vocab": block.draft_vocab,
        "cape": None,
    }
    if length != REFERENCE_DRAFT_TOKENS:
        warnings.append(
            f"the reference drafts {REFERENCE_DRAFT_TOKENS} tokens (MaxLengthCriteria("
            f"max_length=4 + input length) in medusa_forward); the tuned draft length is "
            f"{length}: change that 4"
        )
    if block.draft.exit_threshold > 0:
        warnings.append(
            f"the reference has no draft exit; drafting stops at a step whose confidence "
            f"is below {block.draft.exit_threshold} in autotune's drafter only"
        )
    if block.draft_vocab:
        warnings.append(
            f"the reference drafts over the whole vocabulary: the draft vocabulary of the "
            f"folder's {block.draft_vocab} most frequent tokens is not expressible (same "
            f"output, slower drafting)"
        )
    if cape is not None:
        config["cape"], cape_warnings, notes = _cape_reference(cape, length)
        warnings += cape_warnings
    warnings += _layout_warnings(_draft_record(block.head, base_dir))
    return config, warnings, notes


def _cape_reference(cape, length: int) -> tuple[dict, list[str], list[str]]:
    """(the ``cape`` entry, warnings, notes) for a fitted CAPE block and a chain of
    ``length`` tokens."""
    table, warnings = cape_table(cape)
    entry = {
        "bins": cape.bins,
        "expansion": cape.expansion,
        "max_verify_tokens": cape.max_verify_tokens,
        "bin": table,
    }
    widest = 1 + length * max(cape.expansion)
    if widest > cape.max_verify_tokens:
        warnings.append(
            f"the reference verifies every step's tokens (up to {widest} here); "
            f"autotune caps the tree at {cape.max_verify_tokens} tokens"
        )
    return entry, warnings, [f"run with expand_cape and --bin {' '.join(map(str, table))}"]


def _layout_warnings(record: dict | None) -> list[str]:
    if record is None or record.get("layout") != "autotune":
        return []
    out = [
        "the draft is in autotune's layout (it shares the target's embedding and lm_head "
        "and norms the cross-attention's input): the reference's smallLlamaForCausalLM "
        "loads only its own layout; autotune's drafter (autotune.drafters.glide) runs it"
    ]
    theta = (record.get("target") or {}).get("rope_theta")
    if theta is not None and float(theta) != REFERENCE_ROPE_THETA:
        out.append(
            f"the reference rotates cross-attention queries with RoPE base 10000 "
            f"(LlamaCrossAttention._init_rope); this model's rope_theta is {theta:g}: "
            f"pass base={theta:g} there"
        )
    return out


def render_reference(d: Deployment, base_dir: Path | None = None) -> Rendered:
    block: GlideSettings = d.settings
    config, warnings, notes = reference_config(block, base_dir)
    measured = provenance(d) if block.measured is not None else []
    meta = {
        "exported_for": TITLE,
        "engine_version": VERSION,
        "provenance": measured,
        "warnings": warnings,
        "notes": notes,
    }
    return Rendered(json_text({"_autotune": meta, **config}), warnings)


REFERENCE = Exporter(
    engine=ENGINE, engine_version=VERSION, filename="glide_reference.json", render=render_reference
)
EXPORTERS = {e.engine: e for e in (REFERENCE,) if e.engine in ENGINES}
CANNOT = {
    engine: reason
    for engine, reason in {
        "vllm": "its drafters read their own KV cache; none cross-attends to the target's",
        "sglang": "it has no draft model that reads the target's KV cache",
        "trtllm": "its draft models (draft-target, EAGLE, Medusa) never read the target's KV cache",
        "hf": "its assisted generation runs the assistant on its own cache, not the target's",
        "llamacpp": "its draft models keep their own context; none reads the target's cache",
        "dv": "it drafts only with the target's own layers skipped",
    }.items()
    if engine not in EXPORTERS
}


def write_reference(profile_path: str | Path, out: str | Path | None = None) -> list[str]:
    """Write the profile's GLIDE settings for the reference code to ``out`` (default:
    stdout); returns the warnings."""
    from autotune.profile.io import read_profile

    path = Path(profile_path).expanduser()
    profile = read_profile(path)
    if profile.block("glide") is None:
        raise AutotuneError(
            f"{path} has no glide method: profile it with `autotune profile --methods "
            "glide --heads glide=DIR`"
        )
    rendered = render_reference(Deployment.of(profile, "glide"), path.resolve().parent)
    if out is None:
        sys.stdout.write(rendered.text)
    else:
        write_atomic(Path(out).expanduser(), rendered.text)
    return rendered.warnings


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m autotune.methods.glide",
        description="Write a profile's GLIDE settings for the GLIDE reference code.",
    )
    parser.add_argument("profile")
    parser.add_argument("--out", help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    try:
        warnings = write_reference(args.profile, args.out)
    except (AutotuneError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
