//! The endpoint against a scripted model: continuations, merges, limits, refusals.

use super::*;
use crate::agent::episode::AlwaysWanted;
use crate::backends::generate::GenerateError;
use crate::backends::wire::{Finish, Generation};
use crate::domain::backend::LogprobsMode;
use crate::scripted::demo;
use async_trait::async_trait;

/// Answers each request with the next scripted text and the end-of-turn token;
/// records the prompts.
struct Script {
    model: Arc<ModelFiles>,
    texts: Vec<String>,
    prompts: Vec<Vec<u32>>,
}

#[async_trait]
impl Generator for Script {
    async fn generate(
        &mut self,
        prompt_ids: &[u32],
        _sampling: &Sampling,
        _turn: usize,
    ) -> Result<Generated, GenerateError> {
        let text = self.texts[self.prompts.len()].clone();
        self.prompts.push(prompt_ids.to_vec());
        let mut ids = self.model.tokenizer.encode(&text).unwrap();
        ids.push(self.model.eos_id);
        let logprobs = (0..ids.len()).map(|i| -(i as f32) / 8.0).collect();
        Ok(Generated {
            generation: Generation {
                token_ids: ids,
                logprobs,
                finish: Finish::Stop,
                cached_prompt_tokens: None,
                text: None,
                after_pause: false,
                weight_versions: None,
            },
            backend: "b0".into(),
            logprobs_mode: LogprobsMode::Raw,
            backend_wait: std::time::Duration::ZERO,
        })
    }

    fn take_switches(&mut self) -> Vec<trajectory::BackendSwitch> {
        Vec::new()
    }
}

fn endpoint(model: &Arc<ModelFiles>) -> Endpoint {
    Endpoint::new(ProgramEpisode {
        model: model.clone(),
        model_name: "demo".into(),
        parser: Parser::Hermes,
        sampling: Sampling::default(),
        limits: EpisodeLimits {
            max_turns: 10,
            max_tokens: 4096,
            max_new_tokens: 256,
            tool_timeout: std::time::Duration::from_secs(1),
            stop_without_tool_call: true,
            max_observation_bytes: 1024,
        },
        max_refused_calls: DEFAULT_MAX_REFUSED_CALLS,
        template_args: serde_json::Map::new(),
        observations_as_text: true,
        deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(60),
        policy: PolicyWatch::at_version(None),
    })
}

const CALL: &str =
    "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
        "properties": {"command": {"type": "string"}}}}}])
}

async fn chat(e: &mut Endpoint, llm: &mut Script, messages: &[Value]) -> Value {
    let body = json!({"model": "x", "messages": messages, "tools": tools()}).to_string();
    let a = e
        .serve("POST", "/v1/chat/completions", &body, llm, &AlwaysWanted)
        .await
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    serde_json::from_str::<Value>(&a.body).unwrap()["choices"][0]["message"].clone()
}

#[tokio::test]
async fn continuations_join_a_sample_token_exact_and_a_branch_starts_another() {
    let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[CALL]).unwrap());
    let mut llm = Script {
        model: model.clone(),
        texts: vec![CALL.into(), "Done.".into(), "Other.".into()],
        prompts: Vec::new(),
    };
    let mut e = endpoint(&model);
    let opening = vec![json!({"role": "user", "content": "List the files."})];
    let first = chat(&mut e, &mut llm, &opening).await;
    assert_eq!(
        first["tool_calls"][0]["function"]["arguments"],
        "{\"command\":\"ls\"}"
    );
    let id = first["tool_calls"][0]["id"].as_str().unwrap().to_string();
    let mut convo = opening.clone();
    convo.push(first.clone());
    convo.push(json!({"role": "tool", "tool_call_id": id, "content": "a.py\nb.py"}));
    chat(&mut e, &mut llm, &convo).await;
    // The second prompt is the first prompt and output, then the tool result's tokens.
    let (p0, p1) = (llm.prompts[0].clone(), llm.prompts[1].clone());
    let out0 = e.samples[0].turns[0].model_range;
    assert_eq!(&p1[..p0.len()], &p0[..]);
    assert_eq!(
        &p1[p0.len()..p0.len() + out0[1]],
        &e.samples[0].response_ids[..out0[1]]
    );
    // Its record keeps only what followed call 0's conversation and answer.
    assert_eq!(e.calls[1].continues, Some(0));
    assert_eq!(e.calls[1].request["messages"].as_array().unwrap().len(), 1);
    assert_eq!(e.calls[1].request["messages"][0]["role"], "tool");
    // The same continuation again is a branch off call 0: a sample of its own.
    chat(&mut e, &mut llm, &convo).await;
    let merges: Vec<_> = e.calls.iter().map(|c| c.merge.unwrap()).collect();
    assert_eq!(merges, [Merge::First, Merge::Extends, Merge::New]);
    assert!(
        e.calls[2].reason.as_deref().unwrap().contains("a branch"),
        "{:?}",
        e.calls[2]
    );
    assert_eq!(e.samples.len(), 2);
    assert_eq!(e.samples[1].prompt_ids, llm.prompts[2]);
    let s = &e.samples[0];
    assert_eq!(s.all_ids()[..p1.len()], p1[..]);
    assert!(crate::agent::episode::mask_matches_turns(s));
    // The continuation renders afresh to the same tokens with this template (the
    // check runs beside the calls, and is in by the end).
    let run = e.finish(ProgramEnd::Exited).await;
    let drift = run.calls[1].drift.as_ref().unwrap();
    assert!(drift.identical, "{drift:?}");
}

#[tokio::test]
async fn completions_merge_by_tokens_and_limits_refuse_calls() {
    let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
    let mut llm = Script {
        model: model.clone(),
        texts: vec!["One.".into(), "Two.".into()],
        prompts: Vec::new(),
    };
    let mut e = endpoint(&model);
    e.ep.limits.max_turns = 2;
    let serve = |body: Value| body.to_string();
    let a = e
        .serve(
            "POST",
            "/v1/completions",
            &serve(json!({"prompt": [5, 6, 7]})),
            &mut llm,
            &AlwaysWanted,
        )
        .await
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    let mut next = vec![5, 6, 7];
    next.extend(&e.samples[0].response_ids);
    next.extend([8, 9]);
    e.serve(
        "POST",
        "/v1/completions",
        &serve(json!({"prompt": next})),
        &mut llm,
        &AlwaysWanted,
    )
    .await
    .unwrap();
    assert_eq!(e.samples.len(), 1);
    assert_eq!(e.calls[1].merge, Some(Merge::Extends));
    assert_eq!(e.calls[1].observation_tokens, 2);
    assert_eq!(
        &e.samples[0].loss_mask[e.samples[0].turns[0].model_range[1]..][..2],
        &[0, 0]
    );
    let refused = e
        .serve(
            "POST",
            "/v1/completions",
            &serve(json!({"prompt": [1]})),
            &mut llm,
            &AlwaysWanted,
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 400);
    assert!(
        refused.body.contains("model calls are spent"),
        "{}",
        refused.body
    );
    let bad = e
        .serve(
            "POST",
            "/v1/completions",
            &serve(json!({"prompt": [1], "n": 3})),
            &mut llm,
            &AlwaysWanted,
        )
        .await
        .unwrap();
    assert!(
        bad.status == 400 && bad.body.contains("\"param\":\"n\""),
        "{}",
        bad.body
    );
    let missing = e
        .serve("GET", "/v1/embeddings", "", &mut llm, &AlwaysWanted)
        .await
        .unwrap();
    assert_eq!(missing.status, 404);
    let run = e.finish(ProgramEnd::Exited).await;
    assert_eq!(run.trajectory.finish_reason, Some(FinishReason::MaxTurns));
    assert_eq!(run.calls.len(), 4, "the refused calls are recorded");
    assert_eq!(run.calls[3].reply["error"]["param"], "n");
}

async fn serve(e: &mut Endpoint, llm: &mut Script, body: &str) -> Answer {
    e.serve("POST", "/v1/completions", body, llm, &AlwaysWanted)
        .await
        .unwrap_or_else(|(stop, _)| panic!("the episode ended: {stop:?}"))
}

/// Requests vLLM refuses (and that once panicked the job or failed it) are 400s the
/// program reads; their records are short whatever the body; none reaches the
/// backend.
#[tokio::test]
async fn malformed_calls_are_refused_and_recorded_short() {
    let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
    let mut llm = Script {
        model: model.clone(),
        texts: vec!["One.".into()],
        prompts: Vec::new(),
    };
    let mut e = endpoint(&model);
    let vocab = model.tokenizer.vocab_size() as u64;
    let huge = "x".repeat(4 << 20);
    for (body, param) in [
        // It panicked RUN ("a turn has a part"), and the job was run again.
        (json!({"prompt": [5, 6], "max_tokens": 0}), "max_tokens"),
        // The backend refused it, which failed the job.
        (json!({"prompt": [5, vocab]}), "prompt"),
        (json!({"prompt": [5], "stop": [""]}), "stop"),
        (json!({"prompt": [5], "user": huge}), ""),
        (json!({"prompt": [5], "max_tokens": huge}), "max_tokens"),
    ] {
        let mut body = body.to_string();
        if param.is_empty() {
            // A body past its JSON (trailing bytes) is not a request.
            body.push_str(" trailing");
        }
        let a = serve(&mut e, &mut llm, &body).await;
        assert_eq!(a.status, 400, "{}", a.body);
        let j: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(j["error"]["type"], "BadRequestError", "{j}");
        if !param.is_empty() {
            assert_eq!(j["error"]["param"], param, "{j}");
        }
        assert!(a.body.len() < 4096, "{}", a.body.len());
    }
    assert!(llm.prompts.is_empty(), "a refused call reached the backend");
    assert_eq!(
        serve(&mut e, &mut llm, &json!({"prompt": [5, 6]}).to_string())
            .await
            .status,
        200
    );
    let run = e.finish(ProgramEnd::Exited).await;
    assert_eq!(run.trajectory.finish_reason, Some(FinishReason::Exited));
    assert_eq!(run.calls.len(), 6);
    for c in &run.calls[..5] {
        assert_eq!(c.sample, None);
        let head = c.request["head"].as_str().unwrap();
        assert!(head.len() <= REFUSED_BODY_HEAD, "{}", head.len());
        assert!(c.request["bytes"].as_u64().unwrap() >= head.len() as u64);
    }
    assert!(run.calls[3].request["bytes"].as_u64().unwrap() > 4 << 20);
    assert_eq!(run.calls[5].merge, Some(Merge::First));
    let record = serde_json::to_string(&run).unwrap();
    assert!(record.len() < 64 << 10, "{}", record.len());
}

/// The call that reaches the cap on refused calls ends the episode, for its own
/// reason unless a limit refused a call.
#[tokio::test]
async fn refused_calls_are_capped() {
    let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
    let mut llm = Script {
        model: model.clone(),
        texts: Vec::new(),
        prompts: Vec::new(),
    };
    let mut e = endpoint(&model);
    e.ep.max_refused_calls = 3;
    let bad = json!({"prompt": [5], "n": 0}).to_string();
    for _ in 0..2 {
        assert_eq!(serve(&mut e, &mut llm, &bad).await.status, 400);
    }
    // Not a model call: neither recorded nor counted.
    let missing = e
        .serve("POST", "/v1/embeddings", "{}", &mut llm, &AlwaysWanted)
        .await
        .unwrap();
    assert_eq!(missing.status, 404);
    let wrong = e
        .serve("GET", "/v1/completions", "", &mut llm, &AlwaysWanted)
        .await
        .unwrap();
    assert_eq!(wrong.status, 405);
    let Err((EndpointStop::Refusals, last)) = e
        .serve("POST", "/v1/completions", &bad, &mut llm, &AlwaysWanted)
        .await
    else {
        panic!("the third refused call did not end the episode");
    };
    assert_eq!(last.status, 400);
    assert!(last.body.contains("the episode ends here"), "{}", last.body);
    let run = e.finish(ProgramEnd::Refused).await;
    assert_eq!(run.calls.len(), 3);
    assert_eq!(
        run.trajectory.finish_reason,
        Some(FinishReason::RefusedCalls)
    );
}

/// A call the endpoint panics on (here: the generator has no answer scripted) is
/// refused, not the end of the job.
#[tokio::test]
async fn a_panic_while_serving_is_a_refused_call() {
    let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
    let mut llm = Script {
        model: model.clone(),
        texts: Vec::new(),
        prompts: Vec::new(),
    };
    let mut e = endpoint(&model);
    let a = serve(&mut e, &mut llm, &json!({"prompt": [5, 6]}).to_string()).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("the endpoint failed"), "{}", a.body);
    let run = e.finish(ProgramEnd::Exited).await;
    assert_eq!(run.calls.len(), 1);
    assert_eq!(run.calls[0].route, "completions");
}
