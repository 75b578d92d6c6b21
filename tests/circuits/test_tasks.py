import json

import pandas as pd
import pytest
import torch

from circuitstat.core.errors import InputError
from circuitstat.circuits.tasks import (
    Task,
    TaskValidationError,
    file_task,
    greater_than_task,
    induction_task,
    ioi_task,
    make_task,
    task_from_token_lists,
)
from circuitstat.circuits.tokenizers import gpt2_tokenizer, train_bpe


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tokenizer()


@pytest.fixture(scope="module")
def small_tok():
    texts = ["def f(x):\n    return x + 1\n", "import os\nprint(os.path.join('a', 'b'))\n"] * 10
    return train_bpe(texts, vocab_size=300)


ROWS = [
    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupted": "When Alice and Bob went to the store, Carl gave a drink to",
     "answer": " Mary", "wrong_answer": " John", "group": "t1"},
    {"clean": "When Tom and Anna went to the park, Anna gave a ball to",
     "corrupted": "When Mark and Lisa went to the park, Paul gave a ball to",
     "answer": " Tom", "wrong_answer": " Anna", "group": "t1"},
    {"clean": "Then, Sarah and David had lunch. David gave a snack to",
     "corrupted": "Then, Laura and James had lunch. Kevin gave a snack to",
     "answer": " Sarah", "wrong_answer": " David", "group": "t2"},
]


def _write(path, rows, fmt):
    df = pd.DataFrame(rows)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path)
    return path


# --- built-ins -----------------------------------------------------------------------------


def test_induction_structure_any_vocab():
    t = induction_task(vocab_size=50, n=8, seed=3, seq_len=6, bos_id=None)
    assert t.clean.shape == (8, 11) and t.metric_name == "logit_diff"
    a = t.clean[:, :6]
    assert torch.equal(t.clean[:, 6:], a[:, :5])  # second copy repeats the first
    assert torch.equal(t.answer, a[:, 5])
    assert (t.corrupted[:, :6] != a).all()  # first occurrence changed everywhere
    assert torch.equal(t.corrupted[:, 6:], t.clean[:, 6:])
    assert torch.equal(t.wrong_answer, t.corrupted[:, 5])
    assert all(len(set(r.tolist())) == 6 for r in a)  # distinct tokens: unambiguous answer
    one = induction_task(vocab_size=50, n=8, seed=3, seq_len=6, corrupt="answer")
    assert torch.equal(one.corrupted[:, :5], one.clean[:, :5]) and (one.corrupted[:, 5] != one.clean[:, 5]).all()
    assert torch.equal(one.wrong_answer, one.corrupted[:, 5])


def test_induction_with_tokenizer_deterministic(gpt2):
    a = make_task("induction", gpt2, n=10, seed=1)
    b = make_task("induction", gpt2, n=10, seed=1)
    c = make_task("induction", gpt2, n=10, seed=2)
    assert a.content_hash == b.content_hash != c.content_hash
    assert (a.clean[:, 0] == gpt2.bos_id).all()
    assert not (a.clean[:, 1:] == gpt2.eos_id).any()


def test_ioi(gpt2):
    t = ioi_task(gpt2, n=40, seed=0)
    assert len(t) == 40 and t.group is not None and t.group.max() < 15
    for i in range(len(t)):
        real = t.clean[i, : t.lengths[i]].tolist()
        assert real.count(int(t.answer[i])) == 1  # IO once
        assert real.count(int(t.wrong_answer[i])) == 2  # subject twice
        corr = t.corrupted[i, : t.lengths[i]].tolist()
        assert int(t.answer[i]) not in corr and int(t.wrong_answer[i]) not in corr  # ABC: new names
        diff = [k for k in range(len(real)) if real[k] != corr[k]]
        assert len(diff) == 3  # exactly the three name slots
    assert gpt2.decode([int(t.answer[0])]).strip() in t.prompts[0]
    # ABBA and BABA both present
    assert any(p.split(" and ")[0].endswith(gpt2.decode([int(a)]).strip()) for p, a in zip(t.prompts, t.answer))


def test_greater_than(gpt2):
    t = make_task("greater-than", gpt2, n=30, seed=0)
    assert t.metric_name == "prob_diff"
    yy = t.meta["years"]
    for i, y in enumerate(yy):
        assert 2 <= y <= 98
        assert t.prompts[i].endswith(f"17{y:02d} to 17")
        assert t.corrupted_prompts[i].endswith("1701 to 17")
        assert t.good[i].sum() == 99 - y and t.bad[i].sum() == y + 1
        assert gpt2.decode([int(t.answer[i])]) == f"{y + 1:02d}"
    assert (t.clean[:, :1] == gpt2.bos_id).all() and t.candidates.shape == (100,)


def test_builtin_errors_for_small_vocabularies(small_tok):
    with pytest.raises(TaskValidationError, match="names are single tokens"):
        ioi_task(small_tok, n=5)
    with pytest.raises(TaskValidationError, match="two-digit numbers are not single tokens"):
        greater_than_task(small_tok, n=5)
    with pytest.raises(TaskValidationError, match="too few for seq_len"):
        induction_task(vocab_size=10, seq_len=8)
    with pytest.raises(TaskValidationError, match="tokenizer, vocab_size or token_ids"):
        induction_task()
    with pytest.raises(TaskValidationError, match="unknown task"):
        make_task("sorting", small_tok)
    t = make_task("induction", small_tok, n=4, seq_len=10)  # works for any vocabulary
    assert t.clean.max() < small_tok.vocab_size


# --- file tasks ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_file_task_formats(tmp_path, gpt2, fmt):
    t = file_task(_write(tmp_path / f"t.{fmt}", ROWS, fmt), gpt2)
    assert len(t) == 3 and t.group.tolist() == [0, 0, 1]
    assert t.answer.tolist() == [gpt2.encode(r["answer"])[0] for r in ROWS]
    assert (t.lengths == torch.tensor([len(gpt2.encode(r["clean"])) + 1 for r in ROWS])).all()
    assert t.attention_mask[:, -1].tolist() == [1, 0, 0] or t.attention_mask.sum() == t.lengths.sum()
    ref = file_task(_write(tmp_path / "ref.jsonl", ROWS, "jsonl"), gpt2)
    assert t.content_hash == ref.content_hash
    assert make_task(str(tmp_path / f"t.{fmt}"), gpt2).content_hash == t.content_hash


def test_unequal_lengths_names_rows(tmp_path, gpt2):
    rows = [dict(r) for r in ROWS]
    rows[1]["corrupted"] = "When Mark and Lisa went to the big park, Paul gave a ball to"
    with pytest.raises(TaskValidationError) as e:
        file_task(_write(tmp_path / "t.jsonl", rows, "jsonl"), gpt2)
    msg = str(e.value)
    assert "different token lengths" in msg and "rows 2 (counting from 1)" in msg and "row 2:" in msg and "Fix" in msg
    assert "row 1" not in msg and "rows 1 " not in msg  # the file's second row, counted from 1 as it says


def test_answers_not_single_tokens(tmp_path, gpt2):
    rows = [dict(r) for r in ROWS]
    rows[2]["answer"] = " Sarah Connor"
    rows[0]["wrong_answer"] = "Johnathanson"
    with pytest.raises(TaskValidationError, match=r"answer values are not single tokens.*row 3"):
        file_task(_write(tmp_path / "a.jsonl", rows, "jsonl"), gpt2)
    rows[2]["answer"] = " Sarah"
    with pytest.raises(TaskValidationError, match=r"wrong_answer values are not single tokens.*row 1:"):
        file_task(_write(tmp_path / "b.jsonl", rows, "jsonl"), gpt2)


def test_empty_data(tmp_path, gpt2):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(TaskValidationError, match="empty|no rows|missing column"):
        file_task(tmp_path / "e.jsonl", gpt2)
    pd.DataFrame({c: pd.Series([], dtype=str) for c in ["clean", "corrupted", "answer", "wrong_answer"]}).to_csv(
        tmp_path / "e.csv", index=False)
    with pytest.raises(TaskValidationError, match="no rows"):
        file_task(tmp_path / "e.csv", gpt2)
    with pytest.raises(TaskValidationError, match="empty data"):
        task_from_token_lists("x", [], [], [], [])


def test_missing_columns_and_nulls(tmp_path, gpt2):
    rows = [{k: v for k, v in r.items() if k != "wrong_answer"} for r in ROWS]
    with pytest.raises(TaskValidationError, match=r"missing column\(s\) \['wrong_answer'\]"):
        file_task(_write(tmp_path / "m.parquet", rows, "parquet"), gpt2)
    rows = [dict(r) for r in ROWS]
    rows[1]["clean"] = None
    with pytest.raises(TaskValidationError, match=r"rows 2 \(counting from 1\) have empty values"):
        file_task(_write(tmp_path / "n.jsonl", rows, "jsonl"), gpt2)
    with pytest.raises(TaskValidationError, match="does not exist"):
        file_task(tmp_path / "nope.jsonl", gpt2)
    with pytest.raises(TaskValidationError, match="tokenizer"):
        file_task(_write(tmp_path / "ok.jsonl", ROWS, "jsonl"), None)


def test_errors_are_input_errors():
    assert issubclass(TaskValidationError, InputError)


# --- the Task object ------------------------------------------------------------------------


def test_token_list_validation():
    with pytest.raises(TaskValidationError, match=r"rows 2 \(counting from 1\);.*row 2: clean 2 tokens, corrupted 3"):
        task_from_token_lists("x", [[1, 2], [1, 2]], [[1, 3], [1, 3, 4]], [5, 5], [6, 6])
    with pytest.raises(TaskValidationError, match="empty clean or corrupted"):
        task_from_token_lists("x", [[1], []], [[2], []], [5, 5], [6, 6])
    with pytest.raises(TaskValidationError, match="2 clean prompts"):
        task_from_token_lists("x", [[1], [2]], [[2], [1]], [5], [6, 6])


def test_task_structure_checks():
    ok = dict(name="t", clean=[[1, 2, 0]], corrupted=[[1, 3, 0]], attention_mask=[[1, 1, 0]], answer=[1],
              wrong_answer=[2])
    Task(**ok)
    with pytest.raises(TaskValidationError, match="not right-padded"):
        Task(**{**ok, "attention_mask": [[0, 1, 1]]})
    with pytest.raises(TaskValidationError, match="same token length"):
        Task(**{**ok, "corrupted": [[1, 3]]})
    with pytest.raises(TaskValidationError, match="empty"):
        Task(**{**ok, "clean": torch.zeros(0, 3, dtype=torch.long)})
    with pytest.raises(TaskValidationError, match=r"answer has shape"):
        Task(**{**ok, "answer": [1, 2]})


def test_validate_against_model_sizes():
    t = task_from_token_lists("x", [[1, 2, 3], [1, 9]], [[1, 2, 4], [1, 8]], [5, 70], [6, 6])
    t.validate(vocab_size=100, n_ctx=3)
    with pytest.raises(TaskValidationError, match=r"answer ids in rows 2 \(counting from 1\) .* vocabulary size 50"):
        t.validate(vocab_size=50)
    with pytest.raises(TaskValidationError, match=r"rows 1 \(counting from 1\) are longer than the model's context of 2"):
        t.validate(n_ctx=2)

    class Cfg:
        vocab_size, n_ctx = 9, 8

    class M:
        cfg = Cfg()

    with pytest.raises(TaskValidationError, match=r"clean prompts in rows 2 \(counting from 1\)"):
        t.validate(M())


def test_select_batches_hash(gpt2):
    t = make_task("ioi", gpt2, n=10, seed=0)
    sub = t.select([3, 1])
    assert sub.answer.tolist() == [t.answer[3].item(), t.answer[1].item()]
    assert sub.prompts == [t.prompts[3], t.prompts[1]]
    assert sub.content_hash != t.content_hash
    parts = list(t.batches(4))
    assert [len(b) for _, b in parts] == [4, 4, 2]
    assert torch.equal(torch.cat([b.clean for _, b in parts]), t.clean)
    assert make_task("ioi", gpt2, n=10, seed=0, metric="prob_diff").content_hash != t.content_hash
    d = t.describe()
    assert d["n"] == 10 and d["metric"]["name"] == "logit_diff" and d["n_groups"] >= 1
