"""Dataset builders named by the task YAMLs beside this file (`custom_dataset: !function utils.NAME`); the documents
come from `hackable_diffusion.evals.local_tasks`, built from the toolbox's own data, offline."""

import datasets

from hackable_diffusion.evals import local_tasks


def _split(docs):
    return {"test": datasets.Dataset.from_list(docs)}


def shakespeare_next_line(**_):
    return _split(
        local_tasks.next_line_docs(local_tasks.shakespeare_lines(), count=200, context_lines=3, num_choices=4, seed=0)
    )


def shakespeare_perplexity(**_):
    return _split([{"text": s} for s in local_tasks.shakespeare_speeches(100)])


def shakespeare_continuation(**_):
    return _split(local_tasks.shakespeare_continuation_docs(100, seed=0))


def ptb_next_line(**_):
    return _split(
        local_tasks.next_line_docs(local_tasks.ptb_lines("valid"), count=200, context_lines=2, num_choices=4, seed=0)
    )


def ptb_perplexity(**_):
    return _split([{"text": p} for p in local_tasks.ptb_passages("test", 100, 10)])


def sudoku_solve(**_):
    return _split(local_tasks.sudoku_solve_docs(100, (30, 36), seed=7))


def sudoku_process_results(doc, results):
    return local_tasks.sudoku_answer_scores(doc, results[0])
