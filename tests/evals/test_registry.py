"""The task registry: names, suggestions, parameters."""
from __future__ import annotations

import pytest

from kdeval.evals.benchmarks.registry import REGISTRY, expand, get_spec, get_task
from kdeval.evals.tasks.base import EvalError, UnknownTaskError


def test_registry_lists_every_suite():
    assert len([n for n in REGISTRY if n.startswith("longbench.")]) == 21
    assert len([n for n in REGISTRY if n.startswith("ruler.")]) == 13
    assert {"needle", "phonebook", "math500"} <= set(REGISTRY)
    assert get_spec("longbench.lcc").metric == "code_sim_score"
    assert get_spec("ruler.qa_2").metric == "string_match_part"
    assert expand(["ruler", "needle"])[:1] == ["ruler.niah_single_1"] and expand("longbench")[-1] == "longbench.repobench-p"


def test_unknown_name_suggests():
    with pytest.raises(UnknownTaskError, match=r"unknown task 'ruler.niah_singel_1' \(did you mean 'ruler.niah_single_1'"):
        get_task("ruler.niah_singel_1")
    with pytest.raises(UnknownTaskError, match="did you mean 'needle'"):
        expand(["neddle"])


def test_params_are_validated_with_names():
    task = get_task("phonebook", lengths=[1024], num_books=1)
    assert task.params()["lengths"] == [1024]
    with pytest.raises(EvalError, match=r"lenghts: unknown parameter for task 'needle' \(did you mean 'lengths'"):
        get_task("needle", lenghts=[1024])
    with pytest.raises(EvalError, match="subset"):
        get_task("longbench.hotpotqa", subset="x")
    assert "task" not in get_spec("ruler.vt").params() and get_spec("ruler.vt").params()["num_samples"] == 10
