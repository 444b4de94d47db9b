"""Take a trained run out: a CTranslate2 model or safetensors weights, with what a user needs.

``seq2seq-export --workdir RUN --to ctranslate2 OUT`` converts the run's parameters with
CTranslate2's own converter machinery (``seq2seq.ct2_converter``); ``--to safetensors OUT``
writes them as a safetensors file under the flat names of ``flat_params``. Either way ``OUT``
also gets the run's SentencePiece model(s), ``config.yaml``/``config.json`` and a README
(model card) with the run's test BLEU and its sacreBLEU signature; ``--push REPO`` uploads the
directory to the Hugging Face hub (``huggingface_hub.HfApi``).

The optional packages (``ctranslate2``, ``safetensors``, ``huggingface_hub``) come with the
``export`` extra; a missing one is a ``MissingDependency`` naming it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from seq2seq.config import Config, DecodeConfig, ModelConfig, config_yaml, to_dict
from seq2seq.data.tokenizer import Tokenizer, TokenizerPair

FORMATS = ("ctranslate2", "safetensors")
INSTALL = "pip install 'seq2seq[export]'"


class ExportError(ValueError):
    """The run cannot be exported as asked; the message names the setting and why."""


class MissingDependency(ExportError):
    """An optional package of the ``export`` extra is not installed."""


def _require(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependency(
            f"the {module} package is needed for this export; install it with {INSTALL}"
        ) from e


def flat_params(params: Any) -> dict[str, np.ndarray]:
    """The parameters as float32 NumPy arrays by dotted NNX state path.

    E.g. ``encoder_layers.0.self_attention.query.kernel`` ``[d_model, d_model]`` (``nnx.Linear``
    kernels are ``[in, out]``), ``embed.embedding`` ``[vocab, d_model]``.

    Args:
      params: the ``nnx.Param`` state of a ``Transformer`` (``nnx.State`` or a nested dict).
    """
    from flax import nnx

    tree = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        out[name] = np.asarray(leaf, np.float32)
    return out


def check_ctranslate2(config: ModelConfig) -> None:
    """Refuse what CTranslate2's encoder-decoder ``TransformerSpec`` cannot express exactly.

    Raises:
      ExportError: ``model.positions=alibi`` (CTranslate2 has ALiBi only for decoder-only
        models, with a causal, one-sided bias; ours is −m_h·|i − j| in the encoder too).
    """
    if config.positions == "alibi":
        raise ExportError(
            "model.positions=alibi cannot be exported to CTranslate2: its encoder-decoder "
            "Transformer has no ALiBi (CTranslate2 applies ALiBi only in decoder-only models, "
            "as a one-sided causal bias; ours also biases the encoder by -m_h·|i - j|)"
        )


def vocabularies(tokenizer: TokenizerPair) -> tuple[list[str], list[str], dict[str, str]]:
    """Source and target pieces in id order, and the ``unk``/``bos``/``eos`` pieces."""

    def pieces(tok: Tokenizer) -> list[str]:
        return [tok.id_to_piece(i) for i in range(tok.vocab_size)]

    target = tokenizer.target
    special = {
        "unk": target.id_to_piece(target.unk_id),
        "bos": target.id_to_piece(target.bos_id),
        "eos": target.id_to_piece(target.eos_id),
    }
    return pieces(tokenizer.source), pieces(target), special


def write_ctranslate2(
    config: ModelConfig,
    tokenizer: TokenizerPair,
    params: Any,
    out: str | Path,
    *,
    quantization: str | None = None,
) -> Path:
    """Convert a model to a CTranslate2 model directory (``model.bin``, ``config.json`` and the
    vocabulary: ``shared_vocabulary.json``, or ``source_``/``target_vocabulary.json``).

    ``out`` is replaced if it exists. ``quantization``: CTranslate2's weight type at
    conversion (``int8``, ``float16``, ...; None keeps float32).

    Raises:
      ExportError: a scheme CTranslate2 lacks (``check_ctranslate2``).
      MissingDependency: ``ctranslate2`` is not installed.
    """
    check_ctranslate2(config)
    _require("ctranslate2")
    from seq2seq.ct2_converter import Seq2seqConverter

    source, target, special = vocabularies(tokenizer)
    converter = Seq2seqConverter(config, flat_params(params), source, target, special)
    return Path(converter.convert(str(out), quantization=quantization, force=True))


def ctranslate2_options(
    decode: DecodeConfig, tokenizer: TokenizerPair, *, suppress_special: bool = True
) -> dict[str, Any]:
    """``Translator.translate_batch`` options that run our beam search's rules.

    CTranslate2 takes the top 2·beam candidates per step and finishes the ones ending in EOS
    among the first ``beam``, as ``seq2seq.decoding`` does; its ``length_penalty=a`` divides the
    log-probability by |Y|^a with |Y| the hypothesis length, which counts the EOS only with
    ``return_end_token=True``: that is our ``plain`` penalty (``none``: a = 0).
    Remaining differences, which a trained model rarely meets: CTranslate2 stops a sentence once
    ``patience · beam`` hypotheses are finished (ours once no live beam can beat them:
    ``ctranslate2_translate(exhaustive=True)`` raises the patience so that CTranslate2 searches
    up to the length limit as well); a hypothesis that reaches the length limit ends there
    without EOS (ours is given EOS at the last position);
    and the tokens we never produce (PAD and BOS with ``suppress_special``, and UNK unless
    ``decode.allow_unk``: ``suppress_sequences``, ``disable_unk``) are removed before
    CTranslate2's softmax, so its scores are renormalized over the other tokens where ours
    are the model's own log-probabilities. A trained model gives PAD and BOS almost no
    probability (they are never targets); without ``suppress_special`` and with
    ``decode.allow_unk`` CTranslate2 scores every hypothesis as we do, but may output a BOS
    or PAD piece where ours cannot.

    Raises:
      ExportError: ``decode.length_penalty=gnmt`` ((5+|Y|)/6)^α, which CTranslate2 (≥ 3) lacks,
        or sampling.
    """
    if decode.search not in ("beam", "greedy"):
        raise ExportError(
            f"decode.search={decode.search}: the comparison is for beam or greedy search"
        )
    if decode.length_penalty == "gnmt" and decode.alpha != 0:
        raise ExportError(
            "decode.length_penalty=gnmt ((5+|Y|)/6)^alpha has no CTranslate2 counterpart "
            "(its length_penalty divides by |Y|^alpha): use decode.length_penalty=plain"
        )
    target = tokenizer.target
    return dict(
        card_options(decode),
        min_decoding_length=decode.min_length,
        suppress_sequences=[
            [target.id_to_piece(i)] for i in dict.fromkeys((tokenizer.pad_id, tokenizer.bos_id))
        ]
        if suppress_special
        else None,
        return_end_token=True,
        return_scores=True,
    )


def card_options(decode: DecodeConfig) -> dict[str, Any]:
    """The ``translate_batch`` options of the model card's snippet: the run's beam size, its
    α as CTranslate2's ``length_penalty`` (|Y|^α; for ``gnmt`` the nearest form CTranslate2
    has, 0 for ``none``) and the unknown piece banned unless ``decode.allow_unk``; CTranslate2's
    defaults otherwise (its stopping after ``beam`` finished hypotheses, its length limit).
    ``benchmarks/export_check.py`` scores exactly these options."""
    return dict(
        beam_size=1 if decode.search == "greedy" else decode.beam_size,
        length_penalty=0.0 if decode.length_penalty == "none" else decode.alpha,
        disable_unk=not decode.allow_unk,
    )


def ctranslate2_translate(
    translator: Any,
    tokenizer: TokenizerPair,
    lines: list[str],
    decode: DecodeConfig,
    *,
    suppress_special: bool = True,
    exhaustive: bool = False,
) -> list[tuple[list[int], float]]:
    """Translate ``lines`` with a ``ctranslate2.Translator`` of an export, under our rules.

    Each line's output limit is ours, ``decode.output_limit(|x|)`` tokens, EOS included (|x|
    counts the source EOS), so lines are decoded in groups of equal limit. Empty lines give
    ``([], 0.0)``. ``suppress_special``: see ``ctranslate2_options``. ``exhaustive``:
    CTranslate2 keeps searching up to the limit (``patience`` = the limit: it cannot finish
    ``limit · beam`` hypotheses earlier) instead of stopping after ``beam`` finished ones; its
    best hypothesis is then the best of every hypothesis finished within the limit, which is
    what our stopping rule returns (slower; CTranslate2's default is ``False``).

    Returns:
      per line, the output ids without EOS and CTranslate2's score (log-probability / lp).

    Raises:
      ExportError: decoding options CTranslate2 cannot follow (``ctranslate2_options``).
    """
    options = ctranslate2_options(decode, tokenizer, suppress_special=suppress_special)
    source_sp, target = tokenizer.source.sp, tokenizer.target
    results: list[tuple[list[int], float]] = [([], 0.0)] * len(lines)
    groups: dict[int, list[int]] = {}
    pieces = [source_sp.encode(line, out_type=str) for line in lines]
    for i, (line, x) in enumerate(zip(lines, pieces)):
        if line.strip():
            limit = decode.output_limit(len(x) + 1)
            groups.setdefault(limit, []).append(i)
    eos = target.id_to_piece(tokenizer.eos_id)
    for limit, rows in sorted(groups.items()):
        out = translator.translate_batch(
            [pieces[i] for i in rows],
            max_decoding_length=limit,
            patience=float(limit) if exhaustive else 1.0,
            **options,
        )
        for i, result in zip(rows, out):
            tokens = list(result.hypotheses[0])
            if tokens and tokens[-1] == eos:
                tokens = tokens[:-1]
            results[i] = ([target.piece_to_id(t) for t in tokens], float(result.scores[0]))
    return results


def write_safetensors(params: Any, out: str | Path, metadata: Mapping[str, str]) -> Path:
    """``out/model.safetensors``: every parameter (float32) under its ``flat_params`` name.

    Raises:
      MissingDependency: ``safetensors`` is not installed.
    """
    _require("safetensors")
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.safetensors"
    save_file(flat_params(params), str(path), metadata=dict(metadata))
    return path


def _test_score(workdir: Path) -> dict[str, Any]:
    """The run's test result from ``test.json`` (empty when the run has none)."""
    path = workdir / "test.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _readme(config: Config, to: str, score: Mapping[str, Any], spm_files: list[str]) -> str:
    m, d = config.model, config.data
    src_spm, tgt_spm = spm_files[0], spm_files[-1]
    if score.get("test_bleu") is not None:
        result = (
            f"Test BLEU **{score['test_bleu']:.2f}** (checkpoint of step "
            f"{score.get('test_step', '?')}), sacreBLEU signature "
            f"`{score.get('bleu_signature', '?')}`."
        )
    else:
        result = "The run has no test score (no `test.json`)."
    shape = (
        f"{m.num_encoder_layers}+{m.num_decoder_layers} layers, d_model {m.d_model}, "
        f"{m.num_heads} heads, d_ff {m.d_ff}, {m.norm}-norm, {m.activation}, "
        f"{m.positions} positions, embeddings shared: {m.share_embeddings}"
    )
    head = (
        f"# {d.src_lang}→{d.tgt_lang} Transformer ({to})\n\n"
        f"Exported from the seq2seq run `{config.workdir}` with `seq2seq-export`.\n\n"
        f"{result}\n\nModel: {shape}. Tokenizer: SentencePiece "
        f"({', '.join(f'`{f}`' for f in spm_files)}).\n\n"
    )
    if to == "ctranslate2":
        options = ", ".join(f"{k}={v!r}" for k, v in card_options(config.decode).items())
        use = (
            "## Translate with CTranslate2\n\n```python\n"
            "import ctranslate2, sentencepiece as spm\n"
            f'src, tgt = spm.SentencePieceProcessor("{src_spm}"), '
            f'spm.SentencePieceProcessor("{tgt_spm}")\n'
            'translator = ctranslate2.Translator(".")  # this directory\n'
            'out = translator.translate_batch([src.encode("Hello world.", out_type=str)], '
            f"{options})\n"
            "print(tgt.decode(out[0].hypotheses[0]))\n```\n\n"
            "The options are the run's decoding settings (`decode.beam_size`, `decode.alpha`, "
            "`decode.allow_unk`). The source EOS is added by the model config "
            "(`add_source_eos`). CTranslate2's `length_penalty=a` divides by |Y|^a, which is "
            "`decode.length_penalty=plain` with `decode.alpha=a` (pass `return_end_token=True` "
            "so that |Y| counts the EOS as ours does, and drop the final `</s>`); the GNMT "
            "penalty ((5+|Y|)/6)^a of `decode.length_penalty=gnmt` has no CTranslate2 "
            "counterpart, and CTranslate2 stops once `beam_size` hypotheses have finished.\n"
        )
    else:
        use = (
            "## Files\n\n`model.safetensors` holds every parameter (float32) under its Flax NNX "
            "state path (e.g. `encoder_layers.0.self_attention.query.kernel`, kernels "
            "`[in, out]`); `config.yaml` (also `config.json`) is the run's config, which "
            "`seq2seq.model.build_model(config.model)` turns back into the model.\n"
        )
    return head + use


def export_run(
    workdir: str | Path,
    to: str,
    out: str | Path,
    *,
    step: int | None = None,
    quantization: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Export a trained run directory to ``out`` (see the module docstring).

    Args:
      workdir: a run written by ``seq2seq-train``.
      to: ``ctranslate2`` or ``safetensors``.
      out: the new directory.
      step: checkpoint step (default: the one the run's test score used).
      quantization: CTranslate2 weight type (``ctranslate2`` only).
      overwrite: replace an existing ``out``.

    Returns:
      ``out``.

    Raises:
      ExportError: unknown format, ``out`` exists (without ``overwrite``) or is the run itself,
        quantization with safetensors, or a model CTranslate2 cannot express.
      MissingDependency: the format's package is not installed.
      FileNotFoundError / CheckpointError: from ``seq2seq.inference.open_run``.
    """
    from seq2seq.inference import open_run

    if to not in FORMATS:
        raise ExportError(f"--to must be one of {', '.join(FORMATS)}; got {to!r}")
    workdir, out = Path(workdir), Path(out)
    if out.resolve() == workdir.resolve():
        raise ExportError(f"the output {out} must be a new directory, not the run itself")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out} already exists and is not empty; choose another or overwrite")
    if quantization and to != "ctranslate2":
        raise ExportError("--quantization applies to --to ctranslate2 only")
    opened = open_run([(workdir, step)])
    config, tokenizer, params = opened.config, opened.tokenizer, opened.params
    _require("ctranslate2" if to == "ctranslate2" else "safetensors")
    score = _test_score(workdir)
    if to == "ctranslate2":
        check_ctranslate2(config.model)
        write_ctranslate2(config.model, tokenizer, params, out, quantization=quantization)
    else:
        if out.exists():
            shutil.rmtree(out)
        metadata = {"format": "seq2seq", "config": json.dumps(to_dict(config))}
        write_safetensors(params, out, metadata)
    spm_files = []
    for tok in dict.fromkeys([tokenizer.source, tokenizer.target]):  # joint: one file
        shutil.copy2(tok.path, out / tok.path.name)
        spm_files.append(tok.path.name)
    if tokenizer.target.vocab_path is not None:  # tokenizer.vocab_file: the piece → id map
        shutil.copy2(tokenizer.target.vocab_path, out / tokenizer.target.vocab_path.name)
    as_yaml = config_yaml(config)
    if to == "safetensors":
        (out / "config.yaml").write_text(as_yaml, encoding="utf-8")
        (out / "config.json").write_text(json.dumps(to_dict(config), indent=1), encoding="utf-8")
    else:  # config.json is CTranslate2's own; the run's config goes next to it
        (out / "seq2seq_config.yaml").write_text(as_yaml, encoding="utf-8")
    (out / "README.md").write_text(_readme(config, to, score, spm_files), encoding="utf-8")
    return out


def push_to_hub(out: str | Path, repo: str, *, private: bool = False) -> str:
    """Upload an export directory to the Hugging Face hub as model repository ``repo``.

    Creates the repository if needed (``HfApi.create_repo(exist_ok=True)``) and uploads the
    directory (``HfApi.upload_folder``); credentials are ``huggingface_hub``'s own (``HF_TOKEN``
    or ``hf auth login``).

    Returns:
      what ``upload_folder`` returns (the commit URL).

    Raises:
      MissingDependency: ``huggingface_hub`` is not installed.
    """
    hub = _require("huggingface_hub")
    api = hub.HfApi()
    api.create_repo(repo_id=repo, repo_type="model", private=private, exist_ok=True)
    return str(
        api.upload_folder(
            repo_id=repo,
            repo_type="model",
            folder_path=str(out),
            commit_message="Upload a seq2seq export",
        )
    )
