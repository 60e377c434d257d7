"""List the option names (and types) an engine's pinned source accepts, as JSON.

Usage: python scripts/engine_options.py ENGINE SOURCE_DIR [--release NAME] [--commit SHA]
       [--out FILE]

ENGINE is vllm, sglang, trtllm or llamacpp. SOURCE_DIR is a source checkout, or a folder
holding just the needed files at their repository paths. The source is parsed (Python with
ast, C++ with a small scanner), never imported, so no engine has to be installed. The output
is what tests/data/engines/*.json hold: the exporters are checked against it.

Types are the annotation as ast.unparse prints it (Python engines) or the kind of value the
flag takes (llama.cpp: int, float, string, or flag when it takes none). Beside "options":
vllm has "literals" (the Literal aliases, e.g. SpeculativeMethod); trtllm has "aliases",
"bases", "decoding_types" and "missing"; llamacpp has "removed" (flags that now only error),
"server" (flags llama-server takes) and "speculative_types" (--spec-type names).
"""

import argparse
import ast
import json
import re
import subprocess
from pathlib import Path

REPOSITORIES = {
    "vllm": "https://github.com/vllm-project/vllm",
    "sglang": "https://github.com/sgl-project/sglang",
    "trtllm": "https://github.com/NVIDIA/TensorRT-LLM",
    "llamacpp": "https://github.com/ggml-org/llama.cpp",
}
VLLM_FILE = "vllm/config/speculative.py"
SGLANG_FILE = "python/sglang/srt/arg_groups/fields/spec.py"
TRTLLM_FILE = "tensorrt_llm/llmapi/llm_args.py"
LLAMACPP_FILES = ("common/arg.cpp", "common/speculative.cpp")
# The TensorRT-LLM configs the exporters use; every other DecodingBaseConfig subclass in the
# file is listed too, and any of these the file lacks is named under "missing".
TRTLLM_CLASSES = (
    "DecodingBaseConfig",
    "NGramDecodingConfig",
    "EagleDecodingConfig",
    "MedusaDecodingConfig",
)


def class_fields(cls: ast.ClassDef) -> dict[str, ast.AnnAssign]:
    """Annotated fields of a class body; private and ClassVar ones are not options."""
    return {
        node.target.id: node
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and not node.target.id.startswith("_")
        and not ast.unparse(node.annotation).startswith("ClassVar")
    }


def constant(node: ast.expr):
    """A literal's value, or the expression's source for names like argparse.X."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SystemExit(f"class {name} not found")


def literal_aliases(tree: ast.Module) -> dict[str, list]:
    """Module-level `X = Literal[...]` aliases, nested aliases expanded (vLLM's methods)."""
    raw = {
        node.targets[0].id: node.value.slice
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Subscript)
        and ast.unparse(node.value.value) == "Literal"
    }

    def expand(node: ast.expr) -> list:
        items = node.elts if isinstance(node, ast.Tuple) else [node]
        values = []
        for item in items:
            if isinstance(item, ast.Constant):
                values.append(item.value)
            elif isinstance(item, ast.Name) and item.id in raw:
                values.extend(expand(raw[item.id]))
        return values

    return {name: expand(node) for name, node in raw.items()}


def vllm(root: Path) -> dict:
    # SpeculativeConfig forbids unknown keys, so its fields are exactly the accepted
    # keys of the speculative_config dict.
    tree = ast.parse((root / VLLM_FILE).read_text(encoding="utf-8"))
    fields = class_fields(find_class(tree, "SpeculativeConfig"))
    return {
        "files": [VLLM_FILE],
        "options": {name: ast.unparse(field.annotation) for name, field in fields.items()},
        "literals": literal_aliases(tree),
    }


def sglang(root: Path) -> dict:
    # Mirrors add_cli_args_from_dataclass in sglang's arg_utils.py: a field
    # `name: A[T, "help" | Arg(...)]` becomes --name-with-dashes (or Arg's cli_name), plus
    # its aliases; no_cli fields get no flag.
    tree = ast.parse((root / SGLANG_FILE).read_text(encoding="utf-8"))
    options = {}
    for name, field in class_fields(find_class(tree, "Spec")).items():
        ann = field.annotation
        if not (isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple)):
            continue
        kind, *meta = ann.slice.elts
        calls = [m for m in meta if isinstance(m, ast.Call) and ast.unparse(m.func) == "Arg"]
        if not calls and not any(isinstance(m, ast.Constant) for m in meta):
            continue  # no help text and no Arg: sglang registers no flag for it
        arg = {kw.arg: constant(kw.value) for kw in calls[0].keywords} if calls else {}
        if arg.get("no_cli"):
            continue
        flags = [arg.get("cli_name") or "--" + name.replace("_", "-"), *arg.get("aliases", [])]
        if str(arg.get("action")).endswith("BooleanOptionalAction"):
            flags += ["--no-" + flag[2:] for flag in flags]  # argparse adds the negations
        options.update(dict.fromkeys(flags, ast.unparse(kind)))
    return {"files": [SGLANG_FILE], "options": options}


def trtllm(root: Path) -> dict:
    # Each speculative_config class lists every key it accepts, its own fields plus those
    # of its bases in this file (pydantic inherits them; StrictBaseModel forbids others).
    tree = ast.parse((root / TRTLLM_FILE).read_text(encoding="utf-8"))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def bases(name: str) -> list[str]:
        chain = [ast.unparse(b) for b in classes[name].bases if ast.unparse(b) in classes]
        return chain + [g for parent in chain for g in bases(parent)]

    wanted = [n for n in classes if n == TRTLLM_CLASSES[0] or TRTLLM_CLASSES[0] in bases(n)]
    options, decoding_types = {}, {}
    aliases: dict[str, dict[str, str]] = {}
    for name in wanted:
        fields = {}
        for cls in [*reversed(bases(name)), name]:  # subclasses override their bases
            fields.update(class_fields(classes[cls]))
        options[name] = {key: ast.unparse(field.annotation) for key, field in fields.items()}
        # Field(alias=... / validation_alias=AliasChoices(...)) names accepted as well.
        for key, field in fields.items():
            for kw in field.value.keywords if isinstance(field.value, ast.Call) else []:
                if kw.arg in ("alias", "validation_alias"):
                    for alias in ast.walk(kw.value):
                        if isinstance(alias, ast.Constant) and alias.value not in (key, None):
                            aliases.setdefault(name, {})[str(alias.value)] = key
        # `decoding_type: Literal["X"]` now; older releases used `ClassVar[str] = "X"`.
        for node in classes[name].body:
            if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "decoding_type":
                ann = node.annotation
                literal = isinstance(ann, ast.Subscript) and ast.unparse(ann.value) == "Literal"
                value = ann.slice if isinstance(ann, ast.Subscript) and literal else node.value
                decoding_types[name] = ast.literal_eval(value) if value else None
    return {
        "files": [TRTLLM_FILE],
        "options": options,
        "aliases": aliases,
        "bases": {name: bases(name) for name in wanted},
        "decoding_types": decoding_types,
        "missing": [name for name in TRTLLM_CLASSES if name not in options],
    }


# C++ string or char literal, and a {"--flag", ...} group followed by a comma.
LITERAL = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
FLAG_GROUP = re.compile(r"\s*\{([^{}]*)\}\s*,")


def strip_cpp_comments(text: str) -> str:
    """Blank out // and /* */ comments (keeping string literals) so commented-out options
    and braces inside comments do not count."""
    pattern = LITERAL.pattern + r"|//[^\n]*|/\*.*?\*/"
    return re.sub(pattern, lambda m: m[0] if m[0][0] in "\"'" else " ", text, flags=re.S)


def call_span(text: str, start: int) -> str:
    """Text from `start` (just after an opening parenthesis) to its matching `)`."""
    depth, i = 1, start
    while depth:
        if text[i] in "\"'":  # skip a string or char literal whole
            literal = LITERAL.match(text, i)
            i = literal.end() if literal else i + 1
            continue
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return text[start : i - 1]


def llamacpp(root: Path) -> dict:
    text = strip_cpp_comments((root / LLAMACPP_FILES[0]).read_text(encoding="utf-8"))
    named = dict(re.findall(r"llama_example>\s+(\w+)\s*=\s*\{([^}]*)\}", text))
    options: dict[str, str] = {}
    removed: dict[str, str] = {}
    server: list[str] = []
    for match in re.finditer(r"add_opt\(\s*common_arg\(", text):
        # The whole add_opt(...) call: common_arg(...) and its .set_examples(...) chain.
        statement = call_span(text, match.start() + len("add_opt("))
        # Leading {"-a", "--b"} groups are the flag names (a second group is the --no- form).
        body, names, pos = statement.split("(", 1)[1], list[str](), 0
        while group := FLAG_GROUP.match(body, pos):
            found = re.findall(r'"([^"]*)"', group[1])
            if not found or not all(name.startswith("-") for name in found):
                break  # preset-only names, not command-line flags
            names, pos = names + found, group.end()
        # The handler's parameters after common_params say what value the flag takes.
        handler = re.search(r"\[\]\s*\(\s*common_params\s*&[^,)]*,?([^)]*)\)", statement)
        values = re.findall(r"std::string|\bint\b|\bfloat\b", handler[1] if handler else "")
        kind = " ".join(v.removeprefix("std::") for v in values) or "flag"
        target = removed if "arg_removed(" in statement else options
        target.update(dict.fromkeys(names, kind))
        # Options without set_examples belong to LLAMA_EXAMPLE_COMMON, which the server
        # inherits; set_excludes can take the server out again. A list may be named.
        examples = re.search(r"\.set_examples\((?:\{([^}]*)\}|(\w+))\)", statement)
        listed = examples[1] or named[examples[2]] if examples else "LLAMA_EXAMPLE_COMMON"
        excludes = re.search(r"\.set_excludes\(\{([^}]*)\}\)", statement)
        if (
            target is options
            and re.search(r"LLAMA_EXAMPLE_(SERVER|COMMON)\b", listed)
            and not (excludes and "LLAMA_EXAMPLE_SERVER" in excludes[1])
        ):
            server += names
    speculative = (root / LLAMACPP_FILES[1]).read_text(encoding="utf-8")
    name_map = re.search(r"_type_from_name_map\s*=\s*\{(.*?)\};", speculative, re.S)
    if name_map is None:
        raise SystemExit("common_speculative_type_from_name_map not found")
    return {
        "files": list(LLAMACPP_FILES),
        "options": options,
        "removed": removed,
        "server": sorted(server),
        "speculative_types": re.findall(r'\{\s*"([^"]+)"\s*,', name_map[1]),
    }


def git(root: Path, *args: str) -> str | None:
    """Output of a git command in SOURCE_DIR, or None unless SOURCE_DIR is a checkout's top
    (a folder of copied files inside some other repository must not report that one)."""

    def run(*cmd: str) -> str | None:
        done = subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    top = run("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None
    return run(*args)


PARSERS = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm, "llamacpp": llamacpp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=sorted(PARSERS))
    parser.add_argument("source_dir", type=Path)
    parser.add_argument("--release", help="release name (default: git describe --tags)")
    parser.add_argument("--commit", help="source commit (default: git rev-parse HEAD)")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    args = parser.parse_args()

    found = PARSERS[args.engine](args.source_dir)
    files = found.pop("files")
    data = {
        "engine": args.engine,
        "release": args.release or git(args.source_dir, "describe", "--tags") or "unknown",
        "source": {
            "repository": REPOSITORIES[args.engine],
            "files": files,
            "commit": args.commit or git(args.source_dir, "rev-parse", "HEAD") or "unknown",
        },
        **found,
    }
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
