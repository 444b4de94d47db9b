"""The configuration reference page, rendered from the schema in ``seq2seq.config``.

Every key of every section with its type, default, choices (and whatever other bounds its
``rule`` states), its rule on resume and on fine-tuning, and its description, which is the
``Attributes:`` entry of its section's docstring. The page is generated so that it cannot
drift from the schema: ``tests/test_reference.py`` fails when the committed page differs.

    python -m seq2seq.reference            # (re)write docs/reference/configuration.md
    python -m seq2seq.reference --check    # exit 1 if the committed page is stale

Run it from the repository root (``--out`` for another path).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from seq2seq import config

PAGE = Path("docs/reference/configuration.md")
COMMAND = "python -m seq2seq.reference"

# The sections in the page's order: (dotted prefix, dataclass). The entries of a corpus split
# (``data.train`` and its siblings) have their own table after ``data``.
SECTIONS: tuple[tuple[str, type], ...] = (
    ("", config.Config),
    ("data", config.DataConfig),
    ("data.train", config.SourceConfig),
    ("tokenizer", config.TokenizerConfig),
    ("model", config.ModelConfig),
    ("train", config.TrainConfig),
    ("decode", config.DecodeConfig),
    ("mesh", config.MeshConfig),
    ("distributed", config.DistributedConfig),
)
RULE_NAMES = ("FREE", "FIXED", "REMAPPED", "PARENT")


def _docstring(cls: type) -> str:
    return inspect.cleandoc(cls.__doc__ or "")


def descriptions(cls: type) -> dict[str, str]:
    """``{field: text}`` from the ``Attributes:`` block of ``cls``'s docstring (Google style:
    ``name: text`` at one indent, continuation lines deeper; ``a / b:`` and ``a, b:`` give
    one text to several fields). The text is joined into one line."""
    out: dict[str, str] = {}
    names: list[str] = []
    inside = False
    for line in _docstring(cls).splitlines():
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the next block (Raises:, ...)
            break
        entry = re.match(r"^  (\w+(?:(?: / |, )\w+)*): ?(.*)$", line)
        if entry:
            names = re.split(r" / |, ", entry.group(1))
            for name in names:
                out[name] = entry.group(2).strip()
        elif line.strip() and names:
            for name in names:
                out[name] = f"{out[name]} {line.strip()}".strip()
    return out


def summary(cls: type) -> str:
    """The docstring of ``cls`` before its ``Attributes:`` / ``Raises:`` blocks."""
    text = re.split(r"^(?:Attributes|Raises):$", _docstring(cls), flags=re.M)[0]
    return "\n\n".join(" ".join(p.split()) for p in text.strip().split("\n\n") if p.strip())


def rule_meanings() -> dict[str, str]:
    """``{"free": "...", ...}``: what each rule means, from the comment beside its constant
    in ``seq2seq/config.py`` (and the comment lines that continue it).

    Raises:
      RuntimeError: a rule constant has no comment there.
    """
    lines = inspect.getsource(config).splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        found = re.match(r'^(\w+) = "(\w+)"\s+# (.*)$', line)
        if not found or found.group(1) not in RULE_NAMES:
            continue
        text = [found.group(3)]
        for nxt in lines[i + 1 :]:
            if not nxt.startswith("# "):
                break
            text.append(nxt[2:])
        out[found.group(2)] = " ".join(text)
    missing = [getattr(config, n) for n in RULE_NAMES if getattr(config, n) not in out]
    if missing:
        raise RuntimeError(f"seq2seq/config.py: no comment beside the rule(s) {missing}")
    return out


def _code(text: str) -> str:
    """Docstring markup as Markdown: ````x```` → ```x```, table pipes escaped."""
    text = re.sub(r"``([^` ][^`]*?[^` ]|[^` ])``", r"`\1`", text)
    return text.replace("|", "\\|")


def _value(value: Any) -> str:
    """A value as YAML writes it, in a code span (``null``, ``true``, ``[attention]``)."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    text = text.removesuffix("...").strip()
    return f"`{text}`".replace("|", "\\|")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _type(f: dataclasses.Field, key: str) -> str:
    if key in ("data.train", "data.dev", "data.test"):
        return "corpus or list of corpora"
    return f"`{f.type}`".replace("|", "\\|") if isinstance(f.type, str) else f"`{f.type!r}`"


def _limits(key: str, f: dataclasses.Field) -> str:
    """Choices, and any other bound the field's rule or metadata states."""
    parts = []
    rule = f.metadata.get("rule")
    name = key.rsplit(".", 1)[-1]
    gpu = config.GPU_ONLY_CHOICES.get(name, ()) if key.startswith("model.") else ()
    if rule is not None:
        if rule.choices:
            parts.append(
                " · ".join(f"`{c}`" + (" (GPU only)" if c in gpu else "") for c in rule.choices)
            )
        for other, value in rule._asdict().items():
            if other not in ("resume", "finetune", "choices") and value not in (None, (), ""):
                parts.append(_bound(other, value))
    for other, value in f.metadata.items():
        if other != "rule" and value not in (None, (), ""):
            parts.append(_bound(other, value))
    return "; ".join(parts)


def _bound(name: str, value: Any) -> str:
    """Another statement of a rule: ``range: ≥ 1`` (a value's own ``text()`` where it has
    one, as a range has), else the value as YAML writes it."""
    if callable(getattr(value, "text", None)):
        return f"{name}: {_code(str(value.text()))}"
    if isinstance(value, (str, int, float, bool, list, tuple, dict)) and type(value) in (
        str,
        int,
        float,
        bool,
        list,
        tuple,
        dict,
    ):
        return f"{name}: {_value(value)}"
    return f"{name}: {_code(str(value))}"


def _table(prefix: str, cls: type, *, rules: bool = True) -> list[str]:
    """The rows of one section: every field of ``cls`` that is not itself a section.

    Raises:
      RuntimeError: a field has no description in its section's docstring.
    """
    texts = descriptions(cls)
    if rules:
        head = "| key | type | default | choices, range | resume | fine-tune | description |"
        rows = [head, "|---|---|---|---|---|---|---|"]
    else:
        rows = ["| key | type | default | description |", "|---|---|---|---|"]
    first: dict[str, str] = {}  # a text shared by several keys is written at the first
    for f in dataclasses.fields(cls):
        if config._section(f) is not None:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        if f.name not in texts:
            raise RuntimeError(
                f"{key} has no description: add it under Attributes: in the docstring of "
                f"seq2seq.config.{cls.__name__}"
            )
        text = texts[f.name]
        described = f"as `{first[text]}`" if text in first else _code(text)
        first.setdefault(text, key)
        default = _default(f)
        cells = [f"`{key}`", _type(f, key)]
        if key in ("data.train", "data.dev", "data.test"):
            cells.append(f"`path: {default['path']}`")
        else:
            cells.append("" if default is dataclasses.MISSING else _value(default))
        if rules:
            rule = f.metadata["rule"]
            cells += [_limits(key, f), rule.resume, rule.finetune]
        cells.append(described)
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def render() -> str:
    """The whole reference page (Markdown)."""
    out = [
        "# Configuration reference",
        "",
        f"Generated by `{COMMAND}` from the schema in `seq2seq/config.py` (each section's",
        "docstring and each field's `rule`); do not edit it by hand: `tests/test_reference.py`",
        "fails when it is stale. How to write a config, override keys, resume and fine-tune:",
        "[the configuration guide](../configuration.md).",
        "",
        "A key is set in the YAML file (`section: {key: value}`) or on the command line as",
        "`section.key=value`. A `0` or `null` default that its description calls a choice",
        "left to the recipe or the tokenizer is filled by `seq2seq/resolve.py` before any work.",
        "",
        "## Rules on resume and fine-tuning",
        "",
        "| rule | meaning |",
        "|---|---|",
    ]
    out += [f"| {name} | {_code(text)} |" for name, text in rule_meanings().items()]
    out += [
        "",
        "Resume: a rerun in a workdir with checkpoints. Fine-tune: a new run with",
        "`train.init_from`.",
    ]
    for prefix, cls in SECTIONS:
        if prefix == "data.train":
            title = "`data.train`, `data.dev`, `data.test`: one corpus"
            note = [
                "Each split (`<split>`: `train`, `dev` or `test`) is one corpus or a list of",
                "them, whose entry i is `data.<split>.<i>.<key>` on the command line. The split",
                "has its rule in `data`'s table; the keys of its entries follow it.",
                "",
            ]
            rows = _table("data.<split>", cls, rules=False)
        else:
            title = f"`{prefix}`" if prefix else "The run"
            note = []
            rows = _table(prefix, cls)
        out += ["", f"## {title}", "", _code(summary(cls)), "", *note, *rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PAGE, help=f"the page (default {PAGE})")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the page is stale"
    )
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
        if current != page:
            print(f"{args.out} is stale: regenerate it with `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
