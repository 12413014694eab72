"""The RULER task: one of the 13 configs of RULER's synthetic.yaml, at one or more lengths.

Samples are generated per tokenizer (through a PromptBuilder) so that prompt (chat template
included) + tokens_to_generate fits each target length (see :mod:`kdeval.evals.tasks.synthetic`);
they are deterministic in (task, length, index, seed). Metric: string_match_all, or
string_match_part for qa_1/qa_2; the headline is 100 x the mean, per length and overall.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from kdeval.evals.benchmarks.ruler import kvpress_set
from kdeval.evals.benchmarks.ruler.generators import Generated, _vt_text, make_cwe, make_fwe, make_niah, make_vt
from kdeval.evals.benchmarks.ruler.qa import HUB_IDS, LOCAL_FILES, QAPool, load_pool, make_qa
from kdeval.evals.benchmarks.ruler.templates import CONFIGS, TASKS
from kdeval.evals.metrics.string_match import postprocess_pred, string_match_all, string_match_part
from kdeval.evals.tasks.base import EvalError, Sample, ScoreResult, check_choice, check_positive, group_percent
from kdeval.evals.tasks.data import find_data_file
from kdeval.evals.tasks.synthetic import ESSAY_FILE, SyntheticTask, check_lengths, essay_path, essay_words, fit_units


@dataclass
class RulerTask(SyntheticTask):
    """A RULER task.

    Args:
        task: ``niah_single_1`` ... ``niah_multiquery``, ``vt``, ``cwe``, ``fwe``, ``qa_1``, ``qa_2``.
        lengths: target lengths in tokens (prompt + tokens to generate).
        num_samples: samples per length.
        seed: base seed; sample ``i`` at length ``L`` uses its own stream derived from it.
        data_dir: data directory (essays; QA files).
        source: for qa_1/qa_2, ``"local"`` or ``"hub"``; for any task, ``"kvpress"`` (a local copy) or
            ``"kvpress-hub"``: kvpress's RULER evaluation set instead of generated samples
            (:mod:`kdeval.evals.benchmarks.ruler.kvpress_set`).
        verify_data: load (and so check) the essays / QA data now; False for scoring-only use.
    """

    task: str
    lengths: Sequence[int] = (4096,)
    num_samples: int = 10
    seed: int = 42
    data_dir: str | None = None
    source: str = "local"
    verify_data: bool = True
    _essay: list[str] | None = field(default=None, init=False, repr=False)
    _pool: QAPool | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.task not in CONFIGS:
            raise EvalError(f"task: unknown RULER task {self.task!r}; expected one of {', '.join(CONFIGS)}")
        check_positive("num_samples", self.num_samples)
        check_choice("source", self.source, ("local", "hub", *kvpress_set.SOURCES))
        self.lengths = check_lengths(self.lengths)
        self.name = f"ruler.{self.task}"
        self.cfg = CONFIGS[self.task]
        if self.verify_data:
            self._load_data()

    @property
    def from_kvpress(self) -> bool:
        """Whether the samples are kvpress's RULER set's rather than generated."""
        return self.source in kvpress_set.SOURCES

    def _load_data(self) -> None:
        """Load the essay haystack / QA pool this task needs (errors before any model loads)."""
        if self.from_kvpress:
            for length in self.lengths:
                if self.source == "kvpress" and kvpress_set.local_file(self.data_dir, length) is None:
                    kvpress_set.load_rows(self.source, self.data_dir, length)  # raises, naming the file
            return
        if self.cfg.get("type_haystack") == "essay" and self._essay is None:
            self._essay = essay_words(self.data_dir, required=True)
        if self.cfg["task"] == "qa" and self._pool is None:  # TaskUnavailableError (skip) when absent
            self._pool = load_pool(self.cfg["dataset"], self.data_dir, self.source)

    @property
    def tokens_to_generate(self) -> int:
        """RULER's generation length for this task."""
        return TASKS[self.cfg["task"]]["tokens_to_generate"]

    def _generate(self, n: int, length: int, index: int, icl_units: int) -> Generated:
        rng = random.Random(f"{self.seed}/{self.task}/{length}/{index}")
        kind = self.cfg["task"]
        if kind == "niah":
            return make_niah(rng, n, self.cfg, self._essay)
        if kind == "variable_tracking":
            return make_vt(rng, n, self.cfg, icl_units)
        if kind == "common_words_extraction":
            return make_cwe(rng, n, self.cfg, length, self.seed)
        if kind == "freq_words_extraction":
            return make_fwe(rng, n, self.cfg, length, self.tokens_to_generate)
        assert self._pool is not None
        return make_qa(rng, n, self._pool, index)

    def _sample(self, n: int, length: int, index: int, icl_units: int) -> Sample:
        g = self._generate(n, length, index, icl_units)
        return Sample(
            id=f"{self.name}/L{length}/{index}", prefix=g.prefix, suffix=g.suffix, answer_prefix=g.answer_prefix,
            references=tuple(g.outputs), max_new_tokens=self.tokens_to_generate,
            meta={"length": length, "index": index},
        )

    def _icl_units(self, builder: Any, length: int) -> int:
        """Noise units of variable tracking's worked example: ~min(500, length/8) tokens, at least 1."""
        if self.cfg["task"] != "variable_tracking":
            return 0
        budget = min(500, length // 8)
        n = self.cfg["num_hops"] + 1  # the chain needs that many noise lines to sit between
        while n < 64:
            p, s, a, names = _vt_text(random.Random(0), n + 1, self.cfg, icl=True)
            if len(builder.encode(p + s + a + " " + " ".join(names))) > budget:
                break
            n += 1
        return n

    def _min_units(self) -> int:
        """The fewest haystack units a sample of this task can be built from."""
        kind = self.cfg["task"]
        if kind == "common_words_extraction":
            return 10
        if kind == "variable_tracking":
            return self.cfg["num_hops"] + 1
        if kind == "freq_words_extraction":
            return 17  # fewer units round to (almost) no words under the Zipf counts
        if kind == "niah":
            return max(self.cfg["num_needle_k"], self.cfg["num_needle_q"]) * self.cfg["num_needle_v"]
        return 1

    def generation_length(self) -> int:
        return self.tokens_to_generate

    def sample_ids(self) -> list[str]:
        """``num_samples`` ids per length, as :meth:`samples` orders them."""
        if self.from_kvpress:
            return [kvpress_set.sample_id(self.task, length, i) for length in self.lengths
                    for i in range(self.num_samples)]
        return [f"{self.name}/L{length}/{i}" for length in self.lengths for i in range(self.num_samples)]

    def data_files(self) -> list[tuple[str, Any]]:
        if self.from_kvpress:
            return [] if self.source == "kvpress-hub" else [
                (f"kvpress/ruler/{length}", kvpress_set.local_file(self.data_dir, length)) for length in self.lengths]
        if self.cfg.get("type_haystack") == "essay":
            return [(ESSAY_FILE, essay_path(self.data_dir))]
        if self.cfg["task"] == "qa" and self.source == "local":
            rel = LOCAL_FILES[self.cfg["dataset"]]
            return [(rel, find_data_file(self.data_dir, rel))]
        return []

    def data_source(self) -> str:
        if self.from_kvpress:
            return f"kvpress RULER set ({'hub ' + kvpress_set.HUB_ID if self.source == 'kvpress-hub' else 'local copy'})"
        if self.cfg["task"] == "qa":
            return f"hub {HUB_IDS[self.cfg['dataset']]}" if self.source == "hub" else LOCAL_FILES[self.cfg["dataset"]]
        return f"synthetic + essay haystack ({ESSAY_FILE})" if self.cfg.get("type_haystack") == "essay" else "synthetic"

    def samples(self, builder: Any = None) -> list[Sample]:
        """``num_samples`` samples per length, each fitted to its length with ``builder``."""
        builder = self.require_builder(builder)
        self._load_data()
        if self.from_kvpress:
            return [s for length in self.lengths for s in kvpress_set.task_samples(
                kvpress_set.load_rows(self.source, self.data_dir, length), self.task, self.name, length,
                self.num_samples)]
        min_units = self._min_units()
        out = []
        for length in self.lengths:
            icl = self._icl_units(builder, length)
            for i in range(self.num_samples):
                s, _ = fit_units(lambda n: self._sample(n, length, i, icl), builder.count, length, min_units=min_units)
                out.append(s)
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """string_match_all (part for QA) on RULER's cleaned prediction."""
        if not references:
            raise EvalError(f"{self.name}: field 'references' must be a non-empty list")
        fn = string_match_part if self.cfg["task"] == "qa" else string_match_all
        return ScoreResult(score=fn(postprocess_pred(prediction), list(references)))

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """100 x mean score, overall and per length."""
        return {**super().aggregate(rows), "by_length": group_percent(rows, ["length"])}
