"""Parameter counts against the formulas, the paper's presets, and ``seq2seq-params``."""

from pathlib import Path

import jax
import pytest

from seq2seq import cli
from seq2seq.config import ModelConfig, load_config, replace
from seq2seq.model.report import COMPONENTS, abstract_model, parameter_counts

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def formula(c: ModelConfig) -> dict[str, tuple[int, int]]:
    """(weights, biases) per component, from the shapes (Vaswani et al. 2017, §3.2-3.4)."""
    d, f, v, ne, nd = c.d_model, c.d_ff, c.vocab_size, c.num_encoder_layers, c.num_decoder_layers
    attn = (4 * d * d, 4 * d)  # Q, K, V, output projections
    gated = c.activation in ("swiglu", "geglu")
    ffn = ((3 if gated else 2) * d * f, (2 if gated else 1) * f + d)
    matrices = {"all": 1, "target": 2, "none": 3}[c.share_embeddings]
    norms = 2 * ne + 3 * nd + (2 if c.norm == "pre" else 0)
    positions = {"learned": 2 * c.max_len * d, "relative": 2 * c.num_heads * c.relpos_buckets}
    return {
        "embeddings": (matrices * v * d, 0),
        "encoder attention": (ne * attn[0], ne * attn[1]),
        "encoder FFN": (ne * ffn[0], ne * ffn[1]),
        "decoder self-attention": (nd * attn[0], nd * attn[1]),
        "cross-attention": (nd * attn[0], nd * attn[1]),
        "decoder FFN": (nd * ffn[0], nd * ffn[1]),
        "norms": (norms * d, norms * d),  # LayerNorm scale + offset
        "positions": (positions.get(c.positions, 0), 0),
    }


@pytest.mark.parametrize(
    "changes",
    [
        dict(
            d_model=512,
            d_ff=2048,
            num_heads=8,
            num_encoder_layers=1,
            num_decoder_layers=1,
            norm="post",
        ),
        dict(d_model=32, d_ff=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=3),
        dict(
            d_model=48,
            d_ff=80,
            num_heads=6,
            num_encoder_layers=3,
            num_decoder_layers=1,
            activation="swiglu",
            share_embeddings="none",
            positions="learned",
            max_len=40,
        ),
        dict(
            d_model=64,
            d_ff=96,
            num_heads=2,
            num_encoder_layers=1,
            num_decoder_layers=2,
            activation="geglu",
            share_embeddings="target",
            positions="relative",
            norm="post",
            relpos_buckets=16,
        ),
        dict(
            d_model=16,
            d_ff=32,
            num_heads=2,
            num_encoder_layers=2,
            num_decoder_layers=2,
            positions="rope",
        ),
    ],
)
def test_counts_equal_the_formulas(changes):
    config = ModelConfig(vocab_size=123, **changes)
    counts = parameter_counts(abstract_model(config))
    assert list(counts) == list(COMPONENTS)
    assert {k: (c.weights, c.biases) for k, c in counts.items()} == formula(config)


def test_one_layer_of_the_base_model_is_the_papers_table():
    config = ModelConfig(
        vocab_size=10,
        d_model=512,
        d_ff=2048,
        num_heads=8,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    counts = parameter_counts(abstract_model(config))
    assert counts["encoder attention"].weights == 4 * 512**2 == 1_048_576  # ≈ 1.05M
    assert counts["encoder FFN"].weights == 2 * 512 * 2048 == 2_097_152  # ≈ 2.10M
    assert (
        counts["encoder attention"].biases == 4 * 512 and counts["encoder FFN"].biases == 2048 + 512
    )


def preset(name: str):
    config = load_config(CONFIGS / f"{name}.yaml")
    return config, replace(config.model, vocab_size=config.tokenizer.vocab_size)


@pytest.mark.parametrize(
    "name,d,f,h,drop,paper,rel",
    [
        ("transformer_base", 512, 2048, 8, 0.1, 65e6, 0.05),
        ("transformer_big", 1024, 4096, 16, 0.3, 213e6, 0.01),
    ],
)
def test_presets_load_build_and_match_the_paper(name, d, f, h, drop, paper, rel):
    config, model_config = preset(name)
    m = config.model
    assert (m.d_model, m.d_ff, m.num_heads, m.num_encoder_layers, m.num_decoder_layers) == (
        d,
        f,
        h,
        6,
        6,
    )
    assert (m.dropout_rate, m.norm, m.positions, m.share_embeddings) == (
        drop,
        "post",
        "sinusoidal",
        "all",
    )
    assert (config.tokenizer.vocab_size, config.tokenizer.model_type) == (37000, "bpe")
    assert (config.data.src_lang, config.data.tgt_lang) == ("en", "de")
    for split in (config.data.train, config.data.dev, config.data.test):
        assert (split.format, split.path, split.name) == ("hub", "wmt14", "de-en")
    model = abstract_model(model_config)  # nnx.eval_shape: shapes only, nothing allocated
    leaves = jax.tree.leaves(model)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    counts = parameter_counts(model)
    total = sum(c.total for c in counts.values())
    assert total == sum(w + b for w, b in formula(model_config).values())
    # the paper rounds: base 63.1M here vs "65M", big 214.2M vs "213M" (one 37k vocabulary
    # cannot give both: base would need ~40.7k tokens, big ~35.8k)
    assert abs(total - paper) / paper < rel


def test_params_command_prints_the_report(capsys):
    assert cli.params_main(["--config", str(CONFIGS / "transformer_base.yaml")]) == 0
    out = capsys.readouterr().out
    assert "vocab 37000" in out and "norm post" in out
    assert "1,048,576" in out and "2,097,152" in out  # per-layer attention and FFN weights
    assert "63,082,496" in out  # total
    assert (
        cli.params_main(
            [
                "--config",
                str(CONFIGS / "transformer_base.yaml"),
                "model.positions=learned",
                "model.max_len=100",
            ]
        )
        == 0
    )
    assert "102,400" in capsys.readouterr().out  # 2 tables × 100 × 512
    assert cli.params_main(["model.positions=bogus"]) == 2
    assert "model.positions" in capsys.readouterr().err


def test_logits_bias_counts_as_output_biases():
    base = ModelConfig(
        vocab_size=50,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    plain = parameter_counts(abstract_model(base))
    biased = parameter_counts(abstract_model(replace(base, logits_bias=True)))
    assert biased["embeddings"].biases - plain["embeddings"].biases == 50
    assert biased["embeddings"].weights == plain["embeddings"].weights
