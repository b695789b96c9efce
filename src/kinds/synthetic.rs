//! The `synthetic` task kind: the workload for tests and benchmarks.
//!
//! It does no real work. Each stage waits a configured time (`init_ms`, `run_ms`,
//! `eval_ms`), EVAL gives a configured `reward` or, with a `seed`, a reproducible 0 or 1
//! (so the samples of a group can disagree, as real rollouts do), and a task can be told
//! to misbehave in a named stage: `fail_in` (a permanent error), `hang_in` (never return,
//! to exercise timeouts and cancel) or `flaky_in` (a transient error on every attempt, to
//! exhaust the delivery limit). With `node_bound`, RUN is routed to the node that ran
//! INIT, as a sandboxed task's would be. It exists so the pipeline's behaviour and speed
//! can be measured without sandboxes or models; it says nothing about real rollouts.
//!
//! ```json
//! {"kind": "synthetic", "spec": {"run_ms": 100, "seed": 7}}
//! ```

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::{EvalOutput, InitOutput, Route, SpecError, StageContext, StageError, TaskKind};
use crate::domain::Stage;

/// The `synthetic` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Synthetic;

/// A synthetic task's `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyntheticSpec {
    /// INIT duration in ms.
    pub init_ms: u64,
    /// RUN duration in ms.
    pub run_ms: u64,
    /// EVAL duration in ms.
    pub eval_ms: u64,
    /// Fixed reward. Wins over `seed`.
    pub reward: Option<f64>,
    /// Seed of a reproducible 0/1 reward.
    pub seed: Option<u64>,
    /// Stage that fails permanently.
    pub fail_in: Option<Stage>,
    /// Stage that never returns.
    pub hang_in: Option<Stage>,
    /// Stage that fails transiently on every attempt.
    pub flaky_in: Option<Stage>,
    /// Error text for `fail_in` / `flaky_in`.
    pub message: Option<String>,
    /// Route RUN to the node that ran INIT.
    pub node_bound: bool,
}

impl SyntheticSpec {
    /// The reward EVAL gives.
    pub fn reward(&self) -> f64 {
        match (self.reward, self.seed) {
            (Some(r), _) => r,
            (None, Some(seed)) => (splitmix64(seed) & 1) as f64,
            (None, None) => 1.0,
        }
    }
}

/// One step of the SplitMix64 generator: a well-mixed 64-bit hash of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Synthetic {
    fn spec(ctx: &StageContext) -> Result<SyntheticSpec, StageError> {
        let spec = ctx.job.task.get("spec").cloned().unwrap_or_default();
        SpecError::parse(&spec).map_err(|e| StageError::Failed(format!("bad spec: {e}")))
    }

    /// The common part of every stage: misbehave if told to, then wait.
    async fn stage(spec: &SyntheticSpec, stage: Stage, ms: u64) -> Result<(), StageError> {
        let message = || {
            spec.message
                .clone()
                .unwrap_or_else(|| format!("synthetic failure in {stage}"))
        };
        if spec.fail_in == Some(stage) {
            return Err(StageError::Failed(message()));
        }
        if spec.flaky_in == Some(stage) {
            return Err(StageError::Transient(message()));
        }
        if spec.hang_in == Some(stage) {
            std::future::pending::<()>().await;
        }
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok(())
    }
}

#[async_trait]
impl TaskKind for Synthetic {
    fn name(&self) -> &'static str {
        "synthetic"
    }

    fn validate(&self, spec: &serde_json::Value) -> Result<(), SpecError> {
        let s: SyntheticSpec = SpecError::parse(spec)?;
        if let Some(r) = s.reward
            && !r.is_finite()
        {
            return Err(SpecError {
                path: "reward".into(),
                message: "must be a finite number".into(),
            });
        }
        Ok(())
    }

    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError> {
        let spec = Self::spec(ctx)?;
        Self::stage(&spec, Stage::Init, spec.init_ms).await?;
        Ok(InitOutput {
            output: serde_json::json!({"node": ctx.node}),
            route: if spec.node_bound {
                Route::ThisNode
            } else {
                Route::Any
            },
        })
    }

    async fn run(&self, ctx: &StageContext) -> Result<serde_json::Value, StageError> {
        let spec = Self::spec(ctx)?;
        Self::stage(&spec, Stage::Run, spec.run_ms).await?;
        Ok(serde_json::json!({"node": ctx.node, "answer": "synthetic"}))
    }

    async fn eval(&self, ctx: &StageContext) -> Result<EvalOutput, StageError> {
        let spec = Self::spec(ctx)?;
        Self::stage(&spec, Stage::Eval, spec.eval_ms).await?;
        Ok(EvalOutput {
            reward: spec.reward(),
            details: serde_json::json!({"seed": spec.seed}),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let e = Synthetic
            .validate(&serde_json::json!({"run_ms": -5}))
            .unwrap_err();
        assert_eq!(e.path, "run_ms");
        let e = Synthetic
            .validate(&serde_json::json!({"runms": 5}))
            .unwrap_err();
        assert!(e.message.contains("runms"), "{e}");
        let e = Synthetic
            .validate(&serde_json::json!({"fail_in": "nowhere"}))
            .unwrap_err();
        assert_eq!(e.path, "fail_in");
        assert!(Synthetic.validate(&serde_json::Value::Null).is_ok());
    }

    #[test]
    fn seeded_rewards_are_reproducible_and_mixed() {
        let rewards: Vec<f64> = (0..64)
            .map(|seed| {
                SyntheticSpec {
                    seed: Some(seed),
                    ..Default::default()
                }
                .reward()
            })
            .collect();
        assert!(rewards.iter().all(|r| *r == 0.0 || *r == 1.0));
        assert!(rewards.contains(&0.0) && rewards.contains(&1.0));
        let again = SyntheticSpec {
            seed: Some(3),
            ..Default::default()
        };
        assert_eq!(again.reward(), rewards[3]);
        let fixed = SyntheticSpec {
            seed: Some(3),
            reward: Some(0.25),
            ..Default::default()
        };
        assert_eq!(fixed.reward(), 0.25);
    }
}
