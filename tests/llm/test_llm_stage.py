"""The LLM stage against a stub OpenAI-compatible server on 127.0.0.1 (the real openai client and
transport), with the real TL checker."""
from __future__ import annotations

import json
import logging
import time

import pytest

import tl
from hardware_profiles import load_profile
from translate.params import validate
from tuner.llm import (LLMClient, describe_seeds, LLMConfig, ResponseCache, Seed, generate_program, generate_programs,
                       profile_seeds, propose_params, representative_problem)
from tuner.llm.prompts import extract_json, extract_tl
from kernel_abi.spec import spec_for

from stub_server import Reply, StubOpenAI, closed_port_url

H100 = load_profile("h100")
SPEC = spec_for("mha", 128, "bf16", True)

# An LLM-style program: the built-in flow, but the next K tile is prefetched after the softmax, so
# the test can tell the LLM's program from the built-in one.
GOOD = """\
Allocate Q in global (seq_len, HeadDim) with offset q_offset
Allocate K in global (kv_len, HeadDim) with offset kv_offset
Allocate V in global (kv_len, HeadDim) with offset kv_offset
Allocate O in global (seq_len, HeadDim) with offset q_offset
Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared
Copy K (BN, HeadDim) in coordinate [L = 0] from global to shared
Allocate O_register in register (BM, HeadDim)
Allocate S in register (BM, BN)
for i = 0:N
    Compute GEMM Q_shared, K_shared.T and get S
    Compute Mask S
    Copy V (BN, HeadDim) in coordinate [L = i] from global to shared
    Compute Softmax S with Smax and Ssum
    if i < N - 1
        Copy K (BN, HeadDim) in coordinate [L = i+1] from global to shared
    end
    Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)
    Compute GEMM S, V_shared and accumulate O_register
end
Compute Divide O_register, Ssum and get new O_register
Copy O_register from register to global
"""
# The paper's two failure modes.
NO_RESHAPE = "".join(line + "\n" for line in GOOD.splitlines() if not line.strip().startswith("Reshape"))
NO_TRANSPOSE = GOOD.replace("K_shared.T", "K_shared")

SKETCH_ANSWER = """<think>Load Q once, loop over K/V tiles, prefetch K after softmax.</think>
Here is the sketch:

```tl
Copy Q from global to shared
for i = 0:N
    Compute GEMM Q_shared, K_shared.T and get S
    Compute Mask S
    Compute Softmax S with Smax and Ssum
    Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new)
    Compute GEMM S, V_shared and accumulate O_register
end
Copy O_register from register to global
```
The next K tile is issued after the softmax so that it overlaps the P·V GEMM.
"""


def answer(program: str, prose: str = "Here is the complete program:") -> str:
    return f"{prose}\n\n```tl\n{program}```\n"


def config_for(url: str, **changes) -> LLMConfig:
    settings = dict(base_url=url, model="stub-model", api_key="sk-test", timeout=5.0, max_retries=0)
    settings.update(changes)
    return LLMConfig(**settings)


# -- (a) happy path --------------------------------------------------------------------------------

def test_llm_program_is_used_when_it_checks_clean():
    script = [Reply(SKETCH_ANSWER), Reply(answer(GOOD), expect=("Step 2 of 2", "Compute Mask S"))]
    with StubOpenAI(script=script) as stub:
        outcome = generate_program(config_for(stub.base_url), H100, SPEC)
    assert stub.failures == []
    assert outcome.source == "llm" and outcome.rounds == 0
    assert outcome.program_text == GOOD and outcome.program is not None
    assert outcome.program_text != tl.load_sketch("mha", True)
    assert outcome.diagnostics_history == ((),)
    assert "Copy Q from global to shared" in outcome.sketch_text and "<think>" not in outcome.sketch_text
    first, second = stub.chat_requests
    system = first.body["messages"][0]["content"]
    # The prompt carries what the paper's prompts carry: the language, the hardware, the pitfalls.
    for needle in ("Compute GEMM Q_shared, K_shared.T and get S", "Reshape G from (MMA_C", "`shared`",
                   "SM80_16x8x16", "227 KB", "online", "Reshape omission", "GEMM layout error", "Compute Mask S"):
        assert needle in system, needle
    # Step 2 continues the conversation with the model's own sketch.
    assert [m["role"] for m in second.body["messages"]] == ["system", "user", "assistant", "user"]
    assert "Compute GEMM Q_shared, K_shared.T and get S" in second.body["messages"][2]["content"]
    assert second.body["model"] == "stub-model" and second.body["temperature"] == pytest.approx(0.2)


# -- (b) the paper's two failure modes, repaired -----------------------------------------------------

def test_repair_loop_fixes_missing_reshape_then_gemm_layout():
    script = [
        Reply(SKETCH_ANSWER),
        Reply(answer(NO_RESHAPE)),
        Reply(answer(NO_TRANSPOSE, "You are right, the Reshape was missing:"),
              expect=("error[missing-reshape]", "hint: insert `Reshape S from (MMA_C, MMA_M, MMA_N)")),
        Reply(answer(GOOD, "Fixed the transpose:"),
              expect=("error[gemm-layout]", "K_shared.T", "<llm>:10:")),
    ]
    with StubOpenAI(script=script) as stub:
        outcome = generate_program(config_for(stub.base_url), H100, SPEC)
    assert stub.failures == []
    assert outcome.source == "llm" and outcome.rounds == 2
    assert outcome.program_text == GOOD
    codes = [[line.split("error[")[1].split("]")[0] for line in round_] for round_ in outcome.diagnostics_history]
    assert codes == [["missing-reshape"], ["gemm-layout"], []]
    # The second repair request no longer reports the fixed reshape error as current.
    last = stub.chat_requests[-1].body["messages"][-1]["content"]
    assert "missing-reshape" not in last


# -- (b2) Hopper: the warp-specialised constructs ---------------------------------------------------------------

HOPPER_GOOD = tl.load_sketch("mha", True, "ws_overlap")
# A Hopper-specific mistake: the consumer loop starts at 0 after the peeled first tile, so it reads one
# K tile more than the producer loads (the kernel would wait forever).
HOPPER_UNBALANCED = HOPPER_GOOD.replace("    for i = 1:N", "    for i = 0:N")
HOPPER_SKETCH = """```tl
warpgroup producer
    Copy Q from global to shared
    for j = 0:N with stages kv_stages
        Copy K from global to shared
        Copy V from global to shared
    end
end
warpgroup consumer
    Compute GEMM Q_shared, K_shared.T and get S
    Compute Mask S
    Compute Softmax S with Smax and Ssum
    Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new) and get P
    for i = 1:N
        Compute GEMM Q_shared, K_shared.T and get S
        Compute GEMM P, V_shared and accumulate O_register
        Compute Mask S
        Compute Softmax S with Smax and Ssum
        Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new) and get P
    end
    Compute GEMM P, V_shared and accumulate O_register
    Copy O_register from register to global
end
```
The next score GEMM is issued before the P·V GEMM of the current tile.
"""


def test_hopper_prompt_teaches_the_new_constructs_and_a_hopper_sketch_is_used():
    script = [Reply(HOPPER_SKETCH), Reply(answer(HOPPER_GOOD), expect=("Step 2 of 2", "with stages kv_stages"))]
    with StubOpenAI(script=script) as stub:
        outcome = generate_program(config_for(stub.base_url), H100, SPEC)
    assert stub.failures == []
    assert outcome.source == "llm" and outcome.program_text == HOPPER_GOOD and outcome.rounds == 0
    system, sketch_request = (m["content"] for m in stub.chat_requests[0].body["messages"])
    for needle in ("warpgroup producer", "warpgroup consumer", "with stages kv_stages", "and get P", "wgmma", "TMA"):
        assert needle in system, needle
    assert "score GEMM of the\nnext K tile before the P·V GEMM" in sketch_request   # it asks for a schedule choice


def test_repair_loop_fixes_a_hopper_pipeline_that_would_deadlock():
    script = [
        Reply(HOPPER_SKETCH),
        Reply(answer(HOPPER_UNBALANCED)),
        Reply(answer(HOPPER_GOOD, "The loop must start at 1 after the peeled tile:"),
              expect=("error[pipeline-balance]", "the producer fills K_shared once but the consumers read it twice")),
    ]
    with StubOpenAI(script=script) as stub:
        outcome = generate_program(config_for(stub.base_url), H100, SPEC)
    assert stub.failures == []
    assert outcome.source == "llm" and outcome.rounds == 1 and outcome.program_text == HOPPER_GOOD
    codes = [[line.split("error[")[1].split("]")[0] for line in round_] for round_ in outcome.diagnostics_history]
    assert codes == [["pipeline-balance"], []]


def test_a_pipeline_too_deep_for_the_gpu_is_a_repairable_diagnostic():
    deep = HOPPER_GOOD.replace("with stages kv_stages", "with stages 5")
    script = [Reply(HOPPER_SKETCH), Reply(answer(deep)),
              Reply(answer(HOPPER_GOOD), expect=("error[pipeline-smem]", "227 KB"))]
    with StubOpenAI(script=script) as stub:
        outcome = generate_program(config_for(stub.base_url), H100, SPEC)
    assert stub.failures == [] and outcome.source == "llm" and outcome.rounds == 1


# -- (c) repair rounds exhausted -------------------------------------------------------------------------

def test_repair_rounds_exhausted_falls_back_to_builtin(caplog):
    script = [Reply(SKETCH_ANSWER), Reply(answer(NO_RESHAPE)), Reply(answer(NO_RESHAPE), expect=("missing-reshape",)),
              Reply("I cannot find the problem, sorry.", expect=("missing-reshape",))]
    with StubOpenAI(script=script) as stub, caplog.at_level(logging.INFO, "tuner.llm"):
        outcome = generate_program(config_for(stub.base_url, max_repair_rounds=2), H100, SPEC)
    assert stub.failures == [] and len(stub.chat_requests) == 4
    assert outcome.source == "builtin" and outcome.rounds == 2
    # on a Hopper profile the fallback is its own schedule's reference sketch
    assert outcome.program_text == tl.load_sketch("mha", True, "ws_overlap") and outcome.program is not None
    assert "after 2 repair round(s)" in outcome.message and "built-in mha causal" in outcome.message
    assert "contains no TL program" in outcome.diagnostics_history[-1][0]
    assert outcome.message in caplog.text


# -- (d) dead endpoints -------------------------------------------------------------------------------------

def test_closed_port_falls_back_fast_and_seeds_do_not_wait_again():
    config = config_for(closed_port_url(), timeout=1.0, max_retries=1)
    client = LLMClient(config)
    start = time.monotonic()
    outcome = generate_program(config, H100, SPEC, client=client)
    seeds = propose_params(config, H100, SPEC, outcome.program_text, 4, client=client)
    elapsed = time.monotonic() - start
    assert outcome.source == "builtin" and "cannot connect" in outcome.message
    assert "using the built-in mha causal reference program" in outcome.message
    assert [s.source for s in seeds] == ["profile"] * 4
    assert client.requests_sent == 1   # the dead latch: the seeds stage did not try again
    assert elapsed < 5


@pytest.mark.parametrize("reply, words", [
    (Reply(SKETCH_ANSWER, delay_s=1.5), "no answer within 0.5 s"),
    (Reply(status=503), "HTTP 503"),
    (Reply(raw_body=b"<html><body>502 Bad Gateway</body></html>"), "not a chat completion"),
])
def test_broken_endpoint_falls_back_with_reason(reply, words):
    with StubOpenAI(script=[reply, reply]) as stub:
        outcome = generate_program(config_for(stub.base_url, timeout=0.5, max_retries=0), H100, SPEC)
    assert outcome.source == "builtin" and words in outcome.message, outcome.message
    assert outcome.program is not None


def test_unconfigured_uses_builtin_and_profile_seeds_and_says_so(caplog):
    config = LLMConfig.from_options(env={})
    assert not config.configured
    with caplog.at_level(logging.INFO, "tuner.llm"):
        outcome = generate_program(config, H100, SPEC)
        seeds = propose_params(config, H100, SPEC, outcome.program_text, 5)
    assert outcome.source == "builtin" and "no LLM configured" in outcome.message
    assert "--llm-model" in outcome.message
    assert [s.source for s in seeds] == ["profile"] * 5
    assert "profile-derived seeds" in caplog.text


def test_config_from_options_and_env_and_hidden_key():
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "OPENAI_MODEL": "qwen", "OPENAI_API_KEY": "sk-env-key"}
    config = LLMConfig.from_options(model="llama", env=env)
    assert (config.base_url, config.model, config.api_key) == ("http://127.0.0.1:8000/v1", "llama", "sk-env-key")
    assert config.configured
    assert "sk-env-key" not in repr(config) and "sk-env-key" not in str(config)
    assert not LLMConfig.from_options(base_url="http://x/v1", env={}).configured          # no model
    assert LLMConfig.from_options(base_url="http://x/v1", model="m", env={}).configured    # local server, no key
    assert not LLMConfig.from_options(model="m", env={"OPENAI_API_KEY": " "}).configured  # blank key
    with pytest.raises(ValueError, match="timeout"):
        LLMConfig(timeout=0)


# -- (e) parameter proposals ----------------------------------------------------------------------------

def candidate(**changes):
    c = {"block_m": 128, "block_n": 64, "num_warps": 4, "kv_stages": 1, "mma_atom": "SM80_16x8x16",
         "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL", "s2r_atom": "SM75_U32x4_LDSM_N", "swizzle": 3,
         "q_in_regs": False, "rationale": "FA2's choice on H100"}
    c.update(changes)
    return c


def test_structured_proposals_are_validated_and_deduplicated(caplog):
    proposal = {"candidates": [
        candidate(),
        candidate(block_n=128, num_warps=8, q_in_regs=True, rationale="FA3 sm8x: Q in registers"),
        candidate(block_n=256, kv_stages=3),        # 416 KB of shared memory
        candidate(block_m=96),                      # not a multiple of 16 x 4 warps
        candidate(rationale="the same again"),      # duplicate
    ]}
    with StubOpenAI(script=[Reply(json.dumps(proposal))]) as stub, caplog.at_level(logging.INFO, "tuner.llm"):
        seeds = propose_params(config_for(stub.base_url), H100, SPEC, GOOD, 4)
    (request,) = stub.chat_requests
    assert request.response_format_type == "json_schema"
    schema = json.dumps(request.body["response_format"])
    assert '"SM80_CP_ASYNC_CACHEGLOBAL"' in schema and "enum" in schema   # atoms limited to the profile's
    assert "Shared memory = 2 bytes" in request.text and "227 KB" in request.text and GOOD.splitlines()[0] in request.text
    assert [s.source for s in seeds] == ["llm", "llm", "profile", "profile"]
    assert seeds[1].params.block_n == 128 and seeds[1].params.q_in_regs and "Q in registers" in seeds[1].rationale
    assert len({s.params for s in seeds}) == 4
    problem = representative_problem(SPEC)
    assert all(validate(s.params, H100, problem) == [] for s in seeds)
    assert "candidate 3" in caplog.text and "exceeds the 227 KB" in caplog.text
    assert "candidate 4" in caplog.text and "multiple of 16 x num_warps" in caplog.text
    assert "candidate 5" in caplog.text and "duplicate" in caplog.text


def test_json_mode_fallback_with_retry(caplog):
    good = {"candidates": [candidate(mma_atom="SM90_64x64x16_WGMMA"),  # not on this profile: dropped
                           dict(candidate(block_m=64, rationale="small tiles for the causal tail"), smem_kb=48)]}
    script = [Reply("Sure! Here are some good parameters: block_m=128, block_n=64."),
              Reply("```json\n" + json.dumps(good) + "\n```", expect=("could not be used",))]
    with StubOpenAI(script=script, reject_json_schema=True) as stub, caplog.at_level(logging.INFO, "tuner.llm"):
        seeds = propose_params(config_for(stub.base_url), H100, SPEC, GOOD, 3)
    assert stub.failures == []
    assert [r.response_format_type for r in stub.chat_requests] == ["json_schema", "json_object", "json_object"]
    assert seeds[0] == Seed(seeds[0].params, "llm", "small tiles for the causal tail")
    assert seeds[0].params.block_m == 64
    assert [s.source for s in seeds] == ["llm", "profile", "profile"]
    assert describe_seeds(seeds) == "3 seeds: 1 from the LLM, 2 profile-derived"
    assert "structured output not supported" in caplog.text and "SM90_64x64x16_WGMMA is not available" in caplog.text


def test_plain_text_fallback_when_json_mode_is_rejected_too():
    proposal = {"candidates": [candidate(block_n=32)]}
    with StubOpenAI(script=[Reply("Here you go:\n" + json.dumps(proposal))], reject_json_schema=True,
                    reject_json_object=True) as stub:
        seeds = propose_params(config_for(stub.base_url), H100, SPEC, GOOD, 2)
    assert [r.response_format_type for r in stub.chat_requests] == ["json_schema", "json_object", None]
    assert seeds[0].source == "llm" and seeds[0].params.block_n == 32


def test_profile_seeds_are_legal_distinct_and_follow_flashattention():
    for gpu, variant, head_dim, dtype in [("h100", "mha", 128, "bf16"), ("a100", "mha", 64, "fp16"),
                                          ("t4", "mha", 128, "fp16"), ("h100", "mla", None, "bf16"),
                                          ("l40s", "gqa", 128, "bf16"), ("t4", "mla", None, "fp16")]:
        profile, spec = load_profile(gpu), spec_for(variant, head_dim, dtype, True)
        seeds = profile_seeds(profile, spec, 6)
        problem = representative_problem(spec)
        assert seeds and len(set(seeds)) == len(seeds) <= 6
        assert all(validate(p, profile, problem) == [] for p in seeds), gpu
    h100 = profile_seeds(H100, SPEC, 8)
    assert any((p.block_m, p.block_n, p.num_warps) == (128, 64, 4) for p in h100)   # FA2's H100 d128 tile


# -- (f) cache: a resume asks nothing ----------------------------------------------------------------------

def test_resume_sends_no_requests(tmp_path):
    script = [Reply(SKETCH_ANSWER), Reply(answer(NO_RESHAPE)), Reply(answer(GOOD)),
              Reply(json.dumps({"candidates": [candidate(block_n=96)]}))]
    with StubOpenAI(script=script) as stub:
        config = config_for(stub.base_url)
        first = generate_program(config, H100, SPEC, ResponseCache(tmp_path))
        seeds_first = propose_params(config, H100, SPEC, first.program_text, 3, ResponseCache(tmp_path))
        assert len(stub.chat_requests) == 4
        cache = ResponseCache(tmp_path)           # a new driver process reading the study dir
        assert len(cache) == 4
        second = generate_program(config, H100, SPEC, cache)
        seeds_second = propose_params(config, H100, SPEC, second.program_text, 3, cache)
        assert len(stub.requests) == 4            # nothing asked twice
    assert stub.failures == []
    assert (second.source, second.rounds, second.program_text) == ("llm", 1, first.program_text)
    assert seeds_second == seeds_first and seeds_first[0].params.block_n == 96
    assert cache.hits == 4


def test_cache_survives_a_torn_last_line(tmp_path):
    cache = ResponseCache(tmp_path / "llm.jsonl")
    messages = [{"role": "user", "content": "hi"}]
    cache.put("m", messages, "text", "hello")
    with open(cache.path, "a") as f:
        f.write('{"key": "abc", "cont')             # the driver was killed mid-write
    reloaded = ResponseCache(tmp_path / "llm.jsonl")
    assert reloaded.get("m", messages, "text") == "hello"
    assert reloaded.get("other-model", messages, "text") is None
    assert reloaded.get("m", messages, "json_object") is None


# -- (g) the API key stays out of every file ---------------------------------------------------------------

def test_api_key_never_reaches_study_files(tmp_path):
    key = "sk-proj-SECRET-3f9a1c7d2b"
    study = tmp_path / "study"
    study.mkdir()
    handler = logging.FileHandler(study / "campaign.log")
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)                    # openai's and httpx2's debug logs included
    try:
        script = [Reply(SKETCH_ANSWER), Reply(answer(NO_TRANSPOSE)), Reply(answer(GOOD)),
                  Reply(json.dumps({"candidates": [candidate()]}))]
        with StubOpenAI(script=script, require_api_key=key) as stub:
            config = config_for(stub.base_url, api_key=key)
            cache = ResponseCache(study)
            outcome = generate_program(config, H100, SPEC, cache)
            seeds = propose_params(config, H100, SPEC, outcome.program_text, 2, cache)
            # A wrong key: servers echo it in their 401 message; it must be scrubbed before it is shown.
            wrong = config_for(stub.base_url, api_key=key + "-old")
            refused = generate_program(wrong, H100, SPEC)
        assert stub.chat_requests[0].header("Authorization") == f"Bearer {key}"   # it did reach the server
        assert outcome.source == "llm" and seeds[0].source == "llm"
        assert refused.source == "builtin" and "HTTP 401" in refused.message and "***" in refused.message
        (study / "sketch.json").write_text(json.dumps([outcome.to_dict(), refused.to_dict()]))
        (study / "seeds.json").write_text(json.dumps([{**s.params.to_dict(), "source": s.source} for s in seeds]))
        (study / "config.txt").write_text(repr(config) + "\n" + str(wrong))
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()
    files = [p for p in study.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"llm_cache.jsonl", "campaign.log", "sketch.json", "seeds.json"}
    assert (study / "campaign.log").stat().st_size > 0
    for path in files:
        assert "SECRET-3f9a1c7d2b" not in path.read_text(errors="replace"), path.name


# -- extraction -------------------------------------------------------------------------------------------

def test_extract_tl_from_realistic_answers():
    assert extract_tl(answer(GOOD)) == GOOD
    assert extract_tl(GOOD) == GOOD                                         # plain, no fence
    prose = "Sure. The kernel:\n\n" + GOOD + "\nThis prefetches K after the softmax."
    assert extract_tl(prose) == GOOD
    two = answer(NO_RESHAPE, "First attempt:") + answer(GOOD, "Final version:")
    assert extract_tl(two) == GOOD                                          # the last of equals wins
    assert extract_tl("```python\nprint('hello')\n```") == ""
    assert extract_tl("<think>Copy Q from global to shared</think>no program") == ""
    assert extract_json('<think>{"no": 1}</think>```json\n{"candidates": []}\n```') == {"candidates": []}
    with pytest.raises(ValueError):
        extract_json("no json at all")


# -- (h) schedule variants: several checked programs for the search's sketch dimension -----------------------

A100 = load_profile("a100")
HOPPER_SERIAL = tl.load_sketch("mha", True, "ws_serial")
LATE_PREFETCH = tl.load_sketch("mha", True, "fa2_late_prefetch")


def variant_opening(request) -> str:
    """The user message that opens a variant's conversation (after the system prompt)."""
    return request.body["messages"][1]["content"]


def test_variants_are_distinct_programs_and_each_request_shows_the_earlier_ones(tmp_path):
    script = [Reply(HOPPER_SKETCH), Reply(answer(HOPPER_GOOD)),
              Reply(HOPPER_SKETCH), Reply(answer(HOPPER_SERIAL), expect=("Step 2 of 2",))]
    with StubOpenAI(script=script) as stub:
        config = config_for(stub.base_url)
        outcomes = generate_programs(config, H100, SPEC, ResponseCache(tmp_path), count=2)
        assert stub.failures == [] and len(stub.chat_requests) == 4
        first, second = variant_opening(stub.chat_requests[0]), variant_opening(stub.chat_requests[2])
        resumed = generate_programs(config, H100, SPEC, ResponseCache(tmp_path), count=2)
        assert len(stub.requests) == 4            # a resume is served from the cache: every variant kept its answers
    assert [o.source for o in outcomes] == ["llm", "llm"]
    assert [o.program_text for o in outcomes] == [HOPPER_GOOD, HOPPER_SERIAL]
    assert all(o.program is not None and o.rounds == 0 for o in outcomes)
    assert "variant 2/2" in outcomes[1].message
    assert "variant 1 of 2" in first and "already written" not in first
    assert "variant 2 of 2" in second and "Write a different schedule" in second
    assert HOPPER_GOOD.strip() in second and HOPPER_SERIAL.strip() not in second
    assert "(SS)" in second and "Copy Q_shared from shared to register" not in second   # Hopper's choices
    assert len(ResponseCache(tmp_path)) == 4
    assert [o.program_text for o in resumed] == [HOPPER_GOOD, HOPPER_SERIAL]


def test_a_variant_repeating_an_earlier_one_is_dropped(caplog):
    # the same program with a comment and another indentation: normalised, it is the first one again
    again = "// prefetch K after the softmax\n" + GOOD.replace("    ", "  ")
    script = [Reply(SKETCH_ANSWER), Reply(answer(GOOD)),
              Reply(SKETCH_ANSWER), Reply(answer(again)),
              Reply(SKETCH_ANSWER), Reply(answer(LATE_PREFETCH))]
    with StubOpenAI(script=script) as stub, caplog.at_level(logging.INFO, "tuner.llm"):
        outcomes = generate_programs(config_for(stub.base_url), A100, SPEC, count=3)
    assert stub.failures == []
    assert [o.program_text for o in outcomes] == [GOOD, LATE_PREFETCH]
    assert "variant 2/3 dropped" in caplog.text and "earlier variant" in caplog.text
    third = variant_opening(stub.chat_requests[4])
    assert "variant 3 of 3" in third and "Copy Q_shared from shared to register" in third   # the sm80 choices
    # the duplicate is not listed as a second schedule written
    assert third.count("Copy V (BN, HeadDim) in coordinate [L = i] from global to shared") == 1


def test_a_broken_variant_is_repaired_and_kept():
    unfilled = "".join(line + "\n" for line in HOPPER_GOOD.splitlines() if "Copy V" not in line)
    script = [Reply(HOPPER_SKETCH), Reply(answer(unfilled)),
              Reply(answer(HOPPER_GOOD), expect=("error[unfilled-buffer]", "no producer Copy fills it"))]
    with StubOpenAI(script=script) as stub:
        (outcome,) = generate_programs(config_for(stub.base_url), H100, SPEC, count=1)
    assert stub.failures == []
    assert outcome.source == "llm" and outcome.rounds == 1 and outcome.program_text == HOPPER_GOOD
    codes = [{line.split("error[")[1].split("]")[0] for line in round_} for round_ in outcome.diagnostics_history]
    assert codes == [{"unfilled-buffer"}, set()]


def test_an_unrepaired_or_unusable_variant_is_dropped_and_the_next_one_asked():
    script = [Reply(SKETCH_ANSWER), Reply(answer(NO_RESHAPE)), Reply(answer(NO_RESHAPE)),   # still broken
              Reply(""),                                                                   # empty: BadAnswer
              Reply(SKETCH_ANSWER), Reply(answer(GOOD))]
    with StubOpenAI(script=script) as stub:
        outcomes = generate_programs(config_for(stub.base_url, max_repair_rounds=1), A100, SPEC, count=3)
    assert stub.failures == [] and len(stub.chat_requests) == 6
    assert [(o.program_text, o.rounds) for o in outcomes] == [(GOOD, 0)]
    assert "variant 3 of 3" in variant_opening(stub.chat_requests[4])


def test_an_endpoint_that_dies_midway_keeps_what_was_written(caplog):
    script = [Reply(SKETCH_ANSWER), Reply(answer(GOOD)), Reply(status=503)]
    with StubOpenAI(script=script) as stub, caplog.at_level(logging.INFO, "tuner.llm"):
        outcomes = generate_programs(config_for(stub.base_url), A100, SPEC, count=3)
    assert stub.failures == []                    # nothing asked after the 503
    assert [o.program_text for o in outcomes] == [GOOD]
    assert "variant 2/3 dropped" in caplog.text and "HTTP 503" in caplog.text
    assert "variant 3/3" not in caplog.text       # the third variant was not even attempted


def test_dead_or_unconfigured_endpoint_gives_no_variants():
    config = config_for(closed_port_url(), timeout=1.0, max_retries=0)
    client = LLMClient(config)
    assert generate_programs(config, H100, SPEC, count=3, client=client) == []
    assert client.requests_sent == 1              # one refused connection, not one per variant
    assert generate_programs(LLMConfig.from_options(env={}), H100, SPEC) == []
