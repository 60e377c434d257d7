"""Time README command 1 (`autotune profile --model smollm2-135m`, every method, heads
trained as needed) and print the time of each phase, the heads' accuracy and each
method's held-back speedup with its interval.

    .venv/bin/python benchmarks/end_to_end.py              # the README command, as is
    .venv/bin/python benchmarks/end_to_end.py --budget 10m  # extra flags go to profile
    .venv/bin/python benchmarks/end_to_end.py --fresh       # empty cache: heads trained

A benchmark, not a test: the figure depends on the machine. Run it on a quiet one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASE = re.compile(r"^\[(\d+)/(\d+)\] (.+?) \(~")


def main(argv: list[str]) -> int:
    fresh = "--fresh" in argv
    extra = [a for a in argv if a != "--fresh"]
    autotune = Path(sys.executable).parent / "autotune"
    work = Path(tempfile.mkdtemp(prefix="autotune-e2e-"))
    env = dict(os.environ)
    if fresh:
        env["AUTOTUNE_CACHE"] = str(work / "cache")
    out = work / "profile.yaml"
    command = [str(autotune), "profile", "--model", "smollm2-135m", "--out", str(out), *extra]
    print("running:", " ".join(command[1:]), f"(in {work})", flush=True)
    started = time.monotonic()
    marks: list[tuple[str, float]] = [("start-up, loading, noise check", started)]
    process = subprocess.Popen(
        command, cwd=work, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stderr is not None and process.stdout is not None
    for line in process.stderr:  # echoed with the time since start, to see each step's cost
        sys.stderr.write(f"{_clock(time.monotonic() - started)} {line}")
        found = PHASE.match(line.strip())
        if found:
            marks.append((found.group(3), time.monotonic()))
    stdout = process.stdout.read()
    code = process.wait()
    ended = time.monotonic()
    print(stdout)
    print("time per phase (m:s):")
    for (name, at), (_, until) in zip(marks, marks[1:] + [("end", ended)]):
        print(f"  {name:<40} {_clock(until - at):>7}")
    print(f"  {'whole command':<40} {_clock(ended - started):>7}  (exit {code})")
    if code == 0:
        _figures(out, env)
    return code


def _figures(path: Path, env: dict) -> None:
    import json

    from autotune.profile.io import read_profile

    profile = read_profile(path)
    os.environ.update(env)  # the cache the command used
    from autotune.training.job import cached_heads_folder

    for kind in ("medusa", "eagle", "glide"):
        config = cached_heads_folder(profile.model.fingerprint, kind) / "config.json"
        if config.is_file():
            record = json.loads(config.read_text())["autotune"]
            top1 = [round(row["top1"], 3) for row in record["accuracy_held_back"]]
            print(
                f"{kind} heads: held-back top-1 {top1} after {record['training']['epochs']} "
                f"epochs on {record['tokens']['train']} answer tokens"
            )
    for name, block in profile.method_blocks().items():
        m = block.measured
        if m is None:
            continue
        low, high = m.speedup_interval or (m.speedup, m.speedup)
        print(
            f"{name:<10} {m.speedup:.3f}x [{low:.3f}, {high:.3f}] on {m.prompts} held-back "
            f"prompts, {m.tokens_per_step:.2f} tokens/step, lossless {m.lossless}"
        )
    print(f"recommended: {profile.recommended}")


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
