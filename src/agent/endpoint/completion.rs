//! Completion calls: the prompt is the agent's tokens, or its text tokenized, and the
//! answer is the text generated after it.

use std::time::Instant;

use serde_json::{Value, json};

use super::{Answer, Endpoint, EndpointStop, Merge, ModelCall};
use crate::agent::episode::TurnGuard;
use crate::agent::openai::{self, ApiError};
use crate::agent::trajectory::FinishReason;
use crate::backends::generate::Generator;
use crate::backends::wire::Finish;

impl Endpoint {
    pub(super) async fn completion(
        &mut self,
        body: &str,
        llm: &mut dyn Generator,
        guard: &dyn TurnGuard,
    ) -> Result<Answer, (EndpointStop, Answer)> {
        const ROUTE: &str = "completions";
        let t_call = Instant::now();
        let vocab = self.ep.model.tokenizer.vocab_size();
        let checked = openai::parse::<openai::CompletionRequest>(body)
            .and_then(|req| req.check(vocab).map(|stop| (req, stop)));
        let (req, stop) = match checked {
            Ok(r) => r,
            Err(e) => return self.refuse(ROUTE, body, None, e),
        };
        if let Some(e) = self.call_limit() {
            return self.refuse(ROUTE, body, Some(FinishReason::MaxTurns), e);
        }
        let openai::CompletionRequest {
            prompt,
            max_tokens,
            stream,
            ..
        } = req;
        let ids = match prompt {
            openai::Prompt::Tokens(ids) => Ok(ids),
            // A long text takes a while to tokenize: not on the runtime's threads.
            openai::Prompt::Text(text) => {
                let model = self.ep.model.clone();
                tokio::task::spawn_blocking(move || model.tokenizer.encode(&text))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
            // Refused by the check above; kept total.
            openai::Prompt::Batch(_) | openai::Prompt::Invalid(_) => Ok(Vec::new()),
        };
        let ids = match ids {
            Ok(ids) if !ids.is_empty() => ids,
            Ok(_) => {
                let e = ApiError::bad("prompt", "must not be empty");
                return self.refuse(ROUTE, body, None, e);
            }
            Err(why) => return self.refuse(ROUTE, body, None, ApiError::bad("prompt", why)),
        };
        let asked = max_tokens.and_then(|m| u64::try_from(m).ok());
        let (generated, llm_us, versions) = match self
            .generate(ROUTE, body, &ids, asked, stop, llm, guard)
            .await?
        {
            Ok(g) => g,
            Err(answer) => return Ok(answer),
        };
        let request: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let all = generated.generation.token_ids.clone();
        let text = self.ep.model.tokenizer.decode(&all).unwrap_or_default();
        let cut = generated.generation.finish == Finish::Length;
        let finish = openai::finish_reason(cut, false);
        let index = self.calls.len();
        let (sample, turn, merge, obs, diverges) =
            self.assemble(&ids, generated, llm_us, versions, &text, t_call);
        let reason = (merge == Merge::New).then(|| match diverges {
            Some(at) => format!("its prompt extends no earlier call's tokens (it differs from the last sample's at token {at})"),
            None => "its prompt extends no earlier call's tokens".to_string(),
        });
        self.calls.push(ModelCall {
            route: ROUTE.into(),
            sample: Some(sample),
            turn: Some(turn),
            merge: Some(merge),
            reason,
            observation_tokens: obs,
            prompt_tokens: ids.len(),
            drift: None,
            continues: None,
            request,
            reply: json!({"text": text}),
            finish_reason: Some(finish.into()),
        });
        let (body, content_type) = openai::completion_reply(
            &format!("cmpl-{index}"),
            &self.ep.model_name,
            &text,
            finish,
            openai::usage(ids.len(), all.len()),
            stream.unwrap_or(false),
        );
        Ok(Answer {
            status: 200,
            content_type,
            body,
        })
    }
}
