"""Batch evaluation of reasoning strategies on datasets (GSM8K, HumanEval), in-process or as Ray tasks.

`python -m reasonray.evals.run` (or `reasonray eval`) is the entry point; docs/evaluation.md is the guide.
"""
