//! Points in time as the database keeps them: milliseconds since the Unix epoch.
//!
//! Every time the store reads or writes (a lease's end, a job's last change, a cut-off
//! for the reconciler) is an [`EpochMs`], and spans are added to it as [`Duration`]s, so
//! a setting in milliseconds (a `u64`) never meets a timestamp (an `i64`) through a bare
//! cast: the arithmetic saturates instead of wrapping, and a negative remainder is an
//! empty span, not a huge one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch, as the database columns hold them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct EpochMs(pub i64);

impl EpochMs {
    /// The latest representable time: a cut-off that takes everything.
    pub const MAX: EpochMs = EpochMs(i64::MAX);

    /// Now, by the system clock (0 if the clock is before 1970).
    ///
    /// Every timestamp in the database is taken here rather than by the database, so
    /// SQLite and Postgres rows are directly comparable and tests can reason about them
    /// without dialect-specific time functions.
    pub fn now() -> Self {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        EpochMs(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }

    /// `d` later (saturating).
    #[must_use]
    pub fn after(self, d: Duration) -> Self {
        EpochMs(self.0.saturating_add(span(d)))
    }

    /// `d` earlier (saturating).
    #[must_use]
    pub fn before(self, d: Duration) -> Self {
        EpochMs(self.0.saturating_sub(span(d)))
    }

    /// How long from `self` until `later`; zero when `later` is not later.
    pub fn until(self, later: EpochMs) -> Duration {
        Duration::from_millis(u64::try_from(later.0.saturating_sub(self.0)).unwrap_or(0))
    }

    /// The value as stored.
    pub const fn as_millis(self) -> i64 {
        self.0
    }
}

/// `d` in whole microseconds, as the `u64` that latencies are recorded and reported in.
///
/// [`Duration::as_micros`] returns a `u128`; a `u64` of microseconds holds over 500,000
/// years, so the saturation at `u64::MAX` only keeps a nonsensical duration from wrapping
/// around to a small one.
pub fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `d` in whole milliseconds, as the `u64` that timeouts and uptimes are sent as;
/// saturates at `u64::MAX` rather than wrapping, as [`duration_us`] does.
pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` in whole milliseconds as a timestamp difference (saturating at `i64::MAX`).
fn span(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl From<i64> for EpochMs {
    fn from(ms: i64) -> Self {
        EpochMs(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_negative_spans_are_empty() {
        let t = EpochMs(1_000);
        assert_eq!(t.after(Duration::from_millis(500)), EpochMs(1_500));
        assert_eq!(t.before(Duration::from_secs(2)), EpochMs(-1_000));
        assert_eq!(EpochMs::MAX.after(Duration::from_secs(1)), EpochMs::MAX);
        assert_eq!(t.after(Duration::MAX), EpochMs::MAX);
        assert_eq!(t.until(EpochMs(1_250)), Duration::from_millis(250));
        assert_eq!(
            t.until(EpochMs(10)),
            Duration::ZERO,
            "a lapsed time is no wait"
        );
        assert!(EpochMs::now() > EpochMs(1_600_000_000_000));
    }

    #[test]
    fn time_conversions_saturate_instead_of_wrapping() {
        assert_eq!(duration_us(Duration::from_millis(3)), 3_000);
        assert_eq!(duration_us(Duration::MAX), u64::MAX);
        assert_eq!(duration_ms(Duration::from_secs(2)), 2_000);
        assert_eq!(duration_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn it_is_a_plain_number_on_the_wire() {
        assert_eq!(serde_json::to_string(&EpochMs(42)).unwrap(), "42");
        assert_eq!(serde_json::from_str::<EpochMs>("-7").unwrap(), EpochMs(-7));
    }
}
