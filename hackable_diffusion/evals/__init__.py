"""Evaluation beyond the toolbox's own scores: `scoring` (log-likelihoods and generations of (context, continuation)
requests for any text run) and `lm_eval_adapter` (the lm-evaluation-harness model, optional extra `eval`)."""
