//! Which backend a job is placed on: the decision itself, a pure function of the
//! candidates' weights, loads and group membership. The store calls [`choose`] inside
//! the transaction that reads the counts and writes the assignment, so it lives with
//! the domain types rather than with the pool's I/O (see `backends::pool`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::backend::BackendSpec;

/// How strongly a group sticks to its backend.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AffinityPolicy {
    /// How far above its fair share (as a fraction of it) a backend may go to keep a
    /// group together: 0.25 lets a backend whose fair share is 40 jobs run 50.
    pub slack: f64,
    /// Jobs a backend may run above its fair share regardless of `slack`, so the first
    /// groups of a batch (when every fair share is tiny) still stay together; about one
    /// group's size.
    pub margin: f64,
}

impl Default for AffinityPolicy {
    fn default() -> Self {
        AffinityPolicy {
            slack: 0.25,
            margin: 8.0,
        }
    }
}

/// A backend the job may use, with its load.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its id.
    pub id: String,
    /// Its relative capacity (above 0).
    pub weight: f64,
    /// Jobs assigned to it now, not counting the job being placed.
    pub active: i64,
    /// Of those, jobs of the same prompt group as the job being placed.
    pub group_members: i64,
    /// Whether the group's last sample was placed here: its prompt is in this backend's
    /// cache even when none of its samples is running any more.
    pub group_home: bool,
}

/// Why a backend was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The job already used it (a later turn, or a retried RUN).
    Sticky,
    /// Its prompt group runs there.
    Group,
    /// It had the lowest weighted load.
    LeastLoaded,
}

/// What a job asks of the pool.
#[derive(Debug, Clone)]
pub struct AssignRequest {
    /// The job.
    pub job_id: String,
    /// Its prompt group (`batch/group`): samples of one group prefer one backend.
    pub group_key: Option<String>,
    /// The model it needs; when `None`, the model of its previous assignment, or any.
    pub model: Option<String>,
    /// Backends not to use (they just failed this job).
    pub exclude: Vec<String>,
    /// How strongly groups stick together.
    pub policy: AffinityPolicy,
}

/// The backend a job got.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// The backend.
    pub backend: BackendSpec,
    /// Why it was chosen.
    pub reason: Reason,
    /// The job's previous backend, when this assignment replaced another.
    pub previous: Option<String>,
}

/// Whether `c` may take one more job without going over its fair share of all the jobs
/// running on the candidates (`total` of them, the new one not included).
pub fn within_fair_share(
    c: &Candidate,
    total: i64,
    weight_sum: f64,
    policy: &AffinityPolicy,
) -> bool {
    if weight_sum <= 0.0 {
        return false;
    }
    let fair = (total + 1) as f64 * c.weight / weight_sum;
    (c.active + 1) as f64 <= fair * (1.0 + policy.slack) + policy.margin
}

/// Picks a backend among `candidates` (all healthy and serving the job's model): the
/// one running most of the job's prompt group — or, when none of the group runs, the one
/// its last sample went to — if it is within its fair share; otherwise the one with the
/// lowest load per unit of weight (ties to the earliest). `None` when there is no
/// candidate.
pub fn choose(candidates: &[Candidate], policy: &AffinityPolicy) -> Option<(usize, Reason)> {
    if candidates.is_empty() {
        return None;
    }
    let total: i64 = candidates.iter().map(|c| c.active).sum();
    let weight_sum: f64 = candidates.iter().map(|c| c.weight).sum();
    let group_home = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.group_members > 0 || c.group_home)
        .max_by(|(ia, a), (ib, b)| {
            a.group_members
                .cmp(&b.group_members)
                .then_with(|| a.group_home.cmp(&b.group_home))
                // Among equals, the lower-loaded (then the earlier) one wins.
                .then_with(|| load(b).total_cmp(&load(a)))
                .then_with(|| ib.cmp(ia))
        });
    if let Some((i, c)) = group_home
        && within_fair_share(c, total, weight_sum, policy)
    {
        return Some((i, Reason::Group));
    }
    let (i, _) = candidates
        .iter()
        .enumerate()
        .min_by(|(ia, a), (ib, b)| {
            load_after(a)
                .total_cmp(&load_after(b))
                .then_with(|| ia.cmp(ib))
        })
        .expect("not empty");
    Some((i, Reason::LeastLoaded))
}

fn load(c: &Candidate) -> f64 {
    c.active as f64 / c.weight
}

fn load_after(c: &Candidate) -> f64 {
    (c.active + 1) as f64 / c.weight
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, weight: f64, active: i64, group: i64) -> Candidate {
        Candidate {
            id: id.into(),
            weight,
            active,
            group_members: group,
            group_home: false,
        }
    }

    #[test]
    fn least_loaded_by_weight_when_no_group_runs() {
        let c = [
            cand("a", 1.0, 3, 0),
            cand("b", 2.0, 4, 0),
            cand("c", 1.0, 2, 0),
        ];
        // Loads after one more: a 4, b 2.5, c 3.
        assert_eq!(
            choose(&c, &AffinityPolicy::default()),
            Some((1, Reason::LeastLoaded))
        );
        assert_eq!(choose(&[], &AffinityPolicy::default()), None);
    }

    #[test]
    fn a_group_stays_together_until_its_backend_is_over_its_share() {
        let p = AffinityPolicy {
            slack: 0.25,
            margin: 2.0,
        };
        // The group's first sample went to `b`; the next follow it although `a` is idle.
        let c = [cand("a", 1.0, 0, 0), cand("b", 1.0, 1, 1)];
        assert_eq!(choose(&c, &p), Some((1, Reason::Group)));
        // Fair share of b with 20 running (+1) on two backends: 10.5 × 1.25 + 2 = 15.1.
        let c = [cand("a", 1.0, 5, 0), cand("b", 1.0, 15, 3)];
        assert_eq!(choose(&c, &p), Some((0, Reason::LeastLoaded)));
        let c = [cand("a", 1.0, 6, 0), cand("b", 1.0, 14, 3)];
        assert_eq!(choose(&c, &p), Some((1, Reason::Group)));
    }

    #[test]
    fn the_backend_holding_most_of_the_group_is_its_home() {
        let c = [
            cand("a", 1.0, 4, 1),
            cand("b", 1.0, 4, 3),
            cand("c", 1.0, 0, 0),
        ];
        assert_eq!(
            choose(&c, &AffinityPolicy::default()),
            Some((1, Reason::Group))
        );
    }

    #[test]
    fn a_group_returns_to_its_home_when_none_of_it_runs() {
        let mut c = [cand("a", 1.0, 0, 0), cand("b", 1.0, 3, 0)];
        c[1].group_home = true;
        assert_eq!(
            choose(&c, &AffinityPolicy::default()),
            Some((1, Reason::Group))
        );
        // Running members outweigh a stale home.
        c[0].group_members = 1;
        assert_eq!(
            choose(&c, &AffinityPolicy::default()),
            Some((0, Reason::Group))
        );
    }

    #[test]
    fn groups_spread_evenly_over_equal_backends() {
        // Place 8 groups of 8 one sample at a time (as run workers would), never
        // releasing: every backend ends with two whole groups.
        let p = AffinityPolicy::default();
        let mut c: Vec<Candidate> = (0..4).map(|i| cand(&format!("b{i}"), 1.0, 0, 0)).collect();
        let mut homes = vec![Vec::new(); 4];
        for g in 0..8 {
            for cand in c.iter_mut() {
                cand.group_members = 0;
            }
            for _ in 0..8 {
                let (i, _) = choose(&c, &p).unwrap();
                c[i].active += 1;
                c[i].group_members += 1;
                if !homes[i].contains(&g) {
                    homes[i].push(g);
                }
            }
        }
        assert!(c.iter().all(|x| x.active == 16), "{c:?}");
        assert!(homes.iter().all(|h| h.len() == 2), "{homes:?}");
    }
}
