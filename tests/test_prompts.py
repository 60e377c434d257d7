import json
from collections import Counter
from pathlib import Path

import pytest

from autotune.errors import PromptsFileError
from autotune.prompts import Prompt, default_prompts_path, load_prompts, split_prompts


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_both_line_formats_and_blank_lines(tmp_path):
    path = write(
        tmp_path,
        json.dumps({"question_id": 81, "category": "writing", "turns": ["First turn", "Second"]}),
        "",
        json.dumps({"prompt": "Plain prompt"}),
        "   ",
        json.dumps({"prompt": "With id", "id": "abc", "category": "math"}),
    )
    assert load_prompts(path) == [
        Prompt("81", "First turn", "writing", followups=("Second",)),
        Prompt("3", "Plain prompt", None),
        Prompt("abc", "With id", "math"),
    ]


def test_default_prompts_file_loads():
    prompts = load_prompts(default_prompts_path())
    assert len(prompts) == 80
    assert len({p.category for p in prompts}) == 8
    assert prompts[0].id == "81" and prompts[0].text.startswith("Compose an engaging travel blog")


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"prompt": "ok"}', "{not json"], "line 2: not valid JSON"),
        (['{"question": "x"}'], "line 1: no 'prompt' or 'turns' field"),
        (['{"turns": []}'], "line 1: 'turns' must be a non-empty list"),
        (['{"prompt": "  "}'], "line 1: the prompt text is empty"),
        (['{"prompt": 3}'], "line 1: the prompt text is empty or not a string"),
        (['["a list"]'], "line 1: a JSON object is needed"),
        (['{"prompt": "a", "id": 1}', '{"prompt": "b", "id": 1}'], "line 2: duplicate id '1'"),
        (["", "  "], "has no prompts"),
    ],
)
def test_malformed_files(tmp_path, lines, expected):
    path = write(tmp_path, *lines)
    with pytest.raises(PromptsFileError) as err:
        load_prompts(path)
    message = str(err.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(PromptsFileError, match="has no prompts"):
        load_prompts(empty)
    with pytest.raises(PromptsFileError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")


def categorised(n_per: dict[str, int]) -> list[Prompt]:
    return [Prompt(f"{c}{i}", f"text {c} {i}", c) for c, n in n_per.items() for i in range(n)]


def test_split_is_deterministic_disjoint_and_complete():
    prompts = load_prompts(default_prompts_path())
    search, held = split_prompts(prompts, 0.25, seed=0)
    assert split_prompts(prompts, 0.25, seed=0) == (search, held)
    assert split_prompts(prompts, 0.25, seed=1) != (search, held)
    assert not {p.id for p in search} & {p.id for p in held}
    assert len(search) + len(held) == len(prompts) and len(held) == 20
    # each part keeps the file's order
    order = {p.id: i for i, p in enumerate(prompts)}
    assert [order[p.id] for p in held] == sorted(order[p.id] for p in held)


def test_split_is_stratified_by_category():
    prompts = load_prompts(default_prompts_path())  # 8 categories x 10 prompts
    _, held = split_prompts(prompts, 0.2)
    assert Counter(p.category for p in held) == dict.fromkeys({p.category for p in prompts}, 2)

    _, held = split_prompts(categorised({"a": 8, "b": 4}), 0.25)
    assert Counter(p.category for p in held) == {"a": 2, "b": 1}


def test_split_small_and_uncategorised():
    two = [Prompt("1", "x"), Prompt("2", "y")]
    search, held = split_prompts(two, 0.1)
    assert len(search) == 1 and len(held) == 1
    search, held = split_prompts(two, 0.9)
    assert len(search) == 1 and len(held) == 1
    assert split_prompts(two[:1]) == (two[:1], [])
    search, held = split_prompts([Prompt(str(i), "t") for i in range(8)], 0.5)
    assert len(held) == 4 and len(search) == 4
