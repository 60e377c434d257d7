"""llama.cpp: the speculative-decoding flags of ``llama-server`` / ``llama-speculative``,
in both dialects: older builds name them ``--draft-max``, ``--draft-min`` and
``--draft-p-min``; newer builds, which choose the drafter with ``--spec-type``, name them
``--spec-draft-n-max``, ``--spec-draft-n-min`` and ``--spec-draft-p-min``.

llama.cpp drafts with a separate draft model (``-md``); only the draft length and the
confidence exit of a self-speculative profile carry over, never its skip mask.
"""
from __future__ import annotations

from autotune.export.base import Exporter, Rendered, cape_warning, comment_lines
from autotune.profile.schema import Profile, SelfSpecMethod

TITLE = "llama.cpp"

# autotune always proposes the first draft token; a minimum of 1 keeps every draft
MIN_DRAFT = 1

LEGACY = ("--draft-max", "--draft-min", "--draft-p-min")
CURRENT = ("--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min")


def render(profile: Profile, method: str) -> Rendered:
    spec: SelfSpecMethod = profile.methods.self_spec
    warnings = [
        f"llama.cpp drafts with a separate draft model (-md) and cannot skip the target's own "
        f"sublayers: the skip mask (attention {spec.skip.attention}, mlp {spec.skip.mlp}) is "
        f"not expressible; supply a small draft GGUF with the same tokenizer, and only the "
        f"draft length and confidence exit below carry over (the measured "
        f"{spec.measured.speedup:.3f}x does not)"]
    adaptive = spec.draft.adaptive
    if adaptive is not None:
        warnings.append(
            f"llama.cpp keeps the draft confidence threshold fixed: Draft & Verify's adaptive "
            f"threshold (target acceptance {adaptive.target_acceptance}, step {adaptive.step}, "
            f"beta1 {adaptive.beta1}, beta2 {adaptive.beta2}) is not expressible")
    warnings += cape_warning(TITLE, spec.cape)
    values = (spec.draft.max_tokens, MIN_DRAFT, spec.draft.exit_threshold)
    lines = comment_lines(EXPORTER, profile, method, warnings)
    lines.append("# builds before the --spec-* names (llama-server, llama-speculative):")
    lines.append(flag_line(LEGACY, values))
    lines.append("# builds with --spec-type:")
    lines.append(flag_line(CURRENT, values))
    return Rendered("\n".join(lines) + "\n", warnings)


def flag_line(names: tuple[str, ...], values: tuple) -> str:
    return " ".join(f"{name} {value}" for name, value in zip(names, values))


def parse_flags(text: str) -> dict[str, dict[str, str]]:
    """The export's flag lines back as {dialect: {flag: value}}, for checking."""
    out = {}
    for line in text.splitlines():
        words = line.split()
        if not words or line.startswith("#"):
            continue
        dialect = "legacy" if words[0] == LEGACY[0] else "current"
        out[dialect] = dict(zip(words[::2], words[1::2]))
    return out


EXPORTER = Exporter(
    engine="llamacpp", title=TITLE,
    engine_version="llama.cpp llama-server flags: --draft-max/--draft-min/--draft-p-min "
                   "(builds from b4200) and --spec-draft-n-max/--spec-draft-n-min/"
                   "--spec-draft-p-min (newer builds with --spec-type)",
    filename="llamacpp_flags.txt",
    methods=("self_spec",),
    cannot={"medusa": "it has no Medusa heads",
            "eagle": "its EAGLE support (--spec-type draft-eagle3) takes EAGLE-3 drafts in "
                     "GGUF, not EAGLE-1/2 heads"},
    render=render)
