"""Every key an exporter writes is an option of the engine release it names: checked
against that release's option list (``tests/data/engines/<engine>.json``, made from the
release's own source by ``scripts/engine_options.py``; regenerate it from a checkout of
another release with that script, then point ``autotune.export.releases`` at it)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from autotune.export import export_profile, releases
from autotune.methods import registry

FIXTURES = Path(__file__).parent / "data" / "engines"
RELEASES = {
    "vllm": releases.VLLM,
    "sglang": releases.SGLANG,
    "trtllm": releases.TRTLLM,
    "llamacpp": releases.LLAMACPP,
}


def engine_options(engine: str) -> dict:
    return json.loads((FIXTURES / f"{engine}.json").read_text())


def profiles():
    """A profile of every method the four engines serve, in its shapes that export
    differently (chains, trees, dynamic trees, n-gram kinds)."""
    from test_export import branching_eagle, branching_medusa, eagle2_default, fixture
    from test_ngram_export import CHAIN, PAYING, SHRINKING, SUFFIX, TREE, ngram_profile, with_load

    yield "eagle", fixture("eagle")
    yield "eagle", with_load(fixture("eagle"), SHRINKING, "eagle")  # per-batch keys
    yield "medusa", with_load(fixture("medusa"), SHRINKING, "medusa")
    yield "eagle", branching_eagle()
    yield "eagle", eagle2_default()
    yield "medusa", fixture("medusa")
    yield "medusa", branching_medusa()
    yield "self_spec", fixture("self_spec")
    for config in (TREE, CHAIN, SUFFIX):
        yield "ngram", ngram_profile(config)
    yield "ngram", with_load(ngram_profile(CHAIN), SHRINKING)  # per-batch keys
    yield "ngram", with_load(ngram_profile(TREE), PAYING)


def exports(engine: str):
    for method, profile in profiles():
        if engine in registry.method(method).exporters:
            yield method, export_profile(profile, engine, method)


def flags_in(text: str) -> list[str]:
    body = " ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#"))
    return [word for word in shlex.split(body) if word.startswith("-")]


def speculative_config(text: str) -> dict:
    return yaml.safe_load(text)["speculative_config"]


@pytest.mark.parametrize("engine", sorted(RELEASES))
def test_the_fixture_is_the_release_the_exports_name(engine):
    fixture = engine_options(engine)
    release = fixture["release"]
    assert release in RELEASES[engine] or RELEASES[engine].startswith(release.split(" (")[0])
    assert fixture["source"]["commit"][:9] in RELEASES[engine]
    done = list(exports(engine))
    assert done
    for _, export in done:
        assert export.engine_version.startswith(RELEASES[engine])


def test_vllm_keys_are_speculative_config_fields():
    fixture = engine_options("vllm")
    methods = set(fixture["literals"]["SpeculativeMethod"])
    for method, export in exports("vllm"):
        config = speculative_config(export.text)
        assert set(config) <= set(fixture["options"]), (
            method,
            set(config) - set(fixture["options"]),
        )
        assert config["method"] in methods


def test_sglang_flags_are_server_arguments():
    fixture = engine_options("sglang")
    for method, export in exports("sglang"):
        flags = set(flags_in(export.text))
        assert flags and flags <= set(fixture["options"]), (method, flags - set(fixture["options"]))


def test_trtllm_keys_belong_to_their_decoding_config():
    fixture = engine_options("trtllm")
    by_type = {kind: name for name, kind in fixture["decoding_types"].items()}
    for method, export in exports("trtllm"):
        config = speculative_config(export.text)
        name = by_type[config["decoding_type"]]
        accepted = set(fixture["options"][name]) | set(fixture["aliases"].get(name, {}))
        assert set(config) <= accepted, (method, set(config) - accepted)


def test_llamacpp_flags_are_server_flags_the_release_kept():
    fixture = engine_options("llamacpp")
    server, removed = set(fixture["server"]), set(fixture["removed"])
    for method, export in exports("llamacpp"):
        flags = flags_in(export.text)
        assert set(flags) <= server - removed, (method, set(flags) - (server - removed))
        words = shlex.split(next(x for x in export.text.splitlines() if not x.startswith("#")))
        kind = words[words.index("--spec-type") + 1]
        assert kind in fixture["speculative_types"]
