"""The experiments that measure this toolkit and write the docs pages' figures and tables.

Each runs from the repository root as ``python -m benchmarks.NAME [options]`` (its module
docstring gives the options and the page it writes):

* ``benchmark``: training and decoding speed, memory and MFU at fixed presets
  (docs/benchmarks.md); ``--long`` runs ``long_inputs``.
* ``long_inputs``: memory and time of dense against chunked attention on long inputs
  (docs/benchmarks.md).
* ``compare``: ours against Hugging Face MarianMT (PyTorch) and CTranslate2 at equal work;
  ``--quality`` runs ``compare_quality``, translation quality at the same training time.
* ``compare_quality``: that quality comparison (docs/benchmarks.md).
* ``profile_step``: a training step's forward, backward and optimizer phases, ours against
  PyTorch (docs/benchmarks.md).
* ``marian_peer``: a trained Marian checkpoint through ``seq2seq-import`` against ``generate``.
* ``ab_speed``: equal-work training speed of two checkouts, run alternately.
* ``bulk_speed``: bulk translation against plain ``seq2seq-translate``.
* ``comm_cost``: bytes communicated per train step for a few meshes.
* ``data_scale``: the real ``seq2seq-train`` on a synthetic corpus of N pairs.
* ``export_check``: the CTranslate2 export of a run against the run itself.
* ``lora_adapt``, ``lora_memory``: LoRA against full fine-tuning (docs/lora_adaptation.md,
  docs/training.md).
* ``mbr_vs_beam``: MBR decoding against beam search (docs/mbr.md).
* ``plan_shipped``: ``seq2seq-plan --search`` for every shipped config and target
  (docs/scaling.md).
* ``workflows``: back-translation and distillation on the shipped corpus
  (docs/back_translation.md, docs/distillation.md).

Shared by them, never run: ``harness`` (machine description, peak RSS, commands, docs
tables, versions, a synthetic corpus), ``presets`` (the fixed-shape presets and their
measurement), ``peers`` (the PyTorch peers) and ``quality_records`` (the quality comparison's
records and table). No experiment imports another (tests/test_repository.py): one that offers
another's command line runs it as a command. Operations tools (the GPU check, the load test, the
screenshot, the corpus download) are in ``tools/``.
"""
