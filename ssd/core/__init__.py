"""The algorithm: AR, SD and SSD over KV caches, for a batch of sequences. It imports torch and the package's leaves
only, and knows nothing of measurement: a caller that times a call hands its loops a clock (``ssd.clock``).

Read in this order: ``verify`` (one round's verdict), ``decoding`` (AR and SD, the ``Verifier``), ``proposers`` (how a
draft is made), ``fan_out`` and ``cache`` (which outcomes SSD predicts, and where it keeps their drafts), ``tree`` (one
forward drafts them all), ``speculation`` (SSD's ``Speculator``), ``round`` (SSD's round, as the verifier runs it in
one process and in the pipeline alike), ``tuning`` and ``theory`` (choosing K and B). Beneath them: ``cached_model`` and
``static_cache`` (a model's KV cache over a batch), ``sampling``, ``trace`` (the records a call returns) and
``latencies`` (the measured pass times the tuner prices its choices on).

One word per concept, in the code as in the docs:

- draft, target: the small and the large model. A ``Draft`` is the K tokens a proposer drafted, with their q rows.
- outcome: a round's (k, t*), k drafted tokens accepted and t* the target's token. Its ``Verdict`` says how it came
  about; ``Verdicts`` is the message that carries a batch's verdicts back to the speculator.
- verify: what the target does to a draft (``Verifier.verify``); check: what ``ssd.checks`` does to a user's input.
- proposer: anything that drafts (``propose``, ``observe``): the draft model, an n-gram lookup, SSD's ``Speculator``.
- speculator: SSD's proposer over a batch; its ``SequenceState`` is one sequence's share (its ``SpeculationCache`` of
  drafts by predicted outcome, its estimates and tuner).
- fan-out F_k: how many candidates the cache holds at position k; the budget B is their sum.
- backup: what drafts after a miss (jit: the draft model now; fast: an n-gram proposal).
- round record: the ``Round`` a loop appends to a row's ``Trace`` (``SSDRound``; the pipeline's PipelineRound adds
  its wait).
- clock: what times a call's phases; ``Unclocked``, the loops' default, times nothing.
"""
