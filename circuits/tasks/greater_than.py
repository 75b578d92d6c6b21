"""The greater-than task (Hanna et al. 2023): "The war lasted from 1732 to 17" -> a year above 32."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .construct import task_from_texts, task_rng
from .task import Task
from .validation import TaskValidationError

GT_NOUNS = ("war", "expedition", "siege", "drought", "famine", "pandemic", "reign", "voyage",
            "journey", "blockade", "strike", "rebellion")


def greater_than_task(
    tokenizer,
    n: int = 100,
    seed: int = 0,
    nouns: Sequence[str] = GT_NOUNS,
    template: str = "The {noun} lasted from 17{yy} to 17",
    century: str = "17",
    corrupt_yy: str = "01",
    prepend_bos: bool = True,
    metric: str | Callable = "prob_diff",
    metric_kwargs: dict | None = None,
) -> Task:
    """Greater-than (Hanna et al. 2023): "The war lasted from 1732 to 17" -> a year above 32.

    YY is drawn from the years 02..98 whose "17YY" tokenizes as ["17", "YY"]; the corrupted prompt
    uses YY = ``corrupt_yy``. Metric: probability difference over the two-digit year tokens,
    sum p(YY' > YY) - sum p(YY' <= YY). answer = YY+1, wrong answer = YY (for logit-difference
    use). group = noun id. Needs all "00".."99" to be single tokens (true for GPT-2).
    """
    if tokenizer is None:
        raise TaskValidationError("greater-than: pass the model's tokenizer")
    years = [tokenizer.encode(f"{k:02d}") for k in range(100)]
    not_single = [f"{k:02d}" for k, ids in enumerate(years) if len(ids) != 1]
    if not_single:
        raise TaskValidationError(
            f"greater-than: {len(not_single)} of the two-digit numbers are not single tokens in tokenizer "
            f"{getattr(tokenizer, 'name', '?')!r} (e.g. {not_single[:5]}); the task needs a GPT-2-like "
            "tokenizer (use 'gpt2')"
        )
    year_ids = [ids[0] for ids in years]

    valid = [(noun, yy) for noun in nouns for yy in range(2, 99)
             if _gt_split(tokenizer, template, noun, f"{yy:02d}", year_ids, century)]
    bad_nouns = [noun for noun in nouns if not _gt_split(tokenizer, template, noun, corrupt_yy, year_ids, century)]
    if bad_nouns or not valid:
        raise TaskValidationError(
            f"greater-than: in tokenizer {getattr(tokenizer, 'name', '?')!r} the template {template!r} does not "
            f"split '{century}YY' into ['{century}', 'YY'] for nouns {bad_nouns or list(nouns)}; "
            "change the template or the nouns"
        )
    rng = task_rng(seed, 0x67)
    pick = rng.choice(len(valid), size=n, replace=len(valid) < n)
    clean, corr, ans, wrong, grp, yys = [], [], [], [], [], []
    for j in pick:
        noun, yy = valid[int(j)]
        clean.append(template.format(noun=noun, yy=f"{yy:02d}"))
        corr.append(template.format(noun=noun, yy=corrupt_yy))
        ans.append(year_ids[yy + 1])
        wrong.append(year_ids[yy])
        grp.append(list(nouns).index(noun))
        yys.append(yy)
    ks = torch.arange(100).unsqueeze(0)
    thr = torch.as_tensor(yys).unsqueeze(1)
    return task_from_texts(
        "greater-than", tokenizer, clean, corr, ans, wrong, group=grp, prepend_bos=prepend_bos,
        metric=metric, metric_kwargs=dict(metric_kwargs or {}),
        candidates=torch.as_tensor(year_ids), good=ks > thr, bad=ks <= thr,
        meta={"seed": seed, "template": template, "corrupt_yy": corrupt_yy, "years": yys},
    )


def _gt_split(tokenizer, template: str, noun: str, yy: str, year_ids: list[int], century: str = "17") -> bool:
    """True if the prompt ends in [..., century, YY, ..., century] with YY one token."""
    text = template.format(noun=noun, yy=yy)
    head = text.split(century + yy, 1)[0]
    ids = tokenizer.encode(text)
    head_ids = tokenizer.encode(head + century)
    if len(head_ids) < 1 or ids[: len(head_ids)] != head_ids:
        return False
    return len(ids) > len(head_ids) and ids[len(head_ids)] == year_ids[int(yy)] and \
        tokenizer.decode(ids[-1:]).strip() == century

