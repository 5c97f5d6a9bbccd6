//! The last few minutes of MemAvailable and of the runtime's total, for the
//! history chart.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryPoint {
    pub at: Instant,
    pub mem_available: u64,
    pub runtime_total: u64,
}

/// Points newer than `window` before the latest one.
#[derive(Debug, Clone)]
pub struct History {
    window: Duration,
    points: VecDeque<HistoryPoint>,
}

impl History {
    pub fn new(window: Duration) -> History {
        History {
            window,
            points: VecDeque::new(),
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    pub fn push(&mut self, point: HistoryPoint) {
        self.points.push_back(point);
        while let Some(oldest) = self.points.front() {
            if point.at.saturating_duration_since(oldest.at) > self.window {
                self.points.pop_front();
            } else {
                break;
            }
        }
    }

    pub fn points(&self) -> impl Iterator<Item = &HistoryPoint> {
        self.points.iter()
    }

    pub fn latest(&self) -> Option<&HistoryPoint> {
        self.points.back()
    }

    /// `(seconds before the latest point, value)` pairs, oldest first, as the
    /// chart wants them (x runs from −window to 0).
    pub fn series(&self, value: impl Fn(&HistoryPoint) -> f64) -> Vec<(f64, f64)> {
        let Some(latest) = self.latest() else {
            return Vec::new();
        };
        self.points
            .iter()
            .map(|p| {
                let age = latest.at.saturating_duration_since(p.at).as_secs_f64();
                (-age, value(p))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_points_older_than_the_window() {
        let start = Instant::now();
        let mut history = History::new(Duration::from_secs(10));
        for second in 0..=15u64 {
            history.push(HistoryPoint {
                at: start + Duration::from_secs(second),
                mem_available: second,
                runtime_total: 0,
            });
        }
        // Latest is t=15; t=5..=15 are within 10 s of it.
        let kept: Vec<u64> = history.points().map(|p| p.mem_available).collect();
        assert_eq!(kept, (5..=15).collect::<Vec<_>>());
        let series = history.series(|p| p.mem_available as f64);
        assert_eq!(series.first(), Some(&(-10.0, 5.0)));
        assert_eq!(series.last(), Some(&(0.0, 15.0)));
    }
}
