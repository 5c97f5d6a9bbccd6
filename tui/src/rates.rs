//! Per-second rates from counters sampled at known instants.

use std::time::Instant;

/// Turns successive readings of one counter into a rate.
#[derive(Debug, Clone, Default)]
pub struct CounterRate {
    previous: Option<(Instant, f64)>,
}

impl CounterRate {
    /// Records `value` read at `at`; returns the rate since the previous
    /// reading. `None` on the first reading, after a gap in readings
    /// (`value` absent), when no time passed, or when the counter went down
    /// (the server restarted and its counters began again).
    pub fn update(&mut self, at: Instant, value: Option<f64>) -> Option<f64> {
        let Some(value) = value else {
            self.previous = None;
            return None;
        };
        let rate = self.previous.and_then(|(before, old)| {
            let seconds = at.checked_duration_since(before)?.as_secs_f64();
            (seconds > 0.0 && value >= old).then(|| (value - old) / seconds)
        });
        self.previous = Some((at, value));
        rate
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rate_is_difference_over_elapsed_time() {
        let start = Instant::now();
        let mut rate = CounterRate::default();
        assert_eq!(rate.update(start, Some(100.0)), None);
        // 150 more tokens in 2 s: 75 tokens/s.
        assert_eq!(
            rate.update(start + Duration::from_secs(2), Some(250.0)),
            Some(75.0)
        );
        // Counter reset: no rate, but the next one counts from the new base.
        assert_eq!(
            rate.update(start + Duration::from_secs(3), Some(10.0)),
            None
        );
        assert_eq!(
            rate.update(start + Duration::from_secs(4), Some(30.0)),
            Some(20.0)
        );
        // A missing reading breaks the chain.
        assert_eq!(rate.update(start + Duration::from_secs(5), None), None);
        assert_eq!(
            rate.update(start + Duration::from_secs(6), Some(40.0)),
            None
        );
        // No time elapsed: no rate rather than a division by zero.
        assert_eq!(
            rate.update(start + Duration::from_secs(6), Some(50.0)),
            None
        );
    }
}
