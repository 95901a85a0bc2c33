"""lm-evaluation-harness tasks (the `lm-eval` library, optional extra `eval`) on a loaded HF model.

Tasks are the harness's own (a name it knows) or YAML task files in a folder given with
`--include` (lm-eval's TaskManager include_path): with local data files (`dataset_path: json`,
`dataset_kwargs: {data_files: ...}`) they run without the hub.
"""

from __future__ import annotations

from pathlib import Path

from flopwise.errors import UserError


def run_tasks(model, tokenizer, tasks: list[str], include: Path | None = None, limit: int | None = None,
              batch_size: int = 4) -> dict:
    """{task: {metric: value}} from lm-eval's `simple_evaluate` on the already loaded `model`."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise UserError("eval --tasks: needs the lm-eval library; install it with `pip install 'flopwise[eval]'`") from None
    if include is not None and not Path(include).is_dir():
        raise UserError(f"eval --include: {include} is not a folder of task YAML files")
    manager = _task_manager(TaskManager, tasks, include)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        where = f" or in {include}" if include else " (add --include FOLDER for local task YAML files)"
        raise UserError(f"eval --tasks: no task named {unknown[0]!r} in lm-eval{where}")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    results = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit,
                              log_samples=False, bootstrap_iters=0)
    return {task: {metric: value for metric, value in scores.items() if metric != "alias"}
            for task, scores in results["results"].items()}


def _task_manager(task_manager, tasks: list[str], include: Path | None):
    """The local folder's tasks alone when they are all it takes (indexing the harness's thousands
    of built-in task files takes minutes on a small CPU), else the built-in ones as well."""
    if include is not None:
        local = task_manager(include_path=str(include), include_defaults=False)
        if all(task in local.all_tasks for task in tasks):
            return local
    return task_manager(include_path=str(include) if include else None)
