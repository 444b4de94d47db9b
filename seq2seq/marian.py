"""Import a Hugging Face Marian / OPUS-MT checkpoint as a run directory (``seq2seq-import``).

``import_marian(DIR, OUT)`` reads a local ``MarianMTModel`` directory (``config.json``, the
weights as ``model.safetensors`` (or a sharded ``model.safetensors.index.json``) or
``pytorch_model.bin``, ``source.spm``, ``target.spm`` and ``vocab.json``) and writes ``OUT`` in
the layout of ``seq2seq.workdir``: ``config.yaml``, the two SentencePiece models as
``spm.{src_lang}.model`` / ``spm.{tgt_lang}.model``, ``vocab.json`` (``tokenizer.vocab_file``:
the map that numbers their pieces, one id space) and one checkpoint (step 0, written by
``seq2seq.training.checkpoints``, a fresh optimizer state). Every command that reads a run
(translate, evaluate, score, serve, export, ``train.init_from``) then reads it.

The model becomes our ``Transformer`` with Marian's settings: post-norm with LayerNorm ε 1e-5,
an FFN activation computing the checkpoint's (``ACTIVATIONS``: ``swish``, ``relu``, the exact
``gelu`` as ``gelu_erf``, ``gelu_new`` as our tanh ``gelu``), sinusoidal positions in the
``halves`` layout, embeddings scaled by √d_model when ``scale_embedding``, the
``final_logits_bias`` as ``logits_bias`` and the embedding sharing of
``share_encoder_decoder_embeddings`` / ``tie_word_embeddings``. Whatever our model cannot hold
exactly is a ``MarianImportError`` naming the key or weight: e.g. ``quick_gelu`` (the sigmoid
approximation), different encoder and decoder widths, a
``normalize_before``/``add_final_layer_norm``/``normalize_embedding`` set to true, separate
source and target vocabularies (``target_vocab.json``), or a weight that is missing, left
over or of another shape.

Reading ``pytorch_model.bin`` needs ``torch``, ``model.safetensors`` the ``safetensors``
package (the ``compare`` and ``export`` extras); ``transformers`` itself is not needed.
Sources: Hugging Face ``transformers/models/marian/modeling_marian.py`` and
``tokenization_marian.py`` (v5).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.config import (
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TokenizerConfig,
    save_config,
)
from seq2seq.data.tokenizer import Tokenizer, TokenizerError, model_names
from seq2seq.workdir import checkpoint_dir, config_path

log = logging.getLogger(__name__)

VOCAB_FILE = "vocab.json"  # tokenizer.vocab_file of an imported run
# Hugging Face activation names (transformers.activations.ACT2CLS) → ours, only where both
# compute the same function
ACTIVATIONS = {
    "swish": "swish",
    "silu": "swish",
    "relu": "relu",
    "gelu": "gelu_erf",  # torch's exact erf GELU, MarianConfig's default
    "gelu_python": "gelu_erf",
    # the tanh approximation, jax.nn.gelu's default, however each one writes it
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_python_tanh": "gelu",
    "gelu_fast": "gelu",
    "gelu_accurate": "gelu",
}
# Keys of older BART-style Marian configs that Hugging Face's Marian ignores; true would say
# the weights come from a model of another shape.
MUST_BE_FALSE = ("normalize_before", "add_final_layer_norm", "normalize_embedding")
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which MarianMTModel uses


class MarianImportError(ValueError):
    """The checkpoint cannot be read or represented exactly; the message names the file and
    the key or weight at fault."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise MarianImportError(f"{path} not found: not a Marian checkpoint directory") from e
    except ValueError as e:
        raise MarianImportError(f"{path}: not JSON ({e})") from e


def model_config(hf: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """Our ``ModelConfig`` for a Hugging Face ``MarianConfig`` (its ``config.json`` as a dict).

    Raises:
      MarianImportError: a setting our model cannot represent exactly (named with its value).
    """

    def get(key: str, default: Any = None) -> Any:
        return hf.get(key, default)

    if get("model_type", "marian") != "marian":
        raise MarianImportError(f"{where}: model_type={get('model_type')!r}, expected 'marian'")
    activation = get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise MarianImportError(
            f"{where}: activation_function={activation!r} has no exact counterpart here "
            f"(supported: {', '.join(ACTIVATIONS)})"
        )
    for key in MUST_BE_FALSE:
        if get(key):
            raise MarianImportError(
                f"{where}: {key}=true is not a Marian layout (post-norm, no final or embedding "
                "LayerNorm), and Hugging Face's MarianMTModel ignores it: the weights would not "
                "be run as the config says"
            )
    pairs = [
        ("encoder_attention_heads", "decoder_attention_heads", 16),
        ("encoder_ffn_dim", "decoder_ffn_dim", 4096),
    ]
    for enc, dec, default in pairs:
        if get(enc, default) != get(dec, default):
            raise MarianImportError(
                f"{where}: {enc}={get(enc, default)} differs from {dec}={get(dec, default)}; "
                "our encoder and decoder share one setting"
            )
    d_model = int(get("d_model", 1024))
    if d_model % 2:
        raise MarianImportError(
            f"{where}: d_model={d_model} is odd; sinusoidal positions need it even"
        )
    if get("encoder_layerdrop", 0) or get("decoder_layerdrop", 0):
        raise MarianImportError(f"{where}: encoder_layerdrop/decoder_layerdrop are not supported")
    vocab = int(get("vocab_size", 58101))
    target_vocab = int(get("decoder_vocab_size") or vocab)
    shared = bool(get("share_encoder_decoder_embeddings", True))
    tied = bool(get("tie_word_embeddings", True))
    if shared and target_vocab != vocab:
        raise MarianImportError(
            f"{where}: share_encoder_decoder_embeddings=true with decoder_vocab_size="
            f"{target_vocab} != vocab_size={vocab}"
        )
    # tie_word_embeddings=false unties every matrix in Hugging Face (v5): three of them
    sharing = "all" if shared and tied else "target" if tied else "none"
    return ModelConfig(
        vocab_size=target_vocab,
        src_vocab_size=0 if shared else vocab,
        d_model=d_model,
        num_heads=int(get("encoder_attention_heads", 16)),
        num_encoder_layers=int(get("encoder_layers", 12)),
        num_decoder_layers=int(get("decoder_layers", 12)),
        d_ff=int(get("encoder_ffn_dim", 4096)),
        dropout_rate=float(get("dropout", 0.1)),
        attention_dropout_rate=float(get("attention_dropout", 0.0)),
        activation_dropout_rate=float(get("activation_dropout", 0.0)),
        activation=ACTIVATIONS[activation],
        norm="post",
        positions="sinusoidal",
        sinusoidal_layout="halves",
        share_embeddings=sharing,
        scale_embeddings=bool(get("scale_embedding", False)),
        logits_bias=True,
        norm_epsilon=LAYER_NORM_EPS,
    )


def read_weights(directory: Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as float32 NumPy arrays by their PyTorch names.

    Raises:
      MarianImportError: no weight file, or the package needed to read it is missing.
    """
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file() or index.is_file():
        try:
            from safetensors.numpy import load_file
        except ImportError as e:
            raise MarianImportError(
                "reading model.safetensors needs the safetensors package "
                "(pip install 'seq2seq[export]')"
            ) from e
        files = (
            [single]
            if single.is_file()
            else sorted({directory / f for f in _read_json(index).get("weight_map", {}).values()})
        )
        out: dict[str, np.ndarray] = {}
        for f in files:
            out.update(load_file(str(f)))
        return {k: np.asarray(v, np.float32) for k, v in out.items()}
    binary = directory / "pytorch_model.bin"
    if binary.is_file():
        try:
            import torch
        except ImportError as e:
            raise MarianImportError(
                f"reading {binary} needs torch (pip install 'seq2seq[compare]'), or convert "
                "it to model.safetensors"
            ) from e
        state = torch.load(binary, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise MarianImportError(
        f"{directory}: no weights (model.safetensors, model.safetensors.index.json or "
        "pytorch_model.bin)"
    )


def _sinusoidal_halves(rows: int, d_model: int) -> np.ndarray:
    """Marian's position table (float32 ``[rows, d_model]``), to check a stored one."""
    import jax.numpy as jnp

    from seq2seq.model.positions import sinusoidal_embedding

    return np.asarray(sinusoidal_embedding(jnp.arange(rows), d_model, layout="halves"))


def convert_weights(
    weights: dict[str, np.ndarray], config: ModelConfig, where: str = "weights"
) -> dict[str, Any]:
    """Map Marian's tensors onto our parameter tree (a nested dict of arrays, the layout of
    ``nnx.to_pure_dict(nnx.state(model, nnx.Param))``).

    Linear weights ``[out, in]`` become kernels ``[in, out]``; LayerNorm ``weight`` is our
    ``scale``; ``final_logits_bias`` ``[1, vocab]`` our ``logits_bias`` (zeros when absent, as
    Hugging Face loads it). A stored position table must be the ``halves`` sinusoid.

    Raises:
      MarianImportError: a tensor is missing, left over, of another shape, or tied weights
        that the config says are one matrix differ.
    """
    w = dict(weights)
    if not any(k.startswith("model.") for k in w):  # a MarianModel saved without the head
        w = {f"model.{k}": v for k, v in w.items()}
    used: set[str] = set()

    def take(*names: str) -> np.ndarray:
        for name in names:
            if name in w:
                used.add(name)
                return w[name]
        raise MarianImportError(f"{where}: missing tensor {' or '.join(names)}")

    def linear(prefix: str) -> dict[str, np.ndarray]:
        return {"kernel": take(f"{prefix}.weight").T, "bias": take(f"{prefix}.bias")}

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {"scale": take(f"{prefix}.weight"), "bias": take(f"{prefix}.bias")}

    def attention(prefix: str) -> dict[str, Any]:
        return {
            ours: linear(f"{prefix}.{theirs}_proj")
            for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "out"))
        }

    def ffn(prefix: str) -> dict[str, Any]:
        return {"wi": linear(f"{prefix}.fc1"), "wo": linear(f"{prefix}.fc2")}

    enc, dec = "model.encoder", "model.decoder"
    params: dict[str, Any] = {
        "encoder_layers": {
            i: {
                "self_attention": attention(f"{enc}.layers.{i}.self_attn"),
                "attention_block": {"norm": norm(f"{enc}.layers.{i}.self_attn_layer_norm")},
                "ffn": ffn(f"{enc}.layers.{i}"),
                "ffn_block": {"norm": norm(f"{enc}.layers.{i}.final_layer_norm")},
            }
            for i in range(config.num_encoder_layers)
        },
        "decoder_layers": {
            i: {
                "self_attention": attention(f"{dec}.layers.{i}.self_attn"),
                "self_block": {"norm": norm(f"{dec}.layers.{i}.self_attn_layer_norm")},
                "cross_attention": attention(f"{dec}.layers.{i}.encoder_attn"),
                "cross_block": {"norm": norm(f"{dec}.layers.{i}.encoder_attn_layer_norm")},
                "ffn": ffn(f"{dec}.layers.{i}"),
                "ffn_block": {"norm": norm(f"{dec}.layers.{i}.final_layer_norm")},
            }
            for i in range(config.num_decoder_layers)
        },
    }

    def tied(*names: str) -> np.ndarray:
        """One matrix saved under any of ``names`` (tied copies must be equal)."""
        present = [n for n in names if n in w]
        if not present:
            raise MarianImportError(f"{where}: missing tensor {' or '.join(names)}")
        first = w[present[0]]
        for other in present[1:]:
            if w[other].shape != first.shape or not np.array_equal(w[other], first):
                raise MarianImportError(
                    f"{where}: the config ties {present[0]} and {other}, but the checkpoint "
                    "holds two different matrices"
                )
        used.update(present)
        return first

    shared = "model.shared.weight"
    if config.share_embeddings == "none":
        # tie_word_embeddings=false: Hugging Face ties nothing, the encoder, decoder and
        # output matrices are three (model.shared, if saved, is not used by the forward pass)
        params["embed"] = {"embedding": take(f"{enc}.embed_tokens.weight", shared)}
        params["target_embed"] = {"embedding": take(f"{dec}.embed_tokens.weight", shared)}
        params["output"] = {"kernel": take("lm_head.weight").T}
        used.add(shared)
    elif config.share_embeddings == "all":
        names = (f"{enc}.embed_tokens.weight", f"{dec}.embed_tokens.weight", shared)
        params["embed"] = {"embedding": tied(*names, "lm_head.weight")}
    else:  # separate encoder embeddings, the decoder's tied to the output projection
        params["embed"] = {"embedding": tied(f"{enc}.embed_tokens.weight")}
        params["target_embed"] = {"embedding": tied(f"{dec}.embed_tokens.weight", "lm_head.weight")}
    if "final_logits_bias" in w:
        params["logits_bias"] = take("final_logits_bias").reshape(-1)
    else:
        params["logits_bias"] = np.zeros((config.vocab_size,), np.float32)
    for side in ("encoder", "decoder"):
        name = f"model.{side}.embed_positions.weight"
        if name in w:
            table = take(name)
            if not np.allclose(table, _sinusoidal_halves(*table.shape), atol=1e-5):
                raise MarianImportError(
                    f"{where}: {name} is not Marian's sinusoidal table (learned positions are "
                    "not supported)"
                )
    left = sorted(set(w) - used)
    if left:
        raise MarianImportError(
            f"{where}: tensors our model has no place for: {', '.join(left[:10])}"
            + (f" and {len(left) - 10} more" if len(left) > 10 else "")
        )
    return params


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Each leaf's shape by its path."""
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(k): tuple(np.shape(v)) for k, v in leaves}


def _languages(directory: Path, src_lang: str | None, tgt_lang: str | None) -> tuple[str, str]:
    """The direction: given, else ``tokenizer_config.json``'s ``source_lang``/``target_lang``,
    else the ``opus-mt-SRC-TGT`` directory name."""
    tc = directory / "tokenizer_config.json"
    found = _read_json(tc) if tc.is_file() else {}
    src = src_lang or found.get("source_lang")
    tgt = tgt_lang or found.get("target_lang")
    name = re.fullmatch(r".*opus-mt-([A-Za-z_]+)-([A-Za-z_]+)", directory.resolve().name)
    if name:
        src, tgt = src or name.group(1), tgt or name.group(2)
    if not src or not tgt:
        raise MarianImportError(
            f"{directory}: cannot tell the languages (no source_lang/target_lang in "
            "tokenizer_config.json, not named opus-mt-SRC-TGT): give --src-lang and --tgt-lang"
        )
    if src == tgt:
        raise MarianImportError(f"source and target language are both {src!r}")
    return src, tgt


def _decode_config(directory: Path) -> DecodeConfig:
    """Decoding as Marian's ``generate`` scores hypotheses: log-probability / |Y|^α with
    ``length_penalty`` α (|Y| counts EOS), beam ``num_beams``, the unknown piece allowed."""
    path = directory / "generation_config.json"
    gen = _read_json(path) if path.is_file() else {}
    return DecodeConfig(
        beam_size=int(gen.get("num_beams") or 4),
        length_penalty="plain",
        alpha=float(gen.get("length_penalty", 1.0)),
        allow_unk=True,
    )


def import_marian(
    directory: str | Path,
    out: str | Path,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Turn a local Hugging Face Marian directory into a run directory (module docstring).

    Args:
      directory: holds ``config.json``, the weights, ``source.spm``, ``target.spm``,
        ``vocab.json`` (and optionally ``tokenizer_config.json``, ``generation_config.json``).
      out: the new run directory.
      src_lang / tgt_lang: language codes (default: from ``tokenizer_config.json`` or an
        ``opus-mt-SRC-TGT`` directory name).
      overwrite: replace a non-empty ``out``.

    Returns:
      ``out``.

    Raises:
      MarianImportError: a missing file, a setting or weight that cannot be represented, a
        vocabulary that does not fit the model, or ``out`` exists (without ``overwrite``).
    """
    import jax
    from flax import nnx

    from seq2seq.model import build_model
    from seq2seq.training.checkpoints import Checkpointer
    from seq2seq.training.step import create_train_state, make_optimizer

    directory, out = Path(directory), Path(out)
    hf = _read_json(directory / "config.json")
    if (directory / "target_vocab.json").is_file() or hf.get("separate_vocabs"):
        raise MarianImportError(
            f"{directory}: separate source and target vocabularies (target_vocab.json) are not "
            "supported; only Marian's one joint vocab.json"
        )
    for name in ("source.spm", "target.spm", VOCAB_FILE):
        if not (directory / name).is_file():
            raise MarianImportError(f"{directory / name} not found")
    model = model_config(hf, str(directory / "config.json"))
    src, tgt = _languages(directory, src_lang, tgt_lang)
    try:
        tokenizers = [
            Tokenizer(directory / f, directory / VOCAB_FILE) for f in ("source.spm", "target.spm")
        ]
    except TokenizerError as e:
        raise MarianImportError(str(e)) from e
    tok = tokenizers[1]
    checks = {
        "pad_token_id": tok.pad_id,
        "decoder_start_token_id": tok.pad_id,
        "eos_token_id": tok.eos_id,
    }
    for key, expected in checks.items():
        have = hf.get(key)
        if have is not None and have != expected:
            raise MarianImportError(
                f"{directory / 'config.json'}: {key}={have}, but {VOCAB_FILE} gives "
                f"{expected} ('<pad>' starts the decoder, '</s>' ends it)"
            )
    if tok.vocab_size != model.vocab_size:
        raise MarianImportError(
            f"{directory / VOCAB_FILE} numbers {tok.vocab_size} pieces but the model has "
            f"vocab_size={model.vocab_size}"
        )
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise MarianImportError(f"{out} already exists and is not empty; choose another")
        shutil.rmtree(out)
    if out.resolve() == directory.resolve():
        raise MarianImportError("the output must be a new directory, not the checkpoint's")

    tok_config = TokenizerConfig(joint=False, vocab_size=tok.vocab_size, vocab_file=VOCAB_FILE)
    config = Config(
        workdir=str(out),
        data=DataConfig(src_lang=src, tgt_lang=tgt),
        tokenizer=tok_config,
        model=model,
        decode=_decode_config(directory),
    )
    params = convert_weights(read_weights(directory), model, str(directory))
    transformer = build_model(model, config.train.seed)
    state = nnx.state(transformer, nnx.Param)
    want = _shapes(nnx.to_pure_dict(state))
    have = _shapes(params)
    if want != have:
        wrong = [
            f"{k}: ours {want.get(k)}, checkpoint {have.get(k)}"
            for k in {**want, **have}
            if want.get(k) != have.get(k)
        ]
        raise MarianImportError(
            f"{directory}: weights of another shape than config.json says: " + "; ".join(wrong[:5])
        )
    nnx.replace_by_pure_dict(state, jax.tree.map(jax.numpy.asarray, params))
    nnx.update(transformer, state)
    _, train_state = create_train_state(
        transformer, make_optimizer(config.train), config.train.seed
    )

    out.mkdir(parents=True, exist_ok=True)
    save_config(config, config_path(out))
    src_name, tgt_name = model_names(tok_config, src, tgt)
    shutil.copyfile(directory / "source.spm", out / f"{src_name}.model")
    shutil.copyfile(directory / "target.spm", out / f"{tgt_name}.model")
    shutil.copyfile(directory / VOCAB_FILE, out / VOCAB_FILE)
    checkpointer = Checkpointer(checkpoint_dir(out), keep=None, async_save=False)
    try:
        checkpointer.save(0, train_state, {"imported_from": str(directory), "format": "marian"})
    finally:
        checkpointer.close()
    (out / "summary.md").write_text(
        f"# Imported Marian model\n\n`{directory}` ({src}→{tgt}, {model.num_encoder_layers}+"
        f"{model.num_decoder_layers} layers, d_model {model.d_model}, vocabulary "
        f"{model.vocab_size}) imported with `seq2seq-import --from marian`.\n\n"
        f"Use it with `seq2seq-translate --workdir {out}`, or fine-tune it with "
        f"`train.init_from={out}`.\n",
        encoding="utf-8",
    )
    log.info("imported %s into %s", directory, out)
    return out
