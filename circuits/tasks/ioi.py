"""The indirect-object identification task (Wang et al. 2022) from name templates."""

from __future__ import annotations

from typing import Callable, Sequence

from .construct import task_from_texts, task_rng
from .task import Task
from .validation import TaskValidationError

# Wang et al. (2022) style templates; [A] = indirect object (answer), [B] = subject (wrong answer).
IOI_TEMPLATES: tuple[str, ...] = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to",
)
IOI_NAMES: tuple[str, ...] = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel",
    "David", "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin", "Sarah",
    "William", "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather", "Eric",
    "Elizabeth", "Adam", "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy", "Christina", "Kyle",
    "Rachel", "Laura", "Lauren", "Amber", "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy",
    "Crystal", "Michelle", "Tiffany", "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca",
    "Jacob", "Stephen", "Patrick", "Sean", "Erin", "Zachary", "Jamie", "Kelly", "Samantha", "Nathan",
    "Sara", "Dustin", "Paul", "Angela", "Tyler", "Scott", "Katherine", "Andrea", "Gregory", "Erica",
    "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen", "Jose", "Alexander", "Jesse",
    "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine", "Alicia", "Cody", "Allison",
    "Bradley", "Samuel",
)
IOI_PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
IOI_OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
_MIN_IOI_NAMES = 5


def _fill(template: str, names: dict[str, list[str]], place: str, obj: str) -> str:
    """Replace placeholders; ``names[key]`` lists successive fillers for repeated placeholders."""
    out = template.replace("[PLACE]", place).replace("[OBJECT]", obj)
    for key, fillers in names.items():
        for f in fillers:
            out = out.replace(f"[{key}]", f, 1)
        out = out.replace(f"[{key}]", fillers[-1])
    return out


def ioi_task(
    tokenizer,
    n: int = 100,
    seed: int = 0,
    templates: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    places: Sequence[str] = IOI_PLACES,
    objects: Sequence[str] = IOI_OBJECTS,
    corrupt: str = "abc",
    prepend_bos: bool = True,
    metric: str | Callable = "logit_diff",
    metric_kwargs: dict | None = None,
) -> Task:
    """Indirect-object identification (Wang et al. 2022): "When Mary and John went to the store,
    John gave a drink to" -> " Mary" (answer = indirect object, wrong answer = subject).

    Half of the examples use the ABBA order, half BABA. ``corrupt="abc"`` replaces the three name
    slots (IO, S1, S2) by three other distinct names; ``corrupt="abb"`` replaces IO and both
    subject mentions by two new names, keeping the repetition. Names are those of ``names`` that
    are single tokens (with a leading space) in the tokenizer; group = template id.
    """
    if tokenizer is None:
        raise TaskValidationError("ioi: pass the model's tokenizer")
    if corrupt not in ("abc", "abb"):
        raise TaskValidationError(f"ioi: corrupt must be 'abc' or 'abb', got {corrupt!r}")
    templates = list(templates or IOI_TEMPLATES)
    for t in templates:
        if "[A]" not in t or "[B]" not in t or t.count("[B]") < 2:
            raise TaskValidationError(f"ioi template {t!r} needs one [A] and two [B] placeholders")
    candidates = list(names or IOI_NAMES)
    single = [nm for nm in candidates if len(tokenizer.encode(" " + nm)) == 1]
    if len(single) < _MIN_IOI_NAMES:
        raise TaskValidationError(
            f"ioi: only {len(single)} of {len(candidates)} names are single tokens (with a leading space) in "
            f"tokenizer {getattr(tokenizer, 'name', '?')!r}: {single}; IOI needs at least {_MIN_IOI_NAMES}. "
            "Pass names=[...] that are single tokens, or use a tokenizer trained on English text (e.g. 'gpt2')"
        )
    rng = task_rng(seed, 0x101)
    clean, corr, ans, wrong, grp = [], [], [], [], []
    for i in range(n):
        ti = int(rng.integers(len(templates)))
        t = templates[ti]
        if i % 2 == 1:  # ABBA: IO first
            t = t.replace("[B] and [A]", "[A] and [B]", 1)
        pick = rng.choice(len(single), size=5, replace=False)
        a, b, x, y, z = (" " + single[j] for j in pick)
        place = places[int(rng.integers(len(places)))]
        obj = objects[int(rng.integers(len(objects)))]
        text = _fill(t, {"A": [a.strip()], "B": [b.strip()]}, place, obj)
        if corrupt == "abc":
            ctext = _fill(t, {"A": [x.strip()], "B": [y.strip(), z.strip()]}, place, obj)
        else:
            ctext = _fill(t, {"A": [x.strip()], "B": [y.strip()]}, place, obj)
        clean.append(text)
        corr.append(ctext)
        ans.append(a)
        wrong.append(b)
        grp.append(ti)
    task = task_from_texts("ioi", tokenizer, clean, corr, ans, wrong, group=grp, prepend_bos=prepend_bos,
                           metric=metric, metric_kwargs=dict(metric_kwargs or {}),
                           meta={"seed": seed, "corrupt": corrupt, "n_names": len(single),
                                 "templates": templates})
    return task

