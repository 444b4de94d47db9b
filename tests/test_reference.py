"""The configuration reference page is generated from the schema (``seq2seq/reference.py``): the
committed page is the generator's output, and it names every key of every section."""

import dataclasses

import pytest
from tiny_run import ROOT

from seq2seq import config, reference

PAGE = ROOT / reference.PAGE


def test_the_committed_page_is_the_generators_output():
    committed = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
    assert committed == reference.render(), (
        f"{reference.PAGE} is stale: regenerate it with `{reference.COMMAND}` "
        "(from the repository root) and commit it"
    )


def test_every_key_of_every_section_is_on_the_page():
    page = reference.render()
    for key in config.rules():  # every key of the schema, data.train and its siblings included
        assert f"| `{key}` |" in page, key
    for f in dataclasses.fields(config.SourceConfig):  # the keys of a corpus entry
        assert f"| `data.<split>.{f.name}` |" in page, f.name


def test_every_field_has_a_description():
    for _, cls in reference.SECTIONS:
        texts = reference.descriptions(cls)
        for f in dataclasses.fields(cls):
            if config._section(f) is None:
                assert texts.get(f.name), f"{cls.__name__}.{f.name} has no description"


def test_a_field_without_a_description_is_named():
    @dataclasses.dataclass(frozen=True)
    class Section:
        """A section.

        Attributes:
          alpha / beta: two keys, one text that goes
            on over two lines.
        """

        alpha: int = config.rule(1, resume=config.FREE)
        beta: int = config.rule(2, resume=config.FIXED, choices=("2", "3"))
        gamma: int = config.rule(3, resume=config.FREE)

    assert reference.descriptions(Section) == {
        "alpha": "two keys, one text that goes on over two lines.",
        "beta": "two keys, one text that goes on over two lines.",
    }
    with pytest.raises(RuntimeError, match="s.gamma has no description.*Section"):
        reference._table("s", Section)


def test_every_rule_has_its_meaning():
    meanings = reference.rule_meanings()
    assert set(meanings) == set(config.RESUME_RULES) | set(config.FINETUNE_RULES)
    assert all(meanings.values())


def test_check_fails_on_a_stale_page(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    assert reference.main(["--out", str(out), "--check"]) == 1
    assert reference.COMMAND in capsys.readouterr().err
    assert reference.main(["--out", str(out)]) == 0
    assert reference.main(["--out", str(out), "--check"]) == 0
