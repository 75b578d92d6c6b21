"""Tasks: clean/corrupted prompt pairs with answers, validated before any model runs.

A :class:`Task` holds, for N examples:

* ``clean`` / ``corrupted``: ``[N, P]`` int64 token ids, right-padded; each pair has the same
  number of real tokens, so one ``attention_mask`` ``[N, P]`` (1 = real token) serves both;
* ``answer`` / ``wrong_answer``: ``[N]`` int64 single-token ids, read at ``last_pos`` (the last
  real token of each prompt);
* ``group``: optional ``[N]`` int64 (template id), for cluster bootstraps;
* ``metric``: a metric name (:mod:`circuitstat.circuits.metrics`) or a user callable;
* optional candidate sets (``candidates [K]``, ``good``/``bad`` ``[N, K]``) for set-valued
  metrics such as greater-than's probability difference;
* ``content_hash``: sha256 over all of the above.

Built-ins (:func:`make_task`): ``induction``, ``ioi``, ``greater-than`` and ``file`` (JSONL, CSV
or Parquet with columns ``clean, corrupted, answer, wrong_answer[, group]``). Bad input raises
:class:`TaskValidationError` naming the rows and the fix.

Modules: :mod:`.task` (the Task object), :mod:`.validation` (the error and value checks),
:mod:`.construct` (tasks from token lists or texts), :mod:`.induction`, :mod:`.ioi`,
:mod:`.greater_than` (the built-in generators), :mod:`.files` (file tasks) and :mod:`.registry`
(``register_task``, ``make_task``).
"""

from __future__ import annotations

from .construct import task_from_texts, task_from_token_lists
from .files import FILE_COLUMNS, file_task
from .greater_than import GT_NOUNS, greater_than_task
from .induction import induction_task
from .ioi import IOI_NAMES, IOI_OBJECTS, IOI_PLACES, IOI_TEMPLATES, ioi_task
from .registry import TASKS, make_task, option_matches, register_task, task_builder, task_option_types, task_options
from .task import Task
from .validation import TaskValidationError, check_int, check_token_ids

__all__ = [
    "Task",
    "TaskValidationError",
    "make_task",
    "register_task",
    "TASKS",
    "induction_task",
    "ioi_task",
    "greater_than_task",
    "file_task",
    "task_from_texts",
    "task_from_token_lists",
    "IOI_TEMPLATES",
    "IOI_NAMES",
    "IOI_PLACES",
    "IOI_OBJECTS",
    "GT_NOUNS",
    "FILE_COLUMNS",
    "check_int",
    "check_token_ids",
    "task_options",
    "task_builder",
    "task_option_types",
    "option_matches",
]
