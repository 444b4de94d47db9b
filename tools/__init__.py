"""Operations tools, each run from the repository root as ``python -m tools.NAME [options]``
(its module docstring gives the options):

* ``gpu_check``: the checks that need an accelerator (``tools/gpu_check.sh`` runs it after the
  GPU-marked tests; docs/scaling.md).
* ``load_test``: N concurrent clients against a running ``seq2seq-serve`` (docs/usage.md).
* ``serve_screenshot``: the README's picture of ``seq2seq-serve``'s page, from a run.

``get_tatoeba.sh`` rebuilds the shipped corpus (``--verify`` checks it offline; data/README.md).
"""
