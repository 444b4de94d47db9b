"""Tests for seq2seq.data.sources: every format, every validation case, the shipped corpus."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import datasets
import pytest
from datasets import Dataset, DatasetDict, Features, Translation, Value

from seq2seq.config import SourceConfig
from seq2seq.data import sources
from seq2seq.data.sources import DataError, load_parallel, overlap_report

TATOEBA = Path(__file__).resolve().parents[1] / "data" / "tatoeba-en-es"

EN = ["Hello.", "How are you?", "I am fine, thanks.", 'He said "no".']
ES = ["Hola.", "¿Cómo estás?", "Estoy bien, gracias.", 'Dijo "no".']


@pytest.fixture(autouse=True, scope="module")
def _private_hf_cache(tmp_path_factory):
    """Keep the many little test corpora out of the user's HF_DATASETS_CACHE."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        yield


def write(path: Path, content: str | bytes, *, gz: bool = False) -> Path:
    data = content.encode("utf-8") if isinstance(content, str) else content
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def text_corpus(tmp_path: Path, en: str | bytes, es: str | bytes, *, gz: bool = False) -> str:
    prefix = tmp_path / "corpus"
    write(tmp_path / "corpus.en", en, gz=gz)
    write(tmp_path / "corpus.es", es, gz=gz)
    return str(prefix)


def lines(items: list[str]) -> str:
    return "".join(item + "\n" for item in items)


def pairs(ds: Dataset) -> list[tuple[str, str]]:
    return list(zip(ds["source"], ds["target"]))


# --- text ---------------------------------------------------------------------------------


def test_text_both_directions_from_the_same_files(tmp_path):
    prefix = text_corpus(tmp_path, lines(EN), lines(ES))
    en_es = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    es_en = load_parallel(SourceConfig(format="text", path=prefix), "es", "en")
    assert en_es.column_names == ["source", "target"]
    assert pairs(en_es) == list(zip(EN, ES))
    assert pairs(es_en) == list(zip(ES, EN))


@pytest.mark.parametrize("gz_side", ["en", "es", "both"])
def test_text_reads_gzip_or_plain_whichever_exists(tmp_path, gz_side):
    write(tmp_path / "c.en", lines(EN), gz=gz_side in ("en", "both"))
    write(tmp_path / "c.es", lines(ES), gz=gz_side in ("es", "both"))
    ds = load_parallel(SourceConfig(format="text", path=str(tmp_path / "c")), "en", "es")
    assert pairs(ds) == list(zip(EN, ES))


def test_text_last_line_without_newline(tmp_path):
    prefix = text_corpus(tmp_path, lines(EN).rstrip("\n"), lines(ES))
    ds = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    assert pairs(ds) == list(zip(EN, ES))


def test_text_line_counts_differ(tmp_path):
    prefix = text_corpus(tmp_path, lines(EN), lines(ES[:3]))
    with pytest.raises(DataError) as e:
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es", split_name="dev")
    msg = str(e.value)
    assert "corpus.en has 4 lines" in msg and "corpus.es has 3" in msg and "dev" in msg


@pytest.mark.parametrize("gz", [False, True])
def test_text_invalid_utf8_names_file_and_line(tmp_path, gz):
    prefix = text_corpus(tmp_path, lines(EN), b"Hola.\n\xc2\xbfC\xf3mo?\nbien\nno\n", gz=gz)
    with pytest.raises(DataError, match=r"corpus\.es(\.gz)?:2: invalid UTF-8 \(byte 0xf3"):
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es")


@pytest.mark.parametrize("gz", [False, True])
def test_text_bom_is_stripped(tmp_path, gz):
    prefix = text_corpus(tmp_path, "\ufeff" + lines(EN), "\ufeff" + lines(ES), gz=gz)
    ds = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    assert ds[0] == {"source": "Hello.", "target": "Hola."}
    assert pairs(ds) == list(zip(EN, ES))


@pytest.mark.parametrize("gz", [False, True])
def test_text_crlf_leaves_no_carriage_return(tmp_path, gz):
    prefix = text_corpus(
        tmp_path, lines(EN).replace("\n", "\r\n"), lines(ES).replace("\n", "\r\n"), gz=gz
    )
    ds = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    assert pairs(ds) == list(zip(EN, ES))
    assert not any("\r" in s for s in list(ds["source"]) + list(ds["target"]))


@pytest.mark.parametrize("gz", [False, True])
def test_text_lone_carriage_return_is_an_error(tmp_path, gz):
    # datasets' text loader would split "wor\rld" into two rows and shift every later pair
    prefix = text_corpus(tmp_path, "a\nb\nwor\rld\nd\n", "1\n2\n3\n4\n", gz=gz)
    with pytest.raises(DataError, match=r"corpus\.en(\.gz)?:3: carriage return"):
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es")


def test_text_unicode_separators_inside_lines_keep_alignment(tmp_path):
    seps = ["\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85"]
    en = [f"en{i} left{sep}right" for i, sep in enumerate(seps)] + ["en last"]
    es = [f"es{i}" for i in range(len(seps))] + ["es last"]
    prefix = text_corpus(tmp_path, lines(en), lines(es))
    ds = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    assert len(ds) == len(seps) + 1
    assert pairs(ds) == list(zip(en, es))  # separators kept inside, nothing shifted


def test_text_empty_pairs_are_skipped_counted_and_logged(tmp_path, caplog):
    en = ["one", "", "three", "four", "  ", "six"]
    es = ["uno", "dos", "", "cuatro", "cinco", "seis"]
    prefix = text_corpus(tmp_path, lines(en), lines(es))
    with caplog.at_level(logging.WARNING, logger="seq2seq.data.sources"):
        ds = load_parallel(SourceConfig(format="text", path=prefix), "en", "es", split_name="dev")
    assert pairs(ds) == [("one", "uno"), ("four", "cuatro"), ("six", "seis")]
    [record] = [r for r in caplog.records if "skipped" in r.getMessage()]
    where = f"{prefix}.{{en,es}}"
    assert record.getMessage() == (
        f"dev: skipped 3 of 6 pairs with an empty source or target "
        f"({where}): {prefix}.en:2, {prefix}.es:3, {prefix}.en:5"
    )


@pytest.mark.parametrize("rows", [1, 4, 1 << 20])
def test_text_checks_in_chunks_name_the_same_lines(tmp_path, monkeypatch, rows):
    """``_clean`` checks CLEAN_ROWS rows at a time: the pairs kept, the skipped places and the
    line of an error are the same whatever the chunk size."""
    monkeypatch.setattr(sources, "CLEAN_ROWS", rows)
    en = ["one", "", "three", "four", "  ", "six", "seven"]
    es = ["uno", "dos", "", "cuatro", "cinco", "seis", " siete"]
    prefix = text_corpus(tmp_path, lines(en), lines(es))
    skipped = []
    ds = load_parallel(SourceConfig(format="text", path=prefix), "en", "es", skipped=skipped)
    assert pairs(ds) == [("one", "uno"), ("four", "cuatro"), ("six", "seis"), ("seven", "siete")]
    assert skipped == [f"{prefix}.en:2", f"{prefix}.es:3", f"{prefix}.en:5"]
    with pytest.raises(DataError, match=r"corpus\.en:2: empty source sentence"):
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es", skip_empty=False)


def test_skipped_pairs_are_named_first_few_in_the_warning_all_in_the_list(tmp_path, caplog):
    en = [f"s{i}" if i % 2 else "" for i in range(20)]  # 10 empty sources: lines 1, 3, ..., 19
    prefix = text_corpus(tmp_path, lines(en), lines([f"t{i}" for i in range(20)]))
    skipped = []
    with caplog.at_level(logging.WARNING, logger="seq2seq.data.sources"):
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es", skipped=skipped)
    assert skipped == [f"{prefix}.en:{line}" for line in range(1, 20, 2)]
    [message] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert message.endswith(f": {', '.join(skipped[: sources.SKIPPED_NAMED])} and 5 more")
    tsv = write(tmp_path / "c.tsv", "en\tes\na\tb\n\tc\n")
    skipped = []
    load_parallel(SourceConfig(format="tsv", path=str(tsv)), "en", "es", skipped=skipped)
    assert skipped == [f"{tsv}:3 (source column)"]


def test_text_whitespace_is_stripped(tmp_path):
    prefix = text_corpus(tmp_path, " Hello. \n\tBye.\u00a0\n", "Hola.  \n Adiós.\n")
    ds = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    assert pairs(ds) == [("Hello.", "Hola."), ("Bye.", "Adiós.")]


def test_text_empty_side_is_an_error_without_skip_empty(tmp_path):
    prefix = text_corpus(tmp_path, lines(EN), lines(["Hola.", "¿Qué?", " ", "No."]))
    with pytest.raises(DataError, match=r"corpus\.es:3: empty target sentence"):
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es", skip_empty=False)
    # the same line is the *source* when the direction is swapped
    with pytest.raises(DataError, match=r"corpus\.es:3: empty source sentence"):
        load_parallel(SourceConfig(format="text", path=prefix), "es", "en", skip_empty=False)


def test_text_missing_file(tmp_path):
    write(tmp_path / "c.en", lines(EN))
    with pytest.raises(DataError, match=r"file not found: .*c\.es \(nor c\.es\.gz\)"):
        load_parallel(SourceConfig(format="text", path=str(tmp_path / "c")), "en", "es")
    write(tmp_path / "c.fr.gz", lines(EN))  # a language the corpus has not: name the ones it has
    with pytest.raises(
        DataError,
        match=r"dev: file not found: .*c\.de \(nor c\.de\.gz\) for "
        r"language 'de'; languages found for .*c: en, fr$",
    ):
        load_parallel(
            SourceConfig(format="text", path=str(tmp_path / "c")), "en", "de", split_name="dev"
        )


def test_text_empty_files_and_all_empty_pairs(tmp_path):
    prefix = text_corpus(tmp_path, "", "")
    with pytest.raises(DataError, match="are empty"):
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    prefix = text_corpus(tmp_path, "\n \n", "x\n\n")
    with pytest.raises(DataError, match="no pairs left"):
        load_parallel(SourceConfig(format="text", path=prefix), "en", "es")


def test_second_load_is_served_from_the_cache(tmp_path):
    prefix = text_corpus(tmp_path, lines(EN), lines(ES))
    first = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    again = load_parallel(SourceConfig(format="text", path=prefix), "en", "es")
    assert pairs(again) == pairs(first)
    assert again.cache_files and again.cache_files == first.cache_files


# --- tsv / csv ------------------------------------------------------------------------------


def test_tsv_named_columns_both_directions(tmp_path):
    rows = ["id\tes\ten"] + [f"{i}\t{s}\t{e}" for i, (e, s) in enumerate(zip(EN, ES))]
    rows.append("9\tNA\tNone")  # must stay strings, not become missing values
    path = write(tmp_path / "c.tsv", lines(rows))
    en_es = load_parallel(SourceConfig(format="tsv", path=str(path)), "en", "es")
    assert pairs(en_es) == list(zip(EN, ES)) + [("None", "NA")]
    es_en = load_parallel(SourceConfig(format="tsv", path=str(path)), "es", "en")
    assert pairs(es_en)[3] == ('Dijo "no".', 'He said "no".')  # quotes are plain characters


def test_tsv_numbered_columns_without_header(tmp_path):
    rows = [f"{e}\t{s}\tattribution {i}" for i, (e, s) in enumerate(zip(EN, ES))]
    path = write(tmp_path / "c.tsv", lines(rows))
    ds = load_parallel(SourceConfig(format="tsv", path=str(path)), "en", "es")
    assert pairs(ds) == list(zip(EN, ES))  # default: columns 0 and 1
    swapped = load_parallel(
        SourceConfig(format="tsv", path=str(path), src_column="1", tgt_column="0"), "es", "en"
    )
    assert pairs(swapped) == list(zip(ES, EN))


def test_tsv_explicit_column_names(tmp_path):
    path = write(
        tmp_path / "c.tsv", lines(["english\tspanish"] + [f"{e}\t{s}" for e, s in zip(EN, ES)])
    )
    ds = load_parallel(
        SourceConfig(format="tsv", path=str(path), src_column="english", tgt_column="spanish"),
        "en",
        "es",
    )
    assert pairs(ds) == list(zip(EN, ES))


def test_tsv_wrong_number_of_fields_names_the_line(tmp_path):
    path = write(tmp_path / "c.tsv", "en\tes\nHello.\tHola.\nBye.\tAdiós.\textra\nYes.\tSí.\n")
    with pytest.raises(DataError, match=r"c\.tsv:3: expected 2 tab-separated fields .* got 3"):
        load_parallel(SourceConfig(format="tsv", path=str(path)), "en", "es")
    path = write(tmp_path / "d.tsv", "Hello.\tHola.\nBye.\nYes.\tSí.\n")
    with pytest.raises(DataError, match=r"d\.tsv:2: expected 2 .* got 1"):
        load_parallel(SourceConfig(format="tsv", path=str(path)), "en", "es")


def test_tsv_missing_language_column(tmp_path):
    path = write(tmp_path / "c.tsv", "en\tfr\nHello.\tBonjour.\n")
    with pytest.raises(DataError, match=r"c\.tsv: no column 'es' for the target .*en, fr"):
        load_parallel(SourceConfig(format="tsv", path=str(path), src_column="en"), "en", "es")
    with pytest.raises(DataError, match=r"no column 5 for the source"):
        load_parallel(
            SourceConfig(format="tsv", path=str(path), src_column="5", tgt_column="1"), "en", "es"
        )


def test_tsv_crlf_bom_gzip_and_empty_rows(tmp_path, caplog):
    content = "\ufeffen\tes\r\nHello.\tHola.\r\n\t\r\nBye.\tAdiós.\r\n"
    write(tmp_path / "c.tsv", content, gz=True)
    with caplog.at_level(logging.WARNING, logger="seq2seq.data.sources"):
        ds = load_parallel(
            SourceConfig(format="tsv", path=str(tmp_path / "c.tsv")), "en", "es", split_name="test"
        )
    assert pairs(ds) == [("Hello.", "Hola."), ("Bye.", "Adiós.")]
    assert any("test: skipped 1 of 3" in r.getMessage() for r in caplog.records)
    with pytest.raises(DataError, match=r"c\.tsv\.gz:3 \(source column\): empty source"):
        load_parallel(
            SourceConfig(format="tsv", path=str(tmp_path / "c.tsv")), "en", "es", skip_empty=False
        )


def test_csv_quoted_fields(tmp_path):
    content = (
        'en,es\n"Hello, world.","Hola, mundo."\n"He said ""no"".","Dijo ""no""."\n'
        '"two\nlines","dos líneas"\nYes.,Sí.\n'
    )
    path = write(tmp_path / "c.csv", content)
    ds = load_parallel(SourceConfig(format="csv", path=str(path)), "en", "es")
    assert pairs(ds) == [
        ("Hello, world.", "Hola, mundo."),
        ('He said "no".', 'Dijo "no".'),
        ("two\nlines", "dos líneas"),
        ("Yes.", "Sí."),
    ]


def test_csv_wrong_number_of_fields_counts_lines_of_multiline_records(tmp_path):
    path = write(tmp_path / "c.csv", 'en,es\n"a\nb",c\nd,e,f\n')
    with pytest.raises(DataError, match=r"c\.csv:4: expected 2 comma-separated fields"):
        load_parallel(SourceConfig(format="csv", path=str(path)), "en", "es")


def test_tsv_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"file not found: .*nothere\.tsv"):
        load_parallel(SourceConfig(format="tsv", path=str(tmp_path / "nothere.tsv")), "en", "es")


# --- jsonl ----------------------------------------------------------------------------------


def test_jsonl_translation_convention_and_flat(tmp_path):
    import json

    nested = [
        json.dumps({"translation": {"es": s, "en": e}}, ensure_ascii=False) for e, s in zip(EN, ES)
    ]
    path = write(tmp_path / "n.jsonl", "\n".join(nested[:2]) + "\n\n" + "\n".join(nested[2:]))
    assert pairs(load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")) == list(
        zip(EN, ES)
    )
    flat = [json.dumps({"id": i, "en": e, "es": s}) for i, (e, s) in enumerate(zip(EN, ES))]
    path = write(tmp_path / "f.jsonl", lines(flat).replace("\n", "\r\n"))
    assert pairs(load_parallel(SourceConfig(format="jsonl", path=str(path)), "es", "en")) == list(
        zip(ES, EN)
    )


def test_jsonl_missing_key_in_one_row_names_the_line(tmp_path):
    path = write(
        tmp_path / "c.jsonl",
        '{"translation": {"en": "a", "es": "b"}}\n\n{"translation": {"en": "c"}}\n',
    )
    with pytest.raises(
        DataError,
        match=r"c\.jsonl:3: missing key 'translation\.es' "
        r"\(the row has: en\)$",
    ):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")
    # rows of different keys (datasets reads them as JSON objects): the row names its keys,
    # and a language no row has names the keys the rows have
    path = write(
        tmp_path / "d.jsonl",
        '{"translation": {"en": "a", "es": "b"}}\n{"translation": {"en": "c", "fr": "d"}}\n',
    )
    with pytest.raises(
        DataError,
        match=r"d\.jsonl:2: missing key 'translation\.es' "
        r"\(the row has: en, fr\)$",
    ):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")
    with pytest.raises(
        DataError,
        match=r"d\.jsonl: no row has key 'translation\.de' "
        r"\(keys seen: en, es, fr\)$",
    ):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "de")
    path = write(tmp_path / "e.jsonl", '{"en": "a", "es": "b"}\n{"en": "c", "fr": "d"}\n')
    with pytest.raises(DataError, match=r"e\.jsonl:2: missing key 'es' \(the row has: en, fr\)$"):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")


def test_jsonl_missing_key_everywhere(tmp_path):
    path = write(tmp_path / "c.jsonl", '{"en": "a", "fr": "b"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl: missing key 'es' in every row"):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")
    path = write(tmp_path / "d.jsonl", '{"translation": {"en": "a", "fr": "b"}}\n')
    with pytest.raises(DataError, match=r"d\.jsonl: missing key 'translation\.es'"):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")


def test_jsonl_invalid_json_and_non_strings(tmp_path):
    path = write(tmp_path / "c.jsonl", '{"en": "a", "es": "b"}\n{"en": "c", es: "d"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:2: invalid JSON"):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")
    path = write(tmp_path / "d.jsonl", '{"en": "a", "es": "b"}\n{"en": "c", "es": 3}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: key 'es' is 3, not a string"):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")


def test_jsonl_invalid_utf8(tmp_path):
    path = write(tmp_path / "c.jsonl", b'{"en": "a", "es": "b"}\n{"en": "\xff", "es": "d"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:2: invalid UTF-8"):
        load_parallel(SourceConfig(format="jsonl", path=str(path)), "en", "es")


# --- disk / hub -----------------------------------------------------------------------------


def hub_like(tmp_path: Path) -> Path:
    """A DatasetDict as a hub translation dataset has it (``translation`` feature), saved."""
    features = Features({"id": Value("string"), "translation": Translation(languages=["en", "es"])})

    def split(n0: int, n1: int) -> Dataset:
        return Dataset.from_dict(
            {
                "id": [str(i) for i in range(n0, n1)],
                "translation": [{"en": e, "es": s} for e, s in zip(EN[n0:n1], ES[n0:n1])],
            },
            features=features,
        )

    path = tmp_path / "hub_like"
    DatasetDict({"train": split(0, 3), "validation": split(3, 4)}).save_to_disk(str(path))
    return path


def test_disk_datasetdict_in_translation_convention(tmp_path):
    path = hub_like(tmp_path)
    train = load_parallel(SourceConfig(format="disk", path=str(path)), "en", "es")
    assert pairs(train) == list(zip(EN[:3], ES[:3]))
    dev = load_parallel(SourceConfig(format="disk", path=str(path), split="validation"), "es", "en")
    assert pairs(dev) == [(ES[3], EN[3])]


def test_disk_flat_dataset_and_named_columns(tmp_path):
    path = tmp_path / "flat"
    Dataset.from_dict({"es": ES, "en": EN, "score": [1.0] * 4}).save_to_disk(str(path))
    assert pairs(load_parallel(SourceConfig(format="disk", path=str(path)), "en", "es")) == list(
        zip(EN, ES)
    )
    path = tmp_path / "named"
    Dataset.from_dict({"target": EN, "source": ES}).save_to_disk(str(path))
    ds = load_parallel(
        SourceConfig(format="disk", path=str(path), src_column="target", tgt_column="source"),
        "en",
        "es",
    )
    assert pairs(ds) == list(zip(EN, ES))


def test_disk_errors(tmp_path):
    path = hub_like(tmp_path)
    with pytest.raises(DataError, match=r"no split 'test' \(splits: train, validation\)"):
        load_parallel(SourceConfig(format="disk", path=str(path), split="test"), "en", "es")
    with pytest.raises(DataError, match=r"'translation' has no language 'fr'"):
        load_parallel(SourceConfig(format="disk", path=str(path)), "en", "fr")
    with pytest.raises(DataError, match=r"dataset directory not found: .*nothere"):
        load_parallel(SourceConfig(format="disk", path=str(tmp_path / "nothere")), "en", "es")
    flat = tmp_path / "flat"
    Dataset.from_dict({"en": ["a", None], "es": ["b", "c"]}).save_to_disk(str(flat))
    with pytest.raises(DataError, match=r"row 1 \(source\): missing \(null\)"):
        load_parallel(SourceConfig(format="disk", path=str(flat)), "en", "es")
    with pytest.raises(DataError, match=r"no column 'fr' \(columns: en, es\)"):
        load_parallel(SourceConfig(format="disk", path=str(flat)), "fr", "es")


def test_hub_loads_by_name_config_and_split(tmp_path, monkeypatch):
    saved = hub_like(tmp_path)
    calls = []

    def fake_load_dataset(path, name=None, *, split=None):  # the hub, served from disk
        calls.append((path, name, split))
        return datasets.load_from_disk(str(saved))[split]

    monkeypatch.setattr(sources, "load_dataset", fake_load_dataset)
    ds = load_parallel(
        SourceConfig(format="hub", path="someone/opus-en-es", name="en-es", split="validation"),
        "en",
        "es",
    )
    assert calls == [("someone/opus-en-es", "en-es", "validation")]
    assert pairs(ds) == [(EN[3], ES[3])]


def test_hub_unreachable_is_a_data_error(monkeypatch):
    def offline(path, name=None, *, split=None):
        raise ConnectionError("no network")

    monkeypatch.setattr(sources, "load_dataset", offline)
    with pytest.raises(DataError, match=r"hub dataset 'wmt14' \(de-en\) split 'train'.*no net"):
        load_parallel(SourceConfig(format="hub", path="wmt14", name="de-en"), "en", "de")


def test_unknown_format_and_same_language(tmp_path):
    with pytest.raises(DataError, match="unknown source format 'xml'"):
        load_parallel(SourceConfig(format="xml", path="x"), "en", "es")
    with pytest.raises(DataError, match="both 'en'"):
        load_parallel(SourceConfig(format="text", path="x"), "en", "en")


def test_overlap_report():
    train = Dataset.from_dict({"source": ["a", "b", "c"], "target": ["1", "2", "3"]})
    other = Dataset.from_dict({"source": ["b", "x", "c", "b"], "target": ["2", "9", "3", "2"]})
    assert overlap_report(train, other) == 3
    assert overlap_report(train, train.select([])) == 0
    assert overlap_report(train, train) == 3


# --- the shipped corpus ---------------------------------------------------------------------


def raw_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def test_shipped_tatoeba_dev_split():
    src = SourceConfig(format="text", path=str(TATOEBA / "dev"))
    ds = load_parallel(src, "en", "es", split_name="dev")
    en, es = raw_lines(TATOEBA / "dev.en.gz"), raw_lines(TATOEBA / "dev.es.gz")
    assert len(ds) == len(en) == len(es) == 1416
    assert ds[0] == {"source": en[0], "target": es[0]}
    assert ds[0]["source"] == "See to it that no strangers come into this room."
    assert ds[-1] == {"source": en[-1], "target": es[-1]}
    assert pairs(ds) == list(zip(en, es))
    assert load_parallel(src, "es", "en")[0] == {"source": es[0], "target": en[0]}


def test_shipped_tatoeba_train_split_loads_aligned():
    train = load_parallel(SourceConfig(format="text", path=str(TATOEBA / "train")), "en", "es")
    assert len(train) == 136_672
    en, es = raw_lines(TATOEBA / "train.en.gz"), raw_lines(TATOEBA / "train.es.gz")
    assert train[0] == {"source": en[0], "target": es[0]}
    assert train[-1] == {"source": en[-1], "target": es[-1]}
    dev = load_parallel(SourceConfig(format="text", path=str(TATOEBA / "dev")), "en", "es")
    assert overlap_report(train, dev) == 0  # the split keeps dev sentences out of train


@pytest.mark.parametrize("chunk", [1, 2, 5, 1 << 24])
def test_text_file_checks_in_blocks_give_the_same_counts_and_lines(tmp_path, monkeypatch, chunk):
    """``_checked_line_count`` reads CHECK_BYTES at a time: the line count (a BOM, CRLF, a
    missing final newline) and the line named by an error do not depend on the block size."""
    monkeypatch.setattr(sources, "CHECK_BYTES", chunk)
    good = tmp_path / "good.en"
    good.write_bytes("\ufeffuno\r\ndós\n\ntres".encode())
    assert sources._checked_line_count(good) == 4
    bom_only = tmp_path / "bom.en"
    bom_only.write_bytes("\ufeff".encode())
    assert sources._checked_line_count(bom_only) == 0
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"uno\ndos\nt\xffres\n")
    with pytest.raises(DataError, match=r"bad\.en:3: invalid UTF-8 \(byte 0xff at byte 2 "):
        sources._checked_line_count(bad)
    cr = tmp_path / "cr.en"
    cr.write_bytes(b"uno\r\ndos\rtres\n")
    with pytest.raises(DataError, match=r"cr\.en:2: carriage return"):
        sources._checked_line_count(cr)
    gz = tmp_path / "g.en.gz"
    gz.write_bytes(gzip.compress(b"a\nb\n"))
    assert sources._checked_line_count(gz) == 2
