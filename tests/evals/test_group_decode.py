"""Cells decoded together (kdeval/evals/task_run/group_decode.py): every registered policy's request, its prompt run alone and
its later tokens decoded in one ragged batch with the other policies' requests, gives exactly what it gives
alone — tokens and every KV figure — under both protocols, chunked and one-shot; what cannot be batched is
answered alone."""
import pytest

from kdeval.baselines import get_policy, policy_names
from kdeval.evals.task_run.generation_jobs import GenerateJob, answer_alone
from kdeval.evals.task_run.group_decode import GroupDecoder, batchable

from kdeval.zoo.loading import load_model

from ..keydiff.helpers import make_engine, prompt

N, L, QUESTION, NEW = 48, 150, 20, 6
FIGURES = ("decode_tokens", "peak_kv_tokens", "kept_tokens", "peak_kv_bytes", "kv_cache_bytes", "prompt_tokens",
           "replayed_steps")
#: decoded alone in place: a re-rotating policy's keys sit at other positions, a head pool is another layout
ALONE = {"sink-rerotate", "finch", "ada", "ada-keydiff", "ada-snapkv", "criticaladakv"}


@pytest.fixture(scope="module")
def lm():
    """Weights large enough that each policy's kept set changes the tokens (the default init gives one token
    over and over); float64, as the batch = alone tests of tests/evals/test_batching.py."""
    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


def one_request(job: GenerateJob):
    """A question loop of one request: yields it, returns its result."""
    return (yield job)


def jobs(lm, chunk: int, protect: int, decode_evict: bool = False, eos=None) -> dict[str, GenerateJob]:
    ids = prompt(L, seed=5)
    return {p: GenerateJob(make_engine(lm.model, get_policy(p), budget=N, chunk_size=chunk), ids, NEW, eos, None,
                           protect, decode_evict, p) for p in policy_names()}


# chunk 4 < NEW: the cache grows after the prompt to hold the decoded tokens (its KV peak is then the decode's)
@pytest.mark.parametrize("chunk,protect", [(4, 0), (16, QUESTION), (L, 0), (L - QUESTION, QUESTION)])
def test_every_policy_decoded_in_a_batch_gives_its_alone_result(lm, chunk, protect):
    # eos: a token keydiff's request emits third, so that some rows stop early
    eos = [answer_alone(one_request(jobs(lm, chunk, protect)["keydiff"])).tokens[0][2]]
    alone = {p: answer_alone(one_request(j)) for p, j in jobs(lm, chunk, protect, eos=eos).items()}
    decoder = GroupDecoder(lm.model, rows_per_batch=8)  # several batches, the last one short
    driven = decoder.drive({p: one_request(j) for p, j in jobs(lm, chunk, protect, eos=eos).items()})
    for p, ref in alone.items():
        got = driven[p].value
        assert got.tokens == ref.tokens, p
        assert {f: getattr(got.stats, f) for f in FIGURES} == {f: getattr(ref.stats, f) for f in FIGURES}, p
        assert driven[p].batched == (set() if p in ALONE or len(ref.tokens[0]) < 2 else {p}), p
    assert sum(len(d.batched) for d in driven.values()) >= 8
    assert len(alone["keydiff"].tokens[0]) == 2  # eos ended it early
    assert len({tuple(r.tokens[0]) for r in alone.values()}) > 3  # the policies' kept sets tell in the tokens


def test_what_evicts_while_decoding_or_takes_one_token_is_answered_alone(lm):
    evicting = jobs(lm, 16, 0, decode_evict=True)["keydiff"]
    assert not batchable(evicting)
    short = jobs(lm, 16, 0)["snapkv"]
    short.max_new_tokens = 1
    assert not batchable(short) and batchable(jobs(lm, 16, 0)["snapkv"])
    first = answer_alone(one_request(jobs(lm, 16, 0)["tova"])).tokens[0][0]
    ends_at_once = jobs(lm, 16, 0, eos=[first])["tova"]  # eos is its first token: nothing left to batch
    driven = GroupDecoder(lm.model).drive({"a": one_request(evicting), "b": one_request(short),
                                           "c": one_request(ends_at_once)})
    assert driven["a"].batched == driven["b"].batched == driven["c"].batched == set()
    assert driven["c"].value.tokens == [[]] and driven["c"].value.stats.decode_tokens == 0
    assert driven["a"].value.tokens == answer_alone(one_request(jobs(lm, 16, 0, decode_evict=True)["keydiff"])).tokens
    assert len(driven["b"].value.tokens[0]) <= 1


def test_a_loop_of_several_requests_is_answered_in_turn_and_its_value_returned(lm):

    def two(policy):
        first = yield jobs(lm, 16, 0)[policy]
        second = yield jobs(lm, L, 0)[policy]
        return first.tokens, second.tokens

    loops = {p: two(p) for p in ("keydiff", "tova", "full")}
    driven = GroupDecoder(lm.model).drive(loops)
    for p in loops:
        assert driven[p].value == answer_alone(two(p))
        assert driven[p].seconds > 0
