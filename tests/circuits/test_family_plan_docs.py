"""docs/families.md's plan tables (issue 43, item 2: they printed FLOPs 10-19% below the code's output for the same
shapes) are regenerated here from the code and compared line by line: every plan block on the page, identified by
its model line (the checkpoint's parameter count) and its header (the --max-memory budget), must equal what
``plan_lines`` prints for that shape at an H100's bf16 peak. ``python tests/circuits/test_family_plan_docs.py``
prints the regenerated blocks for pasting."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from doc_blocks import blocks  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "docs" / "families.md"
RATE = (989.0, "NVIDIA H100 80GB HBM3 dense peak")
H100 = 80 * 2**30
SOURCES = {  # the published shapes, by their checkpoints' parameter counts (tests/circuits/test_checkpoint_parameters.py)
    2_614_341_888: "random:gemma2?hidden_size=2304&intermediate_size=9216&num_hidden_layers=26&num_attention_heads=8"
                   "&num_key_value_heads=4&head_dim=256&vocab_size=256000&max_position_embeddings=8192"
                   "&query_pre_attn_scalar=256&sliding_window=4096",
    8_030_261_248: "random:llama?hidden_size=4096&intermediate_size=14336&num_hidden_layers=32&num_attention_heads=32"
                   "&num_key_value_heads=8&head_dim=128&vocab_size=128256&max_position_embeddings=131072",
    46_702_792_704: "random:mixtral?hidden_size=4096&intermediate_size=14336&num_hidden_layers=32"
                    "&num_attention_heads=32&num_key_value_heads=8&num_local_experts=8&num_experts_per_tok=2"
                    "&head_dim=128&vocab_size=32000&max_position_embeddings=32768",
}


def documented_plans(page: Path = PAGE) -> list[list[str]]:
    """Every plan on ``page``: the lines from a ``plan:`` header to the next blank line, in its code blocks."""
    plans = []
    for block in blocks(page, ("",)):
        for part in block.strip("\n").split("\n\n"):
            if part.startswith("plan: "):
                plans.append(part.splitlines())
    return plans


def regenerate(header: str, model_line: str) -> list[str]:
    """What the code prints for the plan whose first two lines are these: the shape named by the model line's
    parameter count, n prompts and the budget of the header, bf16, batch 16, an H100's peak and memory."""
    from circuitstat.circuits.limits import parse_bytes
    from circuitstat.circuits.skeleton import load_skeleton
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.plan import plan_lines
    from circuitstat.pipelines.plan_fit import Limits, parameters_line, untimed_reason

    params = int(re.match(r"model: ([\d,]+) parameters", model_line).group(1).replace(",", ""))
    n = int(re.match(r"plan: (\d+) examples", header).group(1))
    budget = re.search(r"--max-memory ([\d.]+ [KMGT]iB)", header)
    budget = None if budget is None else parse_bytes(budget.group(1).replace(" ", ""))
    model = load_skeleton(SOURCES[params], allow_large=True).to(dtype=torch.bfloat16)
    task = build_task(model, "induction", n=n, seed=0)
    limits = Limits(float(budget), "--max-memory", None) if budget else Limits(float(H100), "one H100", None)
    lines = plan_lines(model, task, batch_size=16, budget=budget, rate=RATE, limits=limits,
                       untimed=untimed_reason(model), header=(parameters_line(model),))
    return lines[:-1]  # the last line, the columns' legend, is not repeated on the page


def test_the_page_documents_the_three_shapes_plans():
    plans = documented_plans()
    assert len(plans) >= 3
    assert {int(p[1].split()[1].replace(",", "")) for p in plans} == set(SOURCES)


@pytest.mark.parametrize("index", range(len(documented_plans())))
def test_each_documented_plan_is_what_the_code_prints(index):
    doc = documented_plans()[index]
    assert doc == regenerate(doc[0], doc[1])


def test_a_changed_number_on_the_page_fails(tmp_path):
    """Negative control: the page with one FLOPs figure edited no longer matches the code."""
    page = tmp_path / "families.md"
    text = PAGE.read_text()
    first = documented_plans()[0]
    row = next(line for line in first if line.startswith("eap "))
    flops = row.split()[5]
    edited = row.replace(f" {flops} ", f" {float(flops) * 0.85:.3g} ", 1)
    page.write_text(text.replace(row, edited, 1))
    doc = documented_plans(page)[0]
    assert doc != regenerate(doc[0], doc[1])


if __name__ == "__main__":  # print the blocks as the page should show them
    for plan in documented_plans():
        print("\n".join(regenerate(plan[0], plan[1])), end="\n\n")
