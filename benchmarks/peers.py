"""The PyTorch peers, and what installs them (``PEERS``, ``missing_peers``, ``INSTALL``).

The speed peer of ``benchmarks/compare.py`` and ``benchmarks/profile_step.py`` (``Marian``): a
randomly initialised MarianMT of a preset's sizes and its CTranslate2 conversion, timed at
training and decoding.

The peers of the quality comparison (``benchmarks/compare_quality.py``, issues 21, 35 and 50):
two PyTorch models of our run's sizes on its SentencePiece pieces, their training recipe and
grid points, their trainer, and a beam search with our decoding rules.

Peers (``ARCHS``), each built from our run of the same norm placement (its resolved
``config.yaml``: sizes, activation, embedding sharing, dropout, decoding):

* ``post``: Hugging Face's ``MarianMTModel``, post-norm like ours with ``model.norm=post``
  (no final LayerNorm; sinusoidal positions with the sines and cosines in halves, ours
  interleaved by default; LayerNorm ε 1e-5, ours 1e-6); source, target and output embeddings
  shared (ours' ``share_embeddings: all`` only);
* ``pre``: PyTorch's own ``torch.nn.Transformer(norm_first=True)`` (pre-norm, a final
  LayerNorm per stack, as ours with ``model.norm=pre``) with ours' embedding sharing, √d_model
  scaling and sinusoidal positions (the table ``seq2seq.model.positions.sinusoidal_embedding``
  gives, in ours' layout), embeddings drawn from N(0, d_model^-1/2) as ours, ours' LayerNorm
  ε, and ours' three dropouts (residual at the grid point's rate; attention weights and the
  FFN's hidden activation at ours' ``attention_dropout_rate`` / ``activation_dropout_rate``,
  where ``nn.Transformer`` would use one rate for all three).

Both compute in float32 and count the same trainable parameters as ours (``parameters``):
attention and FFN biases on both sides; Marian's position table is a frozen buffer.

Training (``train_peer``): Adam (0.9, 0.98, eps 1e-9), label smoothing 0.1, the gradient norm
clipped at 1, batches of at most 2,000 padded tokens of similar length (``RECIPE``), the
learning rate of a ``GridPoint``: peak rate, warmup (steps, or ``ours``: our run's warmup
share of its real step count, times the peer's projected steps) and schedule (``rsqrt``:
inverse square root after the warmup; ``linear``: decay to zero at the end the time fixes, as
ours' ``train.time_budget`` fixes it), residual dropout (a rate or ``ours``). ``PLAIN`` is the
plain recipe of issue 21: 1e-3 after 400 warmup steps, inverse square root, dropout 0.1.

Decoding (``peer_translate`` / ``beam_search``): ours' rules (``seq2seq.decoding``'s module
docstring): beam ``decode.beam_size``, ``score = logprob / lp(|Y|)`` with ours' length penalty
form and α (``seq2seq.decoding.length_penalty``), PAD, BOS and the unknown piece banned
(unless ``decode.allow_unk``), at most ``decode.output_limit(|x|)`` tokens with EOS, only EOS
at the limit, fairseq's rule for finished hypotheses and ours' stopping bound. The decoder
recomputes the prefix at every step (no cache): slower, the same numbers.
"""

from __future__ import annotations

import importlib
import math
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

# the packages of the optional extra ``compare`` and how to install them
PEERS = ("torch", "transformers", "ctranslate2")
INSTALL = (
    "pip install 'torch==2.13.*' --index-url https://download.pytorch.org/whl/cpu  "
    "# the CPU build (a plain 'pip install torch' on Linux is a CUDA build of several GB)\n"
    "pip install -e '.[compare]'"
)
ARCHS = {
    "post": "MarianMT (Hugging Face), post-norm",
    "pre": "torch.nn.Transformer(norm_first=True), pre-norm",
}


def missing_peers() -> list[str]:
    """The packages of the ``compare`` extra that do not import."""
    missing = []
    for name in PEERS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


# The peers' shared recipe (issue 21); the grid point sets the rate, warmup, schedule, dropout.
RECIPE = dict(
    learning_rate=1e-3,
    warmup_steps=400,
    max_tokens=2000,
    label_smoothing=0.1,
    dropout=0.1,
    clip=1.0,
    max_len=64,
)
SCHEDULES = ("rsqrt", "linear")
PROBE_STEPS = 10  # forward-backward passes that time the step when a warmup needs projecting
MAX_POSITIONS = 1024  # rows of the pre-norm peer's sinusoid table
NEG_INF = -1.0e9  # as seq2seq.decoding
LOSS_EVERY = 50  # the training loss is kept every this many steps
# ours' model.activation → (Hugging Face's name, PyTorch's function name and options)
ACTIVATIONS = {
    "relu": ("relu", "relu", {}),
    "gelu": ("gelu_new", "gelu", {"approximate": "tanh"}),
    "gelu_erf": ("gelu", "gelu", {}),
    "swish": ("swish", "silu", {}),
}


class GridPoint(NamedTuple):
    """One peer recipe of the grid.

    Attributes:
      learning_rate: the peak rate.
      warmup: linear warmup steps (digits), or ``ours``: our run's real warmup share of the
        peer's projected steps (``warmup_from_share``).
      schedule: ``rsqrt`` (peak · min(n/W, √(W/n)) at update n) or ``linear`` (``linear_rate``).
      dropout: residual dropout, a number or ``ours`` (our run's resolved rate).
    """

    learning_rate: float
    warmup: str
    schedule: str
    dropout: str

    @property
    def name(self) -> str:
        """The point in a file name: ``lr0.001-w400-rsqrt-d0.1``."""
        return f"lr{self.learning_rate:g}-w{self.warmup}-{self.schedule}-d{self.dropout}"

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


PLAIN = GridPoint(1e-3, "400", "rsqrt", "0.1")


def grid_points(
    learning_rates: list[float], warmups: list[str], schedules: list[str], dropout: str
) -> list[GridPoint]:
    """The grid's points in a fixed order (rate, then warmup, then schedule), one dropout."""
    return [
        GridPoint(lr, w, s, dropout) for lr in learning_rates for w in warmups for s in schedules
    ]


# -- the learning rate ---------------------------------------------------------------------------


def rsqrt_rate(count: int, warmup: int) -> float:
    """The multiplier of the peak rate after ``count`` updates: linear warmup over ``warmup``
    updates, then the inverse square root: min(n / W, √(W / n)) with n = count + 1."""
    n, w = count + 1, max(warmup, 1)
    return min(n / w, math.sqrt(w / n))


def linear_rate(count: int, peak: float, warmup: int, horizon: int | None) -> float:
    """The rate after ``count`` updates under ours' ``linear`` schedule
    (``seq2seq.training.step``). With n = count + 1, W = ``warmup`` and T = ``horizon``:
    peak · min(n / W, (T − n + 1) / (T − W + 1)), the decay clipped to [0, 1] — peak / W at the
    first update, peak at the W-th, then linearly down to 0 after the T-th. Before the horizon
    is fixed (None) the rate stays at peak after the warmup."""
    warmup = max(warmup, 1)
    n = count + 1
    if horizon is None:
        decay = 1.0
    else:
        total = max(horizon, warmup)
        decay = min(max((total - n + 1) / (total - warmup + 1), 0.0), 1.0)
    return peak * min(n / warmup, decay)


def warmup_from_share(share: float, probe_steps: int, probe_seconds: float, seconds: float) -> int:
    """A warmup of ``share`` of the updates that fill the rest of ``seconds`` at the speed of
    the ``probe_steps`` timed passes (``probe_seconds``); at least 1."""
    from seq2seq.data.recipe import steps_for_time_budget

    projected = steps_for_time_budget(probe_steps, probe_seconds, 0, 0.0, seconds) - probe_steps
    return max(1, round(share * projected))


def horizon_for_seconds(step: int, seconds_now: float, first_seconds: float, seconds: float) -> int:
    """The ``linear`` schedule's end, fixed after the warmup as ours' ``train.time_budget``
    fixes it: the update count that fills ``seconds`` at the speed of the ``step`` updates made
    since ``first_seconds`` (all times from the start of training, in seconds)."""
    from seq2seq.data.recipe import steps_for_time_budget

    return steps_for_time_budget(step, seconds_now, 0, first_seconds, seconds)


def peer_optimizer(
    model, learning_rate: float | None = None, multiplier: Callable[[int], float] | None = None
):
    """Adam (betas 0.9/0.98, eps 1e-9) at peak ``learning_rate`` (RECIPE's by default) times
    ``multiplier(updates made)``; by default RECIPE's warmup then 1/√step (``rsqrt_rate``)."""
    import torch

    peak = RECIPE["learning_rate"] if learning_rate is None else learning_rate
    opt = torch.optim.Adam(model.parameters(), lr=peak, betas=(0.9, 0.98), eps=1e-9)
    if multiplier is None:
        multiplier = lambda s: rsqrt_rate(s, int(RECIPE["warmup_steps"]))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, multiplier)


# -- the models ----------------------------------------------------------------------------------


def check_peer_config(arch: str, m: Any) -> None:
    """Refuse a model config (ours' ``ModelConfig`` ``m``) the peer ``arch`` cannot match.

    Raises:
      ValueError: the message names the key.
    """
    if m.activation not in ACTIVATIONS:
        raise ValueError(
            f"model.activation={m.activation}: the peers have {', '.join(ACTIVATIONS)} only"
        )
    if m.positions != "sinusoidal":
        raise ValueError(f"model.positions={m.positions}: the peers have sinusoidal positions")
    if arch == "post" and m.share_embeddings != "all":
        raise ValueError(
            f"model.share_embeddings={m.share_embeddings}: MarianMT shares all three matrices"
        )


def _prenorm_class():
    import jax.numpy as jnp
    import numpy as np
    import torch
    import torch.nn.functional as F

    from seq2seq.model.positions import sinusoidal_embedding

    class Prenorm(torch.nn.Module):
        """``torch.nn.Transformer(norm_first=True)`` with ours' embeddings and positions (see
        the module docstring). ``forward(src, dec_in)``: int64 ``[batch, src_len]`` and
        ``[batch, tgt_len]`` → float32 logits ``[batch, tgt_len, vocab]``."""

        def __init__(self, m: Any, vocab: int, dropout: float, pad: int):
            super().__init__()
            check_peer_config("pre", m)
            d = m.d_model
            self.pad = pad
            self.scale = math.sqrt(d) if m.scale_embeddings else 1.0
            self.embed = torch.nn.Embedding(vocab, d)
            torch.nn.init.normal_(self.embed.weight, std=d**-0.5)
            self.target_embed = self.embed
            if m.share_embeddings != "all":
                self.target_embed = torch.nn.Embedding(vocab, d)
                torch.nn.init.normal_(self.target_embed.weight, std=d**-0.5)
            self.output = None
            if m.share_embeddings == "none":
                self.output = torch.nn.Linear(d, vocab, bias=False)
                torch.nn.init.xavier_uniform_(self.output.weight)
            table = sinusoidal_embedding(jnp.arange(MAX_POSITIONS), d, layout=m.sinusoidal_layout)
            self.register_buffer("positions", torch.from_numpy(np.array(table)), persistent=False)
            self.dropout = torch.nn.Dropout(dropout)
            _, fn, options = ACTIVATIONS[m.activation]
            act = getattr(F, fn)
            with warnings.catch_warnings():  # nested tensors are off under norm_first: said once
                warnings.simplefilter("ignore", UserWarning)
                self.transformer = torch.nn.Transformer(
                    d_model=d,
                    nhead=m.num_heads,
                    num_encoder_layers=m.num_encoder_layers,
                    num_decoder_layers=m.num_decoder_layers,
                    dim_feedforward=m.d_ff,
                    dropout=dropout,
                    activation=(lambda x: act(x, **options)) if options else act,
                    layer_norm_eps=m.norm_epsilon,
                    batch_first=True,
                    norm_first=True,
                )
            layers = [*self.transformer.encoder.layers, *self.transformer.decoder.layers]
            for layer in layers:  # one rate for all three in nn.Transformer; ours has three
                layer.dropout.p = m.activation_dropout_rate  # the FFN's hidden activation
                layer.self_attn.dropout = m.attention_dropout_rate
                if hasattr(layer, "multihead_attn"):
                    layer.multihead_attn.dropout = m.attention_dropout_rate

        def _embed(self, table, ids):
            if ids.shape[1] > MAX_POSITIONS:
                raise ValueError(f"{ids.shape[1]} positions, the table has {MAX_POSITIONS}")
            return self.dropout(table(ids) * self.scale + self.positions[: ids.shape[1]])

        def encode(self, src):
            """int64 ``[batch, src_len]`` → (float32 ``[batch, src_len, d]``, bool padding)."""
            mask = src == self.pad
            memory = self.transformer.encoder(
                self._embed(self.embed, src), src_key_padding_mask=mask
            )
            return memory, mask

        def decode(self, memory, mask, dec_in, last_only=False):
            """Logits float32 ``[batch, tgt_len, vocab]`` of every decoder position (with
            ``last_only``, ``[batch, 1, vocab]`` of the last one)."""
            t = dec_in.shape[1]
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            h = self.transformer.decoder(
                self._embed(self.target_embed, dec_in),
                memory,
                tgt_mask=causal,
                tgt_is_causal=True,
                memory_key_padding_mask=mask,
            )
            weight = self.target_embed.weight if self.output is None else self.output.weight
            return (h[:, -1:] if last_only else h) @ weight.T

        def forward(self, src, dec_in):
            return self.decode(*self.encode(src), dec_in)

    return Prenorm


def _marian_class():
    import torch

    class Marian(torch.nn.Module):
        """A ``MarianMTModel`` behind the peers' interface (``encode``, ``decode``,
        ``forward(src, dec_in)``); ``model`` is the Hugging Face model itself."""

        def __init__(self, model: Any, pad: int):
            super().__init__()
            self.model, self.pad = model, pad

        def encode(self, src):
            mask = src == self.pad
            out = self.model.model.encoder(input_ids=src, attention_mask=(~mask).long())
            return out.last_hidden_state, mask

        def decode(self, memory, mask, dec_in, last_only=False):
            h = self.model.model.decoder(
                input_ids=dec_in,
                encoder_hidden_states=memory,
                encoder_attention_mask=(~mask).long(),
                use_cache=False,
            ).last_hidden_state
            h = h[:, -1:] if last_only else h
            return self.model.lm_head(h) + self.model.final_logits_bias

        def forward(self, src, dec_in):
            return self.decode(*self.encode(src), dec_in)

    return Marian


def prenorm_peer(m: Any, vocab: int, dropout: float, pad: int):
    """The pre-norm peer (``torch.nn.Transformer(norm_first=True)``) of ours' ``ModelConfig``
    ``m``, random weights.

    Raises:
      ValueError: a setting of ``m`` it cannot match (``check_peer_config``).
    """
    return _prenorm_class()(m, vocab, dropout, pad)


def marian_peer(model: Any, pad: int):
    """``model`` (a ``MarianMTModel``) behind the peers' interface."""
    return _marian_class()(model, pad)


def build_peer(arch: str, m: Any, vocab: int, dropout: float, pad: int, bos: int, eos: int):
    """Peer ``arch`` (``post`` or ``pre``) of ours' ``ModelConfig`` ``m``, random weights (the
    caller seeds torch).

    Raises:
      ValueError: unknown ``arch`` or a setting it cannot match (the key named).
    """
    if arch == "pre":
        return prenorm_peer(m, vocab, dropout, pad)
    if arch != "post":
        raise ValueError(f"unknown peer {arch!r}; choose from {', '.join(ARCHS)}")
    import transformers

    check_peer_config("post", m)
    model = transformers.MarianMTModel(
        transformers.MarianConfig(
            vocab_size=vocab,
            **marian_sizes(m),
            activation_function=ACTIVATIONS[m.activation][0],
            dropout=dropout,
            attention_dropout=m.attention_dropout_rate,
            activation_dropout=m.activation_dropout_rate,
            max_position_embeddings=4 * int(RECIPE["max_len"]),
            scale_embedding=m.scale_embeddings,
            pad_token_id=pad,
            eos_token_id=eos,
            decoder_start_token_id=bos,
            forced_eos_token_id=None,
        )
    )
    return marian_peer(model, pad)


def trainable_parameters(model) -> int:
    """Trainable parameters of a torch module (each shared matrix once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# -- training ------------------------------------------------------------------------------------


def peer_batches(pairs: list[tuple[list[int], list[int]]], max_tokens: int, seed: int | str):
    """Batches of pair indices, rows of similar length, at most ``max_tokens`` padded tokens of
    the longer side per batch; the batch order is shuffled with ``seed``."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = max(len(pairs[i][0]), len(pairs[i][1]))
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def pad_rows(seqs: list[list[int]], pad: int, first: int | None = None):
    """int64 ``[len(seqs), width]`` of the sequences (``first`` prepended), padded with ``pad``."""
    import torch

    width = max(len(s) for s in seqs) + (first is not None)
    out = torch.full((len(seqs), width), pad, dtype=torch.long)
    for r, s in enumerate(seqs):
        s = ([first] if first is not None else []) + s
        out[r, : len(s)] = torch.tensor(s)
    return out


def peer_loss(model, pairs, pad: int, start: int):
    """The label-smoothed cross-entropy of ``pairs`` (source ids, target ids with EOS) under
    teacher forcing from ``start``, without padding; returns it (a scalar tensor) and the
    padded targets (int64 ``[batch, length]``). ``model(src, dec_in)`` gives the logits."""
    import torch.nn.functional as F

    src = pad_rows([s for s, _ in pairs], pad)
    tgt = pad_rows([t for _, t in pairs], pad)
    dec_in = pad_rows([t[:-1] for _, t in pairs], pad, first=start)
    logits = model(src, dec_in)
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        tgt.reshape(-1),
        ignore_index=pad,
        label_smoothing=RECIPE["label_smoothing"],
    )
    return loss, tgt


def peer_update(model, opt, sched, pairs, pad: int, start: int):
    """One optimizer step of the peer on ``pairs`` (``peer_loss``), the gradient norm clipped;
    returns the loss (float) and the padded targets (int64 ``[batch, length]``)."""
    import torch

    loss, tgt = peer_loss(model, pairs, pad, start)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["clip"])
    opt.step()
    sched.step()
    return loss.item(), tgt


class PeerSetup(NamedTuple):
    """What a peer takes from our run of the same proxy, seed and norm placement.

    Attributes:
      config: ours' resolved ``Config`` (sizes, activation, sharing, dropout, decoding).
      tokenizer: its SentencePiece model file.
      warmup_share: its ``train.warmup_steps`` over its real step count (``test.json``'s
        ``steps``, the count ``train.time_budget`` chose), never the provisional
        ``train.steps``.
    """

    config: Any
    tokenizer: Path
    warmup_share: float


def resolved_dropout(point: GridPoint, setup: PeerSetup) -> float:
    """The point's residual dropout: a number, or ours' resolved rate for ``ours``."""
    if point.dropout == "ours":
        return float(setup.config.model.residual_dropout)
    return float(point.dropout)


def train_peer(
    arch: str,
    setup: PeerSetup,
    train: tuple[list[str], list[str]],
    sources: dict[str, list[str]],
    seconds: float,
    threads: int,
    seed: int,
    point: GridPoint,
) -> dict[str, Any]:
    """Train peer ``arch`` of our run's sizes on its SentencePiece pieces for ``seconds`` with
    ``point``'s recipe (seed ``seed`` for the weights, dropout and batch order) on the aligned
    ``train`` lines (source, target), then translate ``sources`` (split name → source lines;
    the decodes are not counted in the seconds).

    Training stops at the step that crosses ``seconds``, or under ``linear`` at the end fixed
    after the warmup, whichever comes first. A warmup of ``ours`` times ``PROBE_STEPS``
    forward and backward passes without an update first (their seconds count).

    Returns:
      ``train_seconds``, ``steps``, ``warmup_steps``, ``horizon`` (``linear``: the fixed end,
      None before it was fixed), ``dropout``, ``parameters`` (trainable), ``losses`` ([step,
      loss] every ``LOSS_EVERY`` steps), ``target_tokens_seen``, ``decode_seconds`` and
      ``hyps`` (split name → one translation per source line).
    """
    import sentencepiece as spm
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = setup.config
    sp = spm.SentencePieceProcessor(model_file=str(setup.tokenizer))
    pad, bos, eos = sp.pad_id(), sp.bos_id(), sp.eos_id()
    limit = int(RECIPE["max_len"])

    def encode(lines):
        return [sp.encode(s)[: limit - 1] + [eos] for s in lines]

    pairs = list(zip(encode(train[0]), encode(train[1])))
    dropout = resolved_dropout(point, setup)
    model = build_peer(arch, cfg.model, sp.get_piece_size(), dropout, pad, bos, eos)
    model.train()
    start = time.perf_counter()
    elapsed = lambda: time.perf_counter() - start
    plan: dict[str, Any] = {"warmup": 0, "horizon": None, "first": 0.0}
    if point.warmup == "ours":  # time the step without updating, then fix the warmup
        probe = peer_batches(pairs, int(RECIPE["max_tokens"]), f"{seed}:probe")[:PROBE_STEPS]
        for batch in probe:
            loss, _ = peer_loss(model, [pairs[i] for i in batch], pad, bos)
            loss.backward()
            model.zero_grad(set_to_none=True)
        plan["first"] = elapsed()
        plan["warmup"] = warmup_from_share(setup.warmup_share, len(probe), plan["first"], seconds)
    else:
        plan["warmup"] = int(point.warmup)
    if point.schedule == "linear":
        multiplier = lambda s: linear_rate(s, 1.0, plan["warmup"], plan["horizon"])
    else:
        multiplier = lambda s: rsqrt_rate(s, plan["warmup"])
    opt, sched = peer_optimizer(model, point.learning_rate, multiplier)

    steps, epoch, tokens, done = 0, 0, 0, False
    losses: list[list[float]] = []
    while not done:
        for batch in peer_batches(pairs, int(RECIPE["max_tokens"]), f"{seed}:{epoch}"):
            loss, tgt = peer_update(model, opt, sched, [pairs[i] for i in batch], pad, bos)
            steps, tokens = steps + 1, tokens + int((tgt != pad).sum())
            if steps % LOSS_EVERY == 0:
                losses.append([steps, round(loss, 4)])
                print(f"  peer-{arch} step {steps}: loss {loss:.3f}", flush=True)
            if point.schedule == "linear" and steps == plan["warmup"]:
                plan["horizon"] = horizon_for_seconds(steps, elapsed(), plan["first"], seconds)
                print(f"  peer-{arch}: {plan['horizon']} steps fill {seconds:.0f} s", flush=True)
            done = elapsed() >= seconds or (
                plan["horizon"] is not None and steps >= plan["horizon"]
            )
            if done:
                break
        epoch += 1
    train_seconds = elapsed()

    model.eval()
    t0 = time.perf_counter()
    hyps = {split: peer_translate(model, sp, lines, cfg.decode) for split, lines in sources.items()}
    return {
        "train_seconds": train_seconds,
        "steps": steps,
        "warmup_steps": plan["warmup"],
        "horizon": plan["horizon"],
        "dropout": dropout,
        "parameters": trainable_parameters(model),
        "losses": losses,
        "target_tokens_seen": tokens,
        "decode_seconds": time.perf_counter() - t0,
        "hyps": hyps,
    }


# -- decoding ------------------------------------------------------------------------------------


def beam_search(
    model,
    src,
    limits: list[int],
    *,
    beam: int,
    penalty,
    bos: int,
    eos: int,
    banned: list[int],
) -> list[list[int]]:
    """The best hypothesis of each source row under ours' beam search rules (module
    docstring; the search of ``seq2seq.decoding.beam_search``, without a cache).

    Args:
      model: a peer (``encode(src)`` → memory and padding mask; ``decode(memory, mask,
        dec_in)`` → float32 logits ``[rows, length, vocab]``).
      src: int64 ``[batch, src_len]`` source ids ending in EOS, padded.
      limits: per row, the most tokens |Y| may have, EOS included (≥ 1).
      beam: hypotheses kept per sentence.
      penalty: float ``[n]`` with lp(|Y|) at index |Y| for |Y| ≤ max(limits).
      bos / eos: the decoder's start and end ids; ``banned``: ids never generated.

    Returns:
      Per row, its best finished hypothesis's tokens (EOS included).
    """
    import torch

    b, k = src.shape[0], beam
    with torch.no_grad():
        memory, mask = model.encode(src)
        memory = memory.repeat_interleave(k, 0)  # [b·k, src_len, d]
        mask = mask.repeat_interleave(k, 0)
        longest = max(limits)
        max_lengths = torch.tensor(limits)  # [b]
        lp = torch.as_tensor(penalty, dtype=torch.float32)
        lp_max = lp[max_lengths]  # [b]
        alive_seq = torch.zeros((b, k, longest), dtype=torch.long)
        alive_logp = torch.full((b, k), NEG_INF)
        alive_logp[:, 0] = 0.0
        fin_seq = torch.zeros((b, k, longest), dtype=torch.long)
        fin_score = torch.full((b, k), NEG_INF)
        fin_len = torch.zeros((b, k), dtype=torch.long)
        special = torch.zeros(0, dtype=torch.bool)
        for i in range(longest):
            done = (fin_score[:, -1] >= alive_logp[:, 0] / lp_max) | (
                alive_logp[:, 0] <= NEG_INF / 2
            )
            if bool(done.all()):
                break
            prefix = torch.cat(
                [torch.full((b * k, 1), bos), alive_seq[:, :, :i].reshape(b * k, i)], dim=1
            )  # [b·k, i + 1]
            logits = model.decode(memory, mask, prefix, last_only=True)[
                :, -1
            ].float()  # [b·k, vocab]
            logp = torch.log_softmax(logits, dim=-1).view(b, k, -1)  # [b, k, vocab]
            vocab = logp.shape[-1]
            if special.numel() != vocab:
                special = torch.zeros(vocab, dtype=torch.bool)
                special[[t for t in banned if 0 <= t < vocab]] = True
            last = (i + 1 >= max_lengths)[:, None]  # [b, 1]
            is_eos = torch.arange(vocab) == eos
            ban = special[None, :] | (last & ~is_eos[None, :])  # [b, vocab]
            logp = logp.masked_fill(ban[:, None, :], NEG_INF)
            cand = (alive_logp[:, :, None] + logp).view(b, k * vocab)  # [b, k·vocab]
            # the 2k best, ties in index order (lower beam, then lower token), as lax.top_k
            order = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, : 2 * k]
            top_logp = cand.gather(1, order)  # [b, 2k]
            src_beam, tok = order // vocab, order % vocab
            seqs = alive_seq.gather(1, src_beam[:, :, None].expand(b, 2 * k, longest)).clone()
            seqs[:, :, i] = tok  # [b, 2k, longest]
            valid = top_logp > NEG_INF / 2
            ends = (tok == eos) & valid & (torch.arange(2 * k) < k)[None, :]
            new_score = torch.where(ends, top_logp / lp[i + 1], torch.full_like(top_logp, NEG_INF))
            all_score = torch.cat([fin_score, new_score], dim=1)  # [b, 3k]
            pick = torch.sort(all_score, dim=1, descending=True, stable=True).indices[:, :k]
            fin_score = all_score.gather(1, pick)
            both = torch.cat([fin_seq, seqs], dim=1)
            fin_seq = both.gather(1, pick[:, :, None].expand(b, k, longest))
            lengths = torch.where(ends, torch.full_like(tok, i + 1), torch.zeros_like(tok))
            fin_len = torch.cat([fin_len, lengths], dim=1).gather(1, pick)
            alive_cand = top_logp.masked_fill(tok == eos, NEG_INF)
            keep = torch.sort(alive_cand, dim=1, descending=True, stable=True).indices[:, :k]
            alive_logp = alive_cand.gather(1, keep)
            alive_seq = seqs.gather(1, keep[:, :, None].expand(b, k, longest))
    return [fin_seq[r, 0, : int(fin_len[r, 0])].tolist() for r in range(b)]


def peer_translate(model, sp, sources: list[str], decode: Any, sentences: int = 32) -> list[str]:
    """``sources`` translated by the peer with ``beam_search`` under ours' ``DecodeConfig``
    ``decode`` (beam size, length penalty form and α, ``output_limit``, ``allow_unk``), in
    batches of at most ``sentences`` sentences of similar length. Sources are cut to
    ``RECIPE["max_len"]`` tokens with EOS, as in training."""
    import jax.numpy as jnp
    import numpy as np

    from seq2seq.decoding import length_penalty

    pad, bos, eos, unk = sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()
    ids = [sp.encode(s)[: int(RECIPE["max_len"]) - 1] + [eos] for s in sources]
    limits = [max(1, decode.output_limit(len(x))) for x in ids]
    penalty = np.array(  # lp(|Y|) at index |Y|, the package's formula
        length_penalty(jnp.arange(max(limits, default=1) + 1), decode.alpha, decode.length_penalty),
        dtype=np.float32,
    )
    banned = [t for t in (pad, bos) + (() if decode.allow_unk else (unk,)) if t >= 0]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    hyps = [""] * len(ids)
    for at in range(0, len(order), sentences):
        chunk = order[at : at + sentences]
        best = beam_search(
            model,
            pad_rows([ids[i] for i in chunk], pad),
            [limits[i] for i in chunk],
            beam=decode.beam_size,
            penalty=penalty,
            bos=bos,
            eos=eos,
            banned=banned,
        )
        for i, row in zip(chunk, best):
            hyps[i] = sp.decode([t for t in row if t != eos])
    return hyps


# -- the speed peer (compare.py, profile_step.py) -------------------------------------------------


class MarianSizes(TypedDict):
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int


def marian_sizes(m: Any) -> MarianSizes:
    """``transformers.MarianConfig``'s size fields for our ``ModelConfig`` ``m`` (our encoder
    and decoder share the head count and d_ff)."""
    return MarianSizes(
        d_model=m.d_model,
        encoder_layers=m.num_encoder_layers,
        decoder_layers=m.num_decoder_layers,
        encoder_attention_heads=m.num_heads,
        decoder_attention_heads=m.num_heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
    )


class Marian:
    """A randomly initialised MarianMT of a preset's sizes, and its CTranslate2 conversion.

    Token ids are ours (random tokens ≥ ``FIRST_TOKEN``), with Marian's specials: EOS = 0,
    UNK = 1, and PAD = ``vocab`` as the last row (also the decoder start, as in Marian models).

    Args:
      spec: a preset as ``Bench.fixed`` gives it (``model`` a ``ModelConfig``, ``train`` a
        ``TrainConfig``).
      directory: where the Hugging Face model and its conversion are written.
      threads: CTranslate2's intra-op threads.
    """

    def __init__(self, spec: dict[str, Any], directory: Path, threads: int):
        import ctranslate2
        import torch
        import transformers
        from tokenizers import Tokenizer, models

        m, train_cfg = spec["model"], spec["train"]
        self.vocab, self.train_cfg = m.vocab_size, train_cfg
        self.pad = self.vocab
        config = transformers.MarianConfig(
            vocab_size=self.vocab + 1,
            **marian_sizes(m),
            activation_function=ACTIVATIONS[m.activation][0],  # ours' name → Hugging Face's
            dropout=m.dropout_rate,
            attention_dropout=m.attention_dropout_rate,
            activation_dropout=m.activation_dropout_rate,
            max_position_embeddings=m.max_len,
            scale_embedding=True,
            pad_token_id=self.pad,
            eos_token_id=0,
            decoder_start_token_id=self.pad,
            forced_eos_token_id=0,
        )
        torch.manual_seed(train_cfg.seed)
        self.model = transformers.MarianMTModel(config)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=train_cfg.learning_rate,
            betas=(train_cfg.b1, train_cfg.b2),
            eps=train_cfg.eps,
            weight_decay=train_cfg.weight_decay,
        )
        # A word-level tokenizer over the ids, saved beside the model: the converter reads the
        # vocabulary and the special tokens from it.
        self.tokens = ["</s>", "<unk>"] + [f"t{i}" for i in range(2, self.vocab)] + ["<pad>"]
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(
                models.WordLevel({t: i for i, t in enumerate(self.tokens)}, unk_token="<unk>")
            ),
            eos_token="</s>",
            unk_token="<unk>",
            pad_token="<pad>",
        )
        hf_dir, ct2_dir = directory / "marian", directory / "ctranslate2"
        self.model.save_pretrained(hf_dir)
        tokenizer.save_pretrained(hf_dir)
        ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(ct2_dir), force=True)
        self.translators = {
            f"ct2_{kind}": ctranslate2.Translator(
                str(ct2_dir),
                device="cpu",
                compute_type=kind,
                intra_threads=threads,
                inter_threads=1,
            )
            for kind in ("float32", "int8")
        }

    def ids(self, ours):
        """Our int32 token array as Marian's int64 ids (our EOS → Marian's EOS 0)."""
        import torch

        from seq2seq.data.tokenizer import EOS_ID

        return torch.from_numpy(ours).long().masked_fill(torch.from_numpy(ours == EOS_ID), 0)

    @staticmethod
    def autocast(precision: str):
        """PyTorch's mixed precision for ``precision`` (a no-op context for float32)."""
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16")

    def train_seconds(self, batches: list[dict], warmup: int, precision: str) -> list[float]:
        """Seconds of each training step on ``batches`` after the first ``warmup``; the forward
        pass and the loss under ``autocast(precision)``, as PyTorch's AMP recipe does."""
        import torch
        import torch.nn.functional as F

        self.model.train()
        times = []
        for i, batch in enumerate(batches):
            src, tgt = self.ids(batch["src"]), self.ids(batch["tgt"])
            start = torch.full_like(tgt[:, :1], self.pad)
            t = time.perf_counter()
            with self.autocast(precision):
                logits = self.model(
                    input_ids=src,
                    attention_mask=torch.ones_like(src),
                    decoder_input_ids=torch.cat([start, tgt[:, :-1]], 1),
                ).logits
                loss = F.cross_entropy(
                    logits.flatten(0, 1).float(),
                    tgt.flatten(),
                    label_smoothing=self.train_cfg.label_smoothing,
                )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.clip_norm)
            self.optimizer.step()
            if i >= warmup:
                times.append(time.perf_counter() - t)
        return times

    def decode_seconds(
        self, system: str, src, beam: int, repeats: int, precision: str
    ) -> list[float]:
        """Seconds of each of ``repeats`` calls (after an untimed one) decoding ``src``
        (int32 ``[n, length]``, ours) into exactly ``length`` tokens per sentence; PyTorch under
        ``autocast(precision)``."""
        import torch

        length = src.shape[1]
        if system == "pytorch":
            self.model.eval()
            ids = self.ids(src)

            def call():
                with torch.inference_mode(), self.autocast(precision):
                    out = self.model.generate(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        num_beams=beam,
                        do_sample=False,
                        max_new_tokens=length,
                        min_new_tokens=length,
                    )
                assert out.shape[1] == length + 1, out.shape  # the start token + length
        else:
            tokens = [[self.tokens[i] for i in row] for row in self.ids(src).tolist()]
            translator = self.translators[system]

            def call():
                out = translator.translate_batch(
                    tokens, beam_size=beam, max_decoding_length=length, min_decoding_length=length
                )
                assert all(len(r.hypotheses[0]) == length for r in out)

        call()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        return times
