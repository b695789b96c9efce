//! The `synthetic` task kind: the workload for tests and benchmarks.
//!
//! It does no real work. Each stage waits a configured time (`init_ms`, `run_ms`,
//! `eval_ms`), EVAL gives a configured `reward` or, with a `seed`, a reproducible 0 or 1
//! (so the samples of a group can disagree, as real rollouts do). For a realistic RL
//! workload a prompt has a `pass_rate` (each sample passes with that chance, so a group
//! of an easy or a hard prompt is often uniform) and RUN a long tail (`run_sigma`: the
//! run time is log-normal around `run_ms`, so a batch has stragglers). A task can be told
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

use crate::domain::Stage;
use crate::stage::{EvalOutput, InitOutput, Route, SpecError, StageContext, StageError, TaskKind};

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
    /// The chance (0 to 1) that a sample passes (reward 1, else 0): the prompt's
    /// difficulty. Each sample draws on its own, from `seed` when it has one
    /// (reproducible), otherwise from its job id. `reward` wins over it.
    pub pass_rate: Option<f64>,
    /// The spread of RUN's time: `run_ms` becomes the median of a log-normal whose σ
    /// this is (0 or absent: always `run_ms`), drawn as `pass_rate` is. σ = 1 is a long
    /// tail: one sample in twenty takes over 5× the median, one in a hundred over 10×.
    pub run_sigma: Option<f64>,
}

impl SyntheticSpec {
    /// The reward EVAL gives the sample whose job id is `job_id`.
    pub fn reward(&self, job_id: &str) -> f64 {
        match (self.reward, self.pass_rate, self.seed) {
            (Some(r), _, _) => r,
            (None, Some(p), _) => f64::from(u8::from(unit(self.draw(job_id, REWARD)) < p)),
            (None, None, Some(seed)) => f64::from(u8::from(splitmix64(seed) & 1 == 1)),
            (None, None, None) => 1.0,
        }
    }

    /// How long RUN takes for the sample whose job id is `job_id`.
    pub fn run_time(&self, job_id: &str) -> Duration {
        let median = Duration::from_millis(self.run_ms);
        match self.run_sigma {
            Some(sigma) if sigma > 0.0 => {
                let z = standard_normal(self.draw(job_id, RUN_TIME));
                // σ ≤ 5 (validated) keeps the factor finite; a time past what a
                // Duration holds saturates (the stage timeout ends it long before).
                Duration::try_from_secs_f64(median.as_secs_f64() * (sigma * z).exp())
                    .unwrap_or(Duration::MAX)
            }
            _ => median,
        }
    }

    /// The sample's own random number for `purpose`: from its seed if it has one,
    /// otherwise from its job id.
    fn draw(&self, job_id: &str, purpose: u64) -> u64 {
        let source = self.seed.unwrap_or_else(|| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            job_id.hash(&mut h);
            h.finish()
        });
        splitmix64(source ^ purpose)
    }
}

/// What a draw is for, so a sample's reward and run time are independent.
const REWARD: u64 = 0x5245_5741_5244;
const RUN_TIME: u64 = 0x5255_4e54_494d;

/// A uniform number in [0, 1) from 64 random bits (their top 53).
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// A standard normal number from 64 random bits (Box–Muller over their two halves).
fn standard_normal(bits: u64) -> f64 {
    let u1 = 1.0 - unit(splitmix64(bits)); // in (0, 1]: the logarithm is finite
    let u2 = unit(bits);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
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
    async fn stage(spec: &SyntheticSpec, stage: Stage, time: Duration) -> Result<(), StageError> {
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
        if !time.is_zero() {
            tokio::time::sleep(time).await;
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
        let bad = |path: &str, message: &str| {
            Err(SpecError {
                path: path.into(),
                message: message.into(),
            })
        };
        if s.reward.is_some_and(|r| !r.is_finite()) {
            return bad("reward", "must be a finite number");
        }
        if s.pass_rate.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
            return bad("pass_rate", "must be between 0 and 1");
        }
        if s.run_sigma.is_some_and(|v| !(0.0..=5.0).contains(&v)) {
            return bad("run_sigma", "must be between 0 and 5");
        }
        Ok(())
    }

    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError> {
        let spec = Self::spec(ctx)?;
        Self::stage(&spec, Stage::Init, Duration::from_millis(spec.init_ms)).await?;
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
        Self::stage(&spec, Stage::Run, spec.run_time(&ctx.job.id)).await?;
        Ok(serde_json::json!({"node": ctx.node, "answer": "synthetic"}))
    }

    async fn eval(&self, ctx: &StageContext) -> Result<EvalOutput, StageError> {
        let spec = Self::spec(ctx)?;
        Self::stage(&spec, Stage::Eval, Duration::from_millis(spec.eval_ms)).await?;
        Ok(EvalOutput {
            reward: spec.reward(&ctx.job.id),
            details: serde_json::json!({"seed": spec.seed, "pass_rate": spec.pass_rate}),
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
                .reward("j")
            })
            .collect();
        assert!(rewards.iter().all(|r| *r == 0.0 || *r == 1.0));
        assert!(rewards.contains(&0.0) && rewards.contains(&1.0));
        let again = SyntheticSpec {
            seed: Some(3),
            ..Default::default()
        };
        assert_eq!(
            again.reward("other"),
            rewards[3],
            "the seed decides, not the job"
        );
        let fixed = SyntheticSpec {
            seed: Some(3),
            reward: Some(0.25),
            ..Default::default()
        };
        assert_eq!(fixed.reward("j"), 0.25);
    }

    #[test]
    fn samples_pass_at_their_prompts_rate_each_on_its_own() {
        for p in [0.0, 0.1, 0.5, 0.9, 1.0] {
            let spec = SyntheticSpec {
                pass_rate: Some(p),
                ..Default::default()
            };
            let passed: f64 = (0..4000).map(|i| spec.reward(&format!("job-{i}"))).sum();
            let share = passed / 4000.0;
            assert!((share - p).abs() < 0.03, "pass rate {p}: {share}");
        }
        // A seeded sample is reproducible; the reward draw does not follow the coin.
        let seeded = |seed| SyntheticSpec {
            pass_rate: Some(0.5),
            seed: Some(seed),
            ..Default::default()
        };
        assert_eq!(seeded(9).reward("a"), seeded(9).reward("b"));
    }

    #[test]
    fn run_times_have_a_long_tail_around_the_median() {
        let spec = SyntheticSpec {
            run_ms: 100,
            run_sigma: Some(1.0),
            ..Default::default()
        };
        let mut times: Vec<Duration> = (0..4000)
            .map(|i| spec.run_time(&format!("job-{i}")))
            .collect();
        times.sort();
        let median = times[times.len() / 2].as_secs_f64();
        assert!((0.09..0.11).contains(&median), "median {median} s");
        let over =
            |k: f64| times.iter().filter(|t| t.as_secs_f64() > k * 0.1).count() as f64 / 4000.0;
        assert!((0.04..0.07).contains(&over(5.0)), "over 5x: {}", over(5.0));
        assert!(
            (0.005..0.02).contains(&over(10.0)),
            "over 10x: {}",
            over(10.0)
        );
        let fixed = SyntheticSpec {
            run_ms: 100,
            ..Default::default()
        };
        assert_eq!(fixed.run_time("x"), Duration::from_millis(100));
    }

    #[test]
    fn rates_and_spreads_out_of_range_are_refused() {
        for (spec, path) in [
            (serde_json::json!({"pass_rate": 1.5}), "pass_rate"),
            (serde_json::json!({"pass_rate": -0.1}), "pass_rate"),
            (serde_json::json!({"run_sigma": 9}), "run_sigma"),
        ] {
            assert_eq!(Synthetic.validate(&spec).unwrap_err().path, path);
        }
    }
}
