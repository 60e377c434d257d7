"""autotune's own cache, broken or out of reach (issue 43): one table, each case a fault
made on disk and the call or command that meets it. A broken entry is one warning line,
moved aside to NAME.broken-TIME and rebuilt (exit 0); a cache place that cannot be used
or a full disk is one error line naming it and AUTOTUNE_CACHE (exit 2). Never a
traceback, never a half-written entry, and the next run works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import typer
from test_bad_inputs import disk_full as fill_disk
from typer.testing import CliRunner

from autotune import cache_entry
from autotune.cache_entry import CacheEntry
from autotune.cli import app
from autotune.cli.errors import user_errors
from autotune.engine import kernels
from autotune.heads.cache import heads_entry
from autotune.models import loading, tiny
from autotune.models.registry import fingerprint, resolve_model

TESTS = Path(__file__).resolve().parent


@dataclass
class World:
    """A case's folder (also the current one), its cache, a tiny model folder and a
    stand-in GGUF file whose conversion is the tiny model."""

    folder: Path
    monkeypatch: pytest.MonkeyPatch

    def __post_init__(self) -> None:
        self.cache, self.gguf, self.model_dir = (
            self.folder / name for name in ("cache", "tiny.gguf", "tiny-model")
        )

    def converted(self) -> CacheEntry:
        resolved = resolve_model(str(self.gguf))
        return loading.converted_entry(resolved, fingerprint(resolved))


# --- the calls a case makes, each under the CLI's own error handling ---------------------


def load_gguf(world: World) -> None:
    loading.load_target(str(world.gguf))


def tiny_target():
    return loading.target_from_model(tiny.tiny_llama(), tiny.tiny_tokenizer(), "tiny")


def answer(world: World) -> None:
    from autotune.engine.runner import Runner
    from autotune.training.calibration import answer_cache
    from autotune.training.distill import decode_to_cache

    target = tiny_target()
    prompts = [target.encode_chat(t) for t in ("Tell me a story.", "Name a color.")]
    decode_to_cache(Runner(target.model), prompts, 6, 2, answer_cache(target.fingerprint))


def answers_entry(world: World) -> CacheEntry:
    from autotune.training.calibration import answer_cache

    return answer_cache(tiny_target().fingerprint).entry


def measure_kernels(world: World) -> None:
    def timer(kernel: str, rows: int, run) -> float:
        return 0.0 if kernel == kernels.LINEAR else 1.0

    table = kernels.KernelTable(timer=timer, store=kernels._store_path())
    assert table.kernel(torch.randn(8, 16), 3) == kernels.LINEAR


def kernels_entry(world: World) -> CacheEntry:
    return CacheEntry(kernels._store_path(), "kernel table")


HEADS_FP = "0123456789abcdef"


def write_heads(world: World) -> None:
    from autotune.heads.medusa import MedusaHeads, save_medusa_heads

    with heads_entry(HEADS_FP, "medusa").writing() as staged:
        save_medusa_heads(MedusaHeads(16, 32, num_heads=2), staged, base_model="tiny")


def find_cached_heads(world: World) -> None:
    """What `profile` does for heads it was given none of: look in the heads cache."""
    from autotune.methods import registry
    from autotune.training.sources import find_heads

    found = find_heads("medusa", "tiny", HEADS_FP, registry.method("medusa").check_heads)
    if found is None:  # what profile then does: train them
        write_heads(world)


def load_cached_heads(world: World) -> None:
    from autotune.heads.medusa import load_medusa_heads

    load_medusa_heads(heads_entry(HEADS_FP, "medusa").path)


def ray_results(world: World) -> None:
    from autotune.studies.tune import _ray_results_dir

    assert Path(_ray_results_dir()).is_dir()


def build_engine(world: World) -> None:
    from autotune.engine import native

    assert native._load() is None  # the build is a stand-in, or has nowhere to go


def engine_build_dir_a_file(world: World) -> None:
    (world.folder / "ext").write_text("not a folder")
    world.monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(world.folder / "ext"))


def engine_build_cut_short(world: World) -> None:
    """A build killed while linking left a few bytes of the library; builds stand in."""
    from autotune.engine import native

    world.monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(world.cache / "ext"))
    native._folder().mkdir(parents=True)
    native._built_file().write_bytes(b"\x7fELF\x02")
    world.monkeypatch.setattr("torch.utils.cpp_extension.load", lambda **options: None)


def engine_build(world: World) -> CacheEntry:
    from autotune.engine import native

    return CacheEntry(native._built_file(), "build")


def heads_train_args(world: World) -> list:
    return ["heads", "train", "--kind", "medusa", "--model", world.model_dir]


# --- faults ------------------------------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garble(path: Path) -> None:
    """The same size, other bytes (what a disk or a stray write leaves)."""
    path.write_bytes(os.urandom(path.stat().st_size))


def garble_large(world: World) -> None:
    """Garbage in a model file too large to hash on every read (the limit lowered here):
    the safetensors header's own check finds it."""
    world.monkeypatch.setattr(cache_entry, "HASH_LIMIT", 0)
    garble(world.converted().path / "model.safetensors")


def unrecord(entry: CacheEntry) -> None:
    """As an entry written before records were kept."""
    entry.record_path.unlink()


def disk_full(world: World) -> None:
    """os.write writes half of what it is given, then the disk is full (the bad-input
    table's full disk)."""
    fill_disk(world.folder, world.monkeypatch)


def cache_is_a_file(world: World) -> None:
    world.cache.write_text("not a folder")


def cache_under_a_file(world: World) -> None:
    (world.folder / "file").write_text("not a folder")
    world.monkeypatch.setenv("AUTOTUNE_CACHE", str(world.folder / "file" / "cache"))


def cache_uncreatable(world: World) -> None:
    world.monkeypatch.setenv("AUTOTUNE_CACHE", "/proc/autotune-no-such/cache")


def cache_unwritable(world: World) -> None:
    world.cache.mkdir()
    world.cache.chmod(0o500)


def kill_mid_conversion(world: World) -> None:
    """A conversion killed (SIGKILL) while it writes the model, in a process of its own."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from autotune.models import loading
        from test_cache_faults import stand_in_gguf_loaders

        stand_in_gguf_loaders(loading)
        real = loading._drop_quantizer

        def then_die(model):
            real(model)
            model.save_pretrained = lambda folder: (
                open(os.path.join(folder, "model.safetensors"), "wb").write(b"half"),
                os.kill(os.getpid(), signal.SIGKILL),
            )

        loading._drop_quantizer = then_die
        loading.load_target({str(world.gguf)!r})
        """
    )
    env = {**os.environ, "AUTOTUNE_CACHE": str(world.cache), "PYTHONPATH": str(TESTS)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=world.folder, timeout=300)
    assert done.returncode == -signal.SIGKILL


# --- what must hold after ----------------------------------------------------------------


def whole(entry_of: Callable[[World], CacheEntry]) -> Callable[[World], None]:
    def check(world: World) -> None:
        entry = entry_of(world)
        assert entry.recorded() and entry.fault(thorough=True) is None

    return check


def moved_aside(entry_of: Callable[[World], CacheEntry]) -> Callable[[World], None]:
    def check(world: World) -> None:
        entry = entry_of(world)
        assert len(list(entry.path.parent.glob(entry.path.name + ".broken-*"))) == 1

    return check


def gone(entry_of: Callable[[World], CacheEntry]) -> Callable[[World], None]:
    def check(world: World) -> None:
        assert not entry_of(world).path.exists()

    return check


def fresh_ray_folder(world: World) -> None:
    assert (world.folder / "autotune-ray").is_file()  # the file in the way is left alone
    assert any(p.is_dir() and p.name.startswith("autotune-ray-") for p in world.folder.iterdir())


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[World], None] | Callable[[World], list]  # a call, or a command line
    fault: Callable[[World], None]  # made after ``prepare``, before the call
    words: tuple[str, ...]  # what the one line says; () for no line at all
    after: tuple[Callable[[World], None], ...] = ()  # what holds after the call
    prepare: Callable[[World], None] | None = None  # the cache as a run leaves it
    code: int = 0  # 0: recovered; 2: refused in one line
    cli: bool = False  # ``call`` gives a command line
    root_skips: bool = False  # chmod stops no one running as root


def converted(w: World) -> CacheEntry:
    return w.converted()


def cached_heads(w: World) -> CacheEntry:
    return heads_entry(HEADS_FP, "medusa")


def damage(entry_of, fault, name: str | None = None, legacy: bool = False):
    """A fault made to the file ``name`` of a folder entry (to a file entry itself); with
    ``legacy`` the entry lost its record first, as one written before records were kept."""

    def make(world: World) -> None:
        entry = entry_of(world)
        if legacy:
            unrecord(entry)
        fault(entry.path / name if name else entry.path)

    return make


def rebuilt(name: str, call, fault, words: tuple, entry_of, prepare=None) -> Case:
    """A case whose entry, written by ``prepare`` (by default ``call``), is broken by
    ``fault``: ``call`` says so in one line, moves it aside and writes it again."""
    whole_again = (whole(entry_of), moved_aside(entry_of))
    return Case(name, call, fault, (*BROKEN, *words), whole_again, prepare=prepare or call)


def refused(name: str, call, fault, words: tuple, entry_of=None, **more) -> Case:
    """A case that ends in one error line, exit 2, with no entry written."""
    return Case(name, call, fault, words, (gone(entry_of),) if entry_of else (), code=2, **more)


BROKEN = ("was broken", "moved aside to", ".broken-")
CACHE_LINE = ("autotune's cache", "AUTOTUNE_CACHE")
FULL = (
    "error: cannot write",
    "no space left on the device",
    "free space there or set AUTOTUNE_CACHE",
)
NOT_A_FOLDER = ("error: cannot create", "is a file, not a folder", *CACHE_LINE)
HEADS_FILE = "medusa_lm_head.safetensors"


CASES = [
    # converted model
    rebuilt(
        "converted model cut short",
        load_gguf,
        damage(converted, truncate, "model.safetensors"),
        ("the converted model tiny", "model.safetensors is", "bytes where"),
        converted,
    ),
    rebuilt(
        "converted model garbage-filled, too large to hash on every read",
        load_gguf,
        garble_large,
        ("model.safetensors's header",),
        converted,
    ),
    rebuilt(
        "converted model missing its config.json",
        load_gguf,
        damage(converted, Path.unlink, "config.json"),
        ("config.json is missing",),
        converted,
    ),
    rebuilt(
        "converted model from before records, cut short (issue 43's SafetensorError)",
        load_gguf,
        damage(converted, truncate, "model.safetensors", legacy=True),
        ("it did not load: SafetensorError",),
        converted,
    ),
    Case(
        "converted model from before records, whole: used and recorded",
        load_gguf,
        lambda w: unrecord(w.converted()),
        (),
        (whole(converted),),
        prepare=load_gguf,
    ),
    Case(
        "conversion killed mid-write: the next run converts",
        load_gguf,
        kill_mid_conversion,
        (),
        (whole(converted),),
    ),
    refused("conversion onto a full disk", load_gguf, disk_full, FULL, converted),
    refused("conversion: the cache root is a file", load_gguf, cache_is_a_file, NOT_A_FOLDER),
    # answers
    rebuilt(
        "answers cut short",
        answer,
        damage(answers_entry, truncate),
        ("the answers of model",),
        answers_entry,
    ),
    rebuilt(
        "answers garbage-filled",
        answer,
        damage(answers_entry, garble),
        ("not what was written",),
        answers_entry,
    ),
    rebuilt(
        "answers from before records, not JSON",
        answer,
        damage(answers_entry, lambda p: p.write_text("{not json"), legacy=True),
        ("unreadable", "decoding them again"),
        answers_entry,
    ),
    refused("answers onto a full disk", answer, disk_full, FULL, answers_entry),
    refused(
        "answers: the cache is under a file",
        answer,
        cache_under_a_file,
        ("error: cannot create", "a part of the path is a file", *CACHE_LINE),
    ),
    # kernel table
    rebuilt(
        "kernel table cut short",
        measure_kernels,
        damage(kernels_entry, truncate),
        ("kernel table",),
        kernels_entry,
    ),
    rebuilt(
        "kernel table garbage-filled",
        measure_kernels,
        damage(kernels_entry, garble),
        ("not what was written",),
        kernels_entry,
    ),
    refused("kernel table onto a full disk", measure_kernels, disk_full, FULL, kernels_entry),
    refused(
        "kernel table: the cache root is a file", measure_kernels, cache_is_a_file, NOT_A_FOLDER
    ),
    # heads
    rebuilt(
        "cached heads cut short: passed over, trained again",
        find_cached_heads,
        damage(cached_heads, truncate, HEADS_FILE),
        ("the cached medusa heads", "new ones are trained by this run if it trains heads"),
        cached_heads,
        write_heads,
    ),
    rebuilt(
        "cached heads garbage-filled: passed over, trained again",
        find_cached_heads,
        damage(cached_heads, garble, HEADS_FILE),
        ("not what was written",),
        cached_heads,
        write_heads,
    ),
    rebuilt(
        "cached heads missing config.json: passed over, trained again",
        find_cached_heads,
        damage(cached_heads, Path.unlink, "config.json"),
        ("config.json is missing",),
        cached_heads,
        write_heads,
    ),
    Case(
        "cached heads from before records, cut short: refused when loaded, moved aside",
        load_cached_heads,
        damage(cached_heads, truncate, HEADS_FILE, legacy=True),
        ("error: cannot read Medusa weights", "moved aside to medusa.broken-", "heads train"),
        (gone(cached_heads), moved_aside(cached_heads)),
        prepare=write_heads,
        code=2,
    ),
    refused("heads onto a full disk", write_heads, disk_full, FULL, cached_heads),
    refused(
        "heads train: the cache root is a file",
        heads_train_args,
        cache_is_a_file,
        NOT_A_FOLDER,
        cli=True,
    ),
    refused(
        "heads train: the cache cannot be created",
        heads_train_args,
        cache_uncreatable,
        ("error: cannot create", "/proc/autotune-no-such/cache", *CACHE_LINE),
        cli=True,
    ),
    refused(
        "heads train: the cache is not writable",
        heads_train_args,
        cache_unwritable,
        ("error: cannot write in", "permission denied", *CACHE_LINE),
        cli=True,
        root_skips=True,
    ),
    # the engine's C++ build (torch's extension folder)
    Case(
        "engine build: TORCH_EXTENSIONS_DIR is a file: torch's kernels, said once",
        build_engine,
        engine_build_dir_a_file,
        ("warning: cannot build the engine's C++ code", "TORCH_EXTENSIONS_DIR", "slower"),
    ),
    Case(
        "engine build cut short by a kill: moved aside, built again",
        build_engine,
        engine_build_cut_short,
        (*BROKEN, "the engine's C++ build", "is cut short", "building it again"),
        (moved_aside(engine_build),),
    ),
    # Ray results
    Case(
        "Ray results: a file where the default folder goes",
        ray_results,
        lambda w: (w.folder / "autotune-ray").write_text("in the way"),
        (),
        (fresh_ray_folder,),
    ),
    refused(
        "Ray results: AUTOTUNE_RAY_RESULTS is a file",
        ray_results,
        lambda w: (
            (w.folder / "results").write_text("in the way"),
            w.monkeypatch.setenv("AUTOTUNE_RAY_RESULTS", str(w.folder / "results")),
        ),
        ("error: cannot use", "Ray Tune's results", "AUTOTUNE_RAY_RESULTS"),
    ),
    Case(
        "Ray results: odd things left in the folder by an earlier run",
        ray_results,
        lambda w: (
            (w.folder / "autotune-ray" / "old-run").mkdir(parents=True),
            (w.folder / "autotune-ray" / "old-run" / "experiment_state.json").write_text("{"),
        ),
        (),
    ),
]


def stand_in_gguf_loaders(module) -> None:
    """``module``'s transformers loaders, where asked for a GGUF, give the tiny model and
    tokenizer (no GGUF file of a tiny model ships with the tests); otherwise the real ones."""

    def stand_in(real, tiny_one):
        def from_pretrained(*args, **kwargs):
            return tiny_one() if "gguf_file" in kwargs else real.from_pretrained(*args, **kwargs)

        return type("StandIn", (), {"from_pretrained": staticmethod(from_pretrained)})

    module.AutoModelForCausalLM = stand_in(REAL_MODEL, tiny.tiny_llama)
    module.AutoTokenizer = stand_in(REAL_TOKENIZER, tiny.tiny_tokenizer)


REAL_MODEL, REAL_TOKENIZER = loading.AutoModelForCausalLM, loading.AutoTokenizer


@pytest.fixture
def world(tmp_path, monkeypatch) -> World:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AUTOTUNE_RAY_RESULTS", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(loading, "AutoModelForCausalLM", REAL_MODEL)
    monkeypatch.setattr(loading, "AutoTokenizer", REAL_TOKENIZER)
    stand_in_gguf_loaders(loading)
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF" + bytes(4096))
    tiny.save_tiny_model(tmp_path / "tiny-model")
    return World(tmp_path, monkeypatch)


def invoke(case: Case, world: World):
    """The case's command line, or its call run as a command is (``user_errors``)."""
    if case.cli:
        return CliRunner().invoke(app, [str(a) for a in case.call(world)])
    one = typer.Typer()

    @one.command()
    @user_errors
    def run() -> None:
        case.call(world)

    return CliRunner().invoke(one, [])


def said(result) -> list[str]:  # the messages a user reads, progress bars aside
    return [line for line in result.stderr.splitlines() if line.startswith(("warning:", "error:"))]


def leftovers(folder: Path) -> list[Path]:
    """Staged copies a write left behind."""
    return list(folder.rglob(".*.tmp*")) if folder.is_dir() else []


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_cache_fault(case: Case, world: World):
    if case.root_skips and os.geteuid() == 0:
        pytest.skip("running as root: permissions stop no one (the file-in-the-way cases stand)")
    if case.prepare is not None:
        case.prepare(world)
    case.fault(world)
    result = invoke(case, world)
    world.monkeypatch.setattr(os, "write", REAL_WRITE)  # os.write back before any check
    assert result.exit_code == case.code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = said(result)
    assert len(lines) == (1 if case.words else 0), result.stderr
    for word in case.words:
        assert word in lines[0], (word, lines[0])
    for check in case.after:
        check(world)
    assert not leftovers(world.cache), leftovers(world.cache)  # nothing half-written
    if case.code == 2 and case.fault is disk_full:  # with space again, the next run works
        again = invoke(case, world)
        assert again.exit_code == 0 and not said(again), again.output


REAL_WRITE = os.write
