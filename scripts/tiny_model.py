"""Write a tiny randomly initialised LLaMA (and its tokenizer) as a model folder, with a
small prompts file and a small search space beside it: enough for `autotune profile` to
run end to end in a minute, with no weights on the machine.

    python scripts/tiny_model.py DIR
    autotune profile --model DIR/tiny-llama --prompts DIR/prompts.jsonl --methods self_spec \
        --search-space self_spec=DIR/self_spec.yaml --heldback-prompts 2 --max-new-tokens 8
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autotune.models.tiny import save_tiny_model

SEARCH_SPACE = """\
skip_mask: {trials: 3}
calibration: {prompts: 2, tokens: 12}
trials: {prompts: 2, tokens: 8}
draft_exit: {trials: 2}
"""


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    save_tiny_model(folder / "tiny-llama")
    words = ["cats", "rain", "maps", "tea", "ships", "glass", "bread", "stars"]
    (folder / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Tell me about {w}."}) + "\n" for w in words)
    )
    (folder / "self_spec.yaml").write_text(SEARCH_SPACE)
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
