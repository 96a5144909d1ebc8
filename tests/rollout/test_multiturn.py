"""Multi-turn rollouts (``grpokit.rollout.multiturn``) on a tiny random Llama with the real SmolLM2
tokenizer and a stub environment whose stop string is "e" (a random model writes one within a few
tokens): transcripts, masks (environment tokens attended to, never trained on), the trainer's
log-probs equal to the sampler's over several turns, per-row seeds across turns, the token budget."""

from __future__ import annotations

import copy

import pytest
import torch

import grpokit.rollout.sampling as sampling
from grpokit.backends import install_backend
from grpokit.envs.base import Observation
from grpokit.experience import Experience
from grpokit.models.logprobs import completion_logprobs
from grpokit.rollout import SamplingParams, generate_rollouts
from grpokit.rollout.multiturn import generate_multiturn
from support.helpers import true_runs

PROMPTS = ["The cat sat on", "A dog ran to", "My hat is on"]
EOS = [2, 0]
G = 2
OBS = " <r>ok</r> "


class StubEnv:
    """Stops a turn at "e"; answers OBS (and its turn number) until ``done_after`` turns; ends at an EOS."""

    def __init__(self, stops=("e",), done_after: int = 99, role=None):
        self.stop_strings, self.done_after, self.role = list(stops), done_after, role
        self.seen: list[tuple[dict, str, bool]] = []

    def start(self, row):
        env, turns = self, []

        class Episode:
            def step(self, turn, *, ended_by_eos):
                env.seen.append((row, turn, ended_by_eos))
                turns.append(turn)
                if ended_by_eos or len(turns) >= env.done_after:
                    return Observation(done=True)
                return Observation(text=OBS, counts={"tool_calls": 1}, role=env.role)

        return Episode()


def _model(tiny_model, backend="plain"):
    model = copy.deepcopy(tiny_model)
    install_backend(model, backend, announce=False)
    return model


def _rows():
    return [{"question": p, "answer": str(i)} for i, p in enumerate(PROMPTS)]


def _multiturn(model, tok, env, params, **kw):
    kw.setdefault("max_turns", 3)
    return generate_multiturn(
        model, tok, PROMPTS, G, params, env=env, rows=_rows(), eos_token_ids=EOS, seed=kw.pop("seed", 11), **kw
    )


@pytest.mark.parametrize("role", [None, "tool"])
def test_a_transcript_holds_the_turns_and_the_environments_tokens(tiny_model, smollm2_tokenizer, role):
    """As plain text, or (role "tool") as a tool message in the chat template: the model's turn
    closed, the message, the assistant's generation prompt, tokenized once."""
    from grpokit.rollout.chat_turns import chat_message_text

    env = StubEnv(role=role)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    exp = _multiturn(_model(tiny_model), smollm2_tokenizer, env, params, max_total_tokens=18 if role is None else 60)
    text = OBS if role is None else chat_message_text(smollm2_tokenizer, role, OBS, after_eos=False)
    obs_ids = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    if role is not None:
        assert obs_ids[0] == smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    counts = exp.env_counts
    assert counts is not None and exp.attention_mask is not None
    multi = 0
    for r in range(len(exp)):
        n = int(exp.attention_mask[r].sum())
        assert bool(exp.attention_mask[r, :n].all()) and not bool(exp.attention_mask[r, n:].any())
        env_pos = (exp.attention_mask[r] & ~exp.completion_mask[r]).nonzero().flatten().tolist()
        turns = true_runs(exp.completion_mask[r])
        assert len(turns) == int(counts["turns"][r]) <= 3
        assert len(env_pos) == int(counts["env_tokens"][r]) == (len(turns) - 1) * len(obs_ids)
        for k in range(len(turns) - 1):  # between two model turns: the observation, tokenized once
            between = exp.completion_ids[r, turns[k][-1] + 1 : turns[k + 1][0]].tolist()
            assert between == obs_ids
        multi += len(turns) > 1
    assert multi >= 3  # the stop string fired in most rows
    for row, turn, _ in env.seen:  # each episode sees its own row: its turns are in its prompt's rows
        b = int(row["answer"])
        assert any(turn.strip() in exp.completions[b * G + g] for g in range(G)), (b, turn)
    # the transcript's text (what rewards read) holds the model's turns and each observation
    for r, text in enumerate(exp.completions):
        assert text.count("<r>ok</r>") >= int(counts["turns"][r]) - 1
    assert all("e" in turn for _, turn, eos in env.seen if not eos)  # a turn stopped at its stop string


@pytest.mark.parametrize("backend", ["plain", "cpu"])
def test_trainer_logprobs_equal_the_samplers_over_turns(tiny_model, smollm2_tokenizer, monkeypatch, backend):
    """Lockstep: each model token's log-prob from the trainer's one teacher-forced pass over
    [prompt ; transcript] equals the sampler's at the turn it was drawn in (a fresh generate call
    per turn, re-reading the environment's tokens as context)."""
    model = _model(tiny_model, backend)
    calls: list[list[torch.Tensor]] = []  # per generate call (= per turn), per decode step: (n_active,)
    real_sample, real_init = sampling.sample_inverse_cdf, sampling.InverseCDFSampler.__init__

    def spy(scores, generator=None, u=None):
        tokens = real_sample(scores, generator, u)
        calls[-1].append(torch.log_softmax(scores.float(), -1).gather(1, tokens[:, None]).squeeze(1))
        return tokens

    def init(self, **kw):
        calls.append([])
        real_init(self, **kw)

    monkeypatch.setattr(sampling, "sample_inverse_cdf", spy)
    monkeypatch.setattr(sampling.InverseCDFSampler, "__init__", init)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    exp = _multiturn(model, smollm2_tokenizer, StubEnv(), params, turn_batching="lockstep")
    with torch.no_grad():
        logp, _ = completion_logprobs(model, exp, temperature=1.0)
    turns = [true_runs(exp.completion_mask[r]) for r in range(len(exp))]
    assert max(len(t) for t in turns) == len(calls) >= 2
    checked = 0
    for k, steps in enumerate(calls):
        active = [r for r in range(len(exp)) if len(turns[r]) > k]  # rows sampled in turn k, in order
        for i, r in enumerate(active):
            for j, pos in enumerate(turns[r][k]):
                torch.testing.assert_close(logp[r, pos], steps[j][i], rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked == int(exp.completion_mask.sum())


@pytest.mark.parametrize("backend", ["plain", "cpu"])
@pytest.mark.parametrize("feed", [1, 4])
def test_trainer_logprobs_equal_the_continuous_loops_over_turns(
    tiny_model, smollm2_tokenizer, monkeypatch, backend, feed
):
    """Continuous turn batching (each row's KV cache kept across its turns, rows resuming at
    different decode steps, finished rows leaving the cache): the trainer's log-prob of each
    model token equals the loop's at the step that drew it, and the tokens are lockstep's. With
    ``FEED_PER_STEP = 4`` a resuming row feeds up to 4 observation tokens in one step, so the
    other rows of that step are left-padded: the padding columns stay out of attention."""
    import grpokit.rollout.continuous as continuous

    monkeypatch.setattr(continuous, "FEED_PER_STEP", feed)
    model = _model(tiny_model, backend)
    drawn: dict[tuple[int, int, int], float] = {}  # (row, turn, token of the turn) -> sampler log-prob
    real = continuous._draw

    def spy(scores, rows, warpers, params):
        tokens = real(scores, rows, warpers, params)
        logp = torch.log_softmax(scores.float(), -1)
        for i, (row, tok) in enumerate(zip(rows, tokens)):
            drawn[row.r, row.turn, len(row.tokens)] = float(logp[i, tok])
        return tokens

    monkeypatch.setattr(continuous, "_draw", spy)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    exp = _multiturn(model, smollm2_tokenizer, StubEnv(), params, turn_batching="continuous")
    with torch.no_grad():
        logp, _ = completion_logprobs(model, exp, temperature=1.0)
    turns = [true_runs(exp.completion_mask[r]) for r in range(len(exp))]
    assert max(len(t) for t in turns) >= 2 and len({len(t) for t in turns}) + len({len(t[0]) for t in turns}) > 2
    want = {
        (r, k, j): float(logp[r, pos])
        for r, t in enumerate(turns)
        for k, run in enumerate(t)
        for j, pos in enumerate(run)
    }
    assert drawn.keys() == want.keys()
    for key, value in want.items():
        assert abs(drawn[key] - value) < 1e-4, key
    ref = _multiturn(_model(tiny_model, backend), smollm2_tokenizer, StubEnv(), params, turn_batching="lockstep")
    assert torch.equal(exp.completion_ids, ref.completion_ids) and torch.equal(exp.completion_mask, ref.completion_mask)
    assert exp.completions == ref.completions and torch.equal(exp.truncated, ref.truncated)


def test_a_rows_turns_depend_on_its_seed_alone(tiny_model, smollm2_tokenizer):
    model, params = _model(tiny_model, "cpu"), SamplingParams(temperature=1.0, max_new_tokens=5)
    whole = _multiturn(model, smollm2_tokenizer, StubEnv(), params)
    for first in range(len(PROMPTS)):
        one = generate_multiturn(
            model,
            smollm2_tokenizer,
            PROMPTS[first : first + 1],
            G,
            params,
            env=StubEnv(),
            rows=_rows()[first : first + 1],
            eos_token_ids=EOS,
            max_turns=3,
            seed=11,
            first_prompt=first,
        )
        for g in range(G):
            r = first * G + g
            n = int(whole.attention_mask[r].sum())
            assert one.completion_ids[g, :n].tolist() == whole.completion_ids[r, :n].tolist()
            assert torch.equal(one.completion_mask[g, :n], whole.completion_mask[r, :n])


def test_without_a_stop_string_it_samples_what_the_single_turn_engine_samples(tiny_model, smollm2_tokenizer):
    model, params = _model(tiny_model, "cpu"), SamplingParams(temperature=1.0, max_new_tokens=6)
    exp = _multiturn(model, smollm2_tokenizer, StubEnv(stops=(), done_after=1), params)
    ref = generate_rollouts(model, smollm2_tokenizer, PROMPTS, G, params, eos_token_ids=EOS, seed=11)
    t = ref.completion_ids.shape[1]
    assert torch.equal(exp.completion_mask[:, :t], ref.completion_mask)
    assert torch.equal(
        exp.completion_ids.masked_fill(~exp.completion_mask, -1)[:, :t],
        ref.completion_ids.masked_fill(~ref.completion_mask, -1),
    )
    assert torch.equal(exp.truncated, ref.truncated) and exp.completions == ref.completions


def test_the_budget_and_max_turns_end_rows(tiny_model, smollm2_tokenizer):
    model = _model(tiny_model)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    exp = _multiturn(model, smollm2_tokenizer, StubEnv(), params, max_total_tokens=9)
    lengths = exp.attention_mask.sum(1)
    assert int(lengths.max()) <= 9
    cut = exp.env_counts["budget_cut"].bool()
    assert bool(cut.any()) and bool(exp.truncated[cut].all())
    one = _multiturn(model, smollm2_tokenizer, StubEnv(), params, max_turns=1)
    assert int(one.env_counts["turns"].max()) == 1 and int(one.env_counts["env_tokens"].sum()) == 0
    assert bool((one.attention_mask == one.completion_mask).all())
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        _multiturn(model, smollm2_tokenizer, StubEnv(), params, max_turns=0)
    with pytest.raises(ValueError, match="3 rows for"):
        generate_multiturn(
            model,
            smollm2_tokenizer,
            PROMPTS[:2],
            G,
            params,
            env=StubEnv(),
            rows=_rows(),
            eos_token_ids=EOS,
            max_turns=2,
        )


def test_experience_keeps_environment_tokens_in_attention_only():
    """A hand-built transcript: prompt [5, 6]; model 7 8, environment 9 9, model 10 EOS."""
    ids = torch.tensor([[7, 8, 9, 9, 10, 2], [7, 2, 0, 0, 0, 0]])
    model_tok = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]]).bool()
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]]).bool()
    p = torch.tensor([[5, 6], [5, 6]])
    exp = Experience.grouped(
        p, torch.ones_like(p).bool(), ids, model_tok, 2, attention_mask=attn, env_counts={"turns": torch.tensor([2, 1])}
    )
    assert torch.equal(exp.completion_attention, attn)
    tail = exp.rows(torch.tensor([1]))
    assert tail.completion_ids.shape[1] == 2 and tail.env_counts["turns"].tolist() == [1]
    both = Experience.concat(
        [exp, Experience.grouped(p, torch.ones_like(p).bool(), ids[:, :2], model_tok[:, :2], 2)], pad_id=0
    )
    assert both.attention_mask is not None
    assert both.attention_mask[2:].tolist() == [[True, True] + [False] * 4] * 2  # the part without: its own mask
    assert both.env_counts["turns"].tolist() == [2, 1, 0, 0]
    with pytest.raises(ValueError, match="attention_mask: False on a token"):
        Experience.grouped(p, torch.ones_like(p).bool(), ids, model_tok, 2, attention_mask=model_tok & False)


def test_the_docs_feedback_environment_gives_another_turn_after_an_eos(tiny_model, smollm2_tokenizer):
    from support.fake_envs import Feedback

    many_eos = list(range(0, 49152, 4))  # a turn ends at an EOS within a few tokens
    rows = [{"answer": "never written 123"} for _ in PROMPTS]
    exp = generate_multiturn(
        _model(tiny_model),
        smollm2_tokenizer,
        PROMPTS,
        G,
        SamplingParams(temperature=1.0, max_new_tokens=8),
        env=Feedback(tries=2),
        rows=rows,
        eos_token_ids=many_eos,
        max_turns=3,
        seed=3,
    )
    fb = smollm2_tokenizer("That is not right, try again.", add_special_tokens=False)["input_ids"]
    for r in range(len(exp)):
        turns = true_runs(exp.completion_mask[r])
        first_end = int(exp.completion_ids[r, turns[0][-1]])
        if first_end in many_eos:  # the first answer ended: told to retry, then a second (last) turn
            assert len(turns) == 2 and int(exp.env_counts["retries"][r]) == 1
            assert exp.completion_ids[r, turns[0][-1] + 1 : turns[1][0]].tolist() == fb
            assert not bool(exp.truncated[r]) or int(exp.completion_ids[r, turns[1][-1]]) not in many_eos
        else:  # cut by the token limit: no feedback
            assert len(turns) == 1 and bool(exp.truncated[r])
    assert int(exp.env_counts["retries"].sum()) >= 2


def test_later_turns_share_each_prompts_pass_between_its_rows(tiny_model, smollm2_tokenizer, monkeypatch):
    """The cpu backend runs each distinct prompt once per turn: at a later turn the rows are
    [prompt block ; transcript block] and the prefill is over the prompt block alone."""
    import grpokit.backends.cpu.generation as gen

    seen = []
    real = gen.distinct_rows

    def spy(ids, mask):
        first, inverse = real(ids, mask)
        seen.append((ids.shape, len(first)))
        return first, inverse

    monkeypatch.setattr(gen, "distinct_rows", spy)
    exp = _multiturn(
        _model(tiny_model, "cpu"),
        smollm2_tokenizer,
        StubEnv(),
        SamplingParams(temperature=1.0, max_new_tokens=6),
        turn_batching="lockstep",
    )
    widths = {int(exp.prompt_mask[r].sum()) for r in range(len(exp))}
    assert len(seen) >= 2  # turn 0 and at least one later turn
    (n0, cols0), u0 = seen[0]
    assert (n0, u0) == (len(PROMPTS) * G, len(PROMPTS)) and cols0 == max(widths) - 1  # turn 0: all but the last column
    for (n, cols), u in seen[1:]:  # later turns: the prompt block only, one pass per distinct prompt
        assert cols == max(widths) and u <= len(PROMPTS) < n


@pytest.mark.parametrize("backend", ["plain", "cpu"])
def test_the_continuous_loop_reads_each_token_once(tiny_model, smollm2_tokenizer, backend):
    """A turn boundary costs a prefill of the appended tokens only: over all the model's forwards
    (the prompts' prefill, then the decode steps) the real tokens fed are each distinct prompt's
    first P-1 tokens once (cpu: shared by the group; plain: per row) and each row's last prompt
    token and transcript once (its final token is never fed)."""
    model = _model(tiny_model, backend)
    fed = []

    def hook(module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        fed.append(int(mask[:, -ids.shape[1] :].sum()))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        exp = _multiturn(model, smollm2_tokenizer, StubEnv(), SamplingParams(temperature=1.0, max_new_tokens=6))
    finally:
        handle.remove()
    prompt_lens = [int(exp.prompt_mask[r].sum()) for r in range(len(exp))]
    prefill = sum(n - 1 for n in (prompt_lens[::G] if backend == "cpu" else prompt_lens))
    assert int(exp.env_counts["turns"].max()) >= 2
    assert sum(fed) == prefill + int(exp.attention_mask.sum())
    # one prefill, then one-token steps: as many as the longest transcript's tokens (each row feeds
    # one token a step, an observation's tokens one after another), not each turn's longest row
    # turn after turn
    assert len(fed) - 1 == int(exp.attention_mask.sum(1).max())


class _SlowEnv(StubEnv):
    """StubEnv whose steps take 0.2 s and record how many run at once."""

    def __init__(self, parallel: bool):
        super().__init__()
        self.parallel_steps, self.now, self.most = parallel, 0, 0
        self.lock = __import__("threading").Lock()

    def start(self, row):
        inner, env = super().start(row), self

        class Episode:
            def step(self, turn, *, ended_by_eos):
                with env.lock:
                    env.now += 1
                    env.most = max(env.most, env.now)
                __import__("time").sleep(0.2)
                with env.lock:
                    env.now -= 1
                return inner.step(turn, ended_by_eos=ended_by_eos)

        return Episode()


@pytest.mark.slow
def test_an_environment_with_parallel_steps_answers_a_rounds_rows_together(tiny_model, smollm2_tokenizer):
    """parallel_steps: a round's episodes step in threads, at once; the transcripts are those of the
    episodes stepping one after another."""
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    one_by_one, together = _SlowEnv(parallel=False), _SlowEnv(parallel=True)
    a = _multiturn(_model(tiny_model), smollm2_tokenizer, one_by_one, params)
    b = _multiturn(_model(tiny_model), smollm2_tokenizer, together, params)
    assert one_by_one.most == 1 and together.most > 1
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert [t.tolist() for t in a.env_counts.values()] == [t.tolist() for t in b.env_counts.values()]


class _OneSlowEnv(StubEnv):
    """StubEnv whose first prompt's episodes take 0.3 s a step; records how many decode steps the
    model ran while each of those steps waited."""

    def __init__(self, parallel: bool, forwards: list[int]):
        super().__init__()
        self.parallel_steps, self.forwards, self.during = parallel, forwards, []

    def start(self, row):
        inner, env, slow = super().start(row), self, row["answer"] == "0"

        class Episode:
            def step(self, turn, *, ended_by_eos):
                if slow:
                    before = env.forwards[0]
                    __import__("time").sleep(0.3)
                    env.during.append(env.forwards[0] - before)
                return inner.step(turn, ended_by_eos=ended_by_eos)

        return Episode()


@pytest.mark.slow
def test_a_slow_answer_holds_its_own_row_alone_with_continuous_overlap(tiny_model, smollm2_tokenizer):
    """turn_batching="continuous_overlap": a parallel_steps environment answers while the loop decodes
    the other rows (a row waiting on a slow call feeds nothing and resumes when its answer is ready);
    the transcripts are those of answering before every next step. With "continuous" (the default,
    bit-reproducible) nothing decodes while an episode answers, parallel_steps or not."""
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    got = {}
    for parallel, batching in ((False, "continuous"), (True, "continuous"), (True, "continuous_overlap")):
        model, forwards = _model(tiny_model), [0]
        model.register_forward_pre_hook(lambda *_, n=forwards: n.__setitem__(0, n[0] + 1))
        env = _OneSlowEnv(parallel, forwards)
        exp = _multiturn(model, smollm2_tokenizer, env, params, turn_batching=batching)
        got[parallel, batching] = (exp, env.during)
    for key in ((False, "continuous"), (True, "continuous")):
        assert got[key][1] and set(got[key][1]) == {0}  # no decode step while it answers
    b, waited_beside = got[True, "continuous_overlap"]
    assert max(waited_beside) > 0  # the other rows decoded meanwhile
    a = got[False, "continuous"][0]
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.completion_mask, b.completion_mask)
