//! Per-request latency histograms for `/metrics` (Prometheus histograms from
//! the `prometheus-client` crate), with vLLM's names and bucket boundaries
//! under sparkrt's prefix, and a window of recent samples that `/v1/stats`
//! reads p50/p99 from.
//!
//! Timing happens in [`TimedSink`], which wraps a request's event sink: the
//! engine thread calls it when it schedules the sequence for the first
//! time, when it samples each token and when the sequence ends, so the
//! figures are when the engine produced them (before the HTTP write).
//! Each engine sequence counts once (a completions request with k prompts
//! counts k times, as in vLLM, where each prompt is its own request).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use std::borrow::Cow;

use prometheus_client::encoding::text::encode_registry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::engine::{Event, EventSink};

/// vLLM's `vllm:time_to_first_token_seconds` buckets.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `vllm:inter_token_latency_seconds` (formerly
/// `time_per_output_token_seconds`) buckets.
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-phase buckets (e2e, queue, prefill, decode).
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// One engine step: vLLM has no step histogram; these reach from a
/// millisecond decode step to a long prefill chunk.
const STEP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Samples kept for `/v1/stats`' percentiles (the most recent ones).
pub const RECENT_SAMPLES: usize = 1024;

/// 1, 2, 5, 10, 20, 50, … up to `max` (vLLM's `build_1_2_5_buckets`, for
/// the token-count histograms, sized by `max_model_len`).
pub fn one_two_five_buckets(max: usize) -> Vec<f64> {
    let mut buckets = Vec::new();
    let mut scale = 1usize;
    'outer: loop {
        for m in [1usize, 2, 5] {
            let value = m.saturating_mul(scale);
            if value > max {
                break 'outer;
            }
            buckets.push(value as f64);
        }
        match scale.checked_mul(10) {
            Some(s) => scale = s,
            None => break,
        }
    }
    buckets
}

/// The most recent samples of one latency, bounded.
#[derive(Debug, Default)]
struct Window {
    samples: VecDeque<f64>,
}

impl Window {
    fn push(&mut self, value: f64) {
        if self.samples.len() == RECENT_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
    }

    /// The nearest-rank p50 and p99 of the window; `None` while it is empty.
    fn percentiles(&self) -> Option<(f64, f64)> {
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            sorted[index]
        };
        Some((rank(0.50), rank(0.99)))
    }
}

/// p50 and p99 in seconds of the recent TTFT and ITL samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RecentLatency {
    pub ttft: Option<(f64, f64)>,
    pub itl: Option<(f64, f64)>,
}

/// The histograms, registered once; observed from the engine thread.
pub struct LatencyMetrics {
    registry: Registry,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    prompt_tokens: Histogram,
    generation_tokens: Histogram,
    prefill_step: Histogram,
    decode_step: Histogram,
    /// vLLM's deprecated twin of `inter_token_latency_seconds` (the same
    /// samples), which the stock vLLM dashboard still reads.
    time_per_output_token: Histogram,
    /// The `max_tokens` each sequence was given (vLLM's
    /// `request_max_num_generation_tokens`).
    max_generation_tokens: Histogram,
    /// Finished sequences by finish reason (`stop`, `length`, `abort`).
    success: Family<Vec<(String, String)>, Counter>,
    recent_ttft: Mutex<Window>,
    recent_itl: Mutex<Window>,
}

impl LatencyMetrics {
    /// Every family carries `model_name` = `model_name` (vLLM's label, which
    /// its dashboards filter on).
    pub fn new(max_model_len: usize, model_name: &str) -> LatencyMetrics {
        let histogram = |buckets: &[f64]| Histogram::new(buckets.iter().copied());
        let tokens = one_two_five_buckets(max_model_len);
        let metrics = LatencyMetrics {
            registry: Registry::default(),
            ttft: histogram(TTFT_BUCKETS),
            itl: histogram(ITL_BUCKETS),
            e2e: histogram(REQUEST_BUCKETS),
            queue: histogram(REQUEST_BUCKETS),
            prefill: histogram(REQUEST_BUCKETS),
            decode: histogram(REQUEST_BUCKETS),
            prompt_tokens: histogram(&tokens),
            generation_tokens: histogram(&tokens),
            prefill_step: histogram(STEP_BUCKETS),
            decode_step: histogram(STEP_BUCKETS),
            time_per_output_token: histogram(ITL_BUCKETS),
            max_generation_tokens: histogram(&tokens),
            success: Family::default(),
            recent_ttft: Mutex::default(),
            recent_itl: Mutex::default(),
        };
        metrics.registered(model_name)
    }

    fn registered(mut self, model_name: &str) -> LatencyMetrics {
        let rows: [(&str, &str, &Histogram); 12] = [
            (
                "time_to_first_token_seconds",
                "Time from the request's arrival to its first token.",
                &self.ttft,
            ),
            (
                "inter_token_latency_seconds",
                "Time between two consecutive tokens of a request.",
                &self.itl,
            ),
            (
                "e2e_request_latency_seconds",
                "Time from the request's arrival to its end.",
                &self.e2e,
            ),
            (
                "request_queue_time_seconds",
                "Time a request waited before its first scheduled step.",
                &self.queue,
            ),
            (
                "request_prefill_time_seconds",
                "Time from the first scheduled step to the first token.",
                &self.prefill,
            ),
            (
                "request_decode_time_seconds",
                "Time from the first token to the last.",
                &self.decode,
            ),
            (
                "request_prompt_tokens",
                "Prompt tokens of a request.",
                &self.prompt_tokens,
            ),
            (
                "request_generation_tokens",
                "Tokens generated for a request.",
                &self.generation_tokens,
            ),
            (
                "prefill_step_seconds",
                "Duration of an engine step that ran prompt tokens.",
                &self.prefill_step,
            ),
            (
                "decode_step_seconds",
                "Duration of an engine step that only decoded.",
                &self.decode_step,
            ),
            (
                "time_per_output_token_seconds",
                "Time between two consecutive tokens (vLLM's older name of inter_token_latency_seconds; the same samples).",
                &self.time_per_output_token,
            ),
            (
                "request_max_num_generation_tokens",
                "The max_tokens a request was given.",
                &self.max_generation_tokens,
            ),
        ];
        let labels = [(
            Cow::Borrowed("model_name"),
            Cow::Owned(model_name.to_owned()),
        )];
        let mut registry = Registry::with_prefix_and_labels("sparkrt", labels.into_iter());
        for (name, help, histogram) in rows {
            registry.register(name, help, histogram.clone());
        }
        registry.register(
            "request_success",
            "Finished requests by finish reason: stop, length or abort.",
            self.success.clone(),
        );
        self.registry = registry;
        self
    }

    /// The histograms in the Prometheus text format (no `# EOF`: the rest
    /// of `/metrics` follows the 0.0.4 text format, which has none).
    pub fn encode(&self, out: &mut String) {
        // Writing into a String does not fail.
        let _ = encode_registry(out, &self.registry);
    }

    /// One engine step of `seconds`: a prefill step when it ran more tokens
    /// than it sampled (a prompt chunk), a decode step otherwise.
    pub fn observe_step(&self, seconds: f64, tokens: usize, sampled: usize) {
        if tokens == 0 {
            return;
        }
        if tokens > sampled {
            self.prefill_step.observe(seconds);
        } else {
            self.decode_step.observe(seconds);
        }
    }

    /// p50/p99 of the recent TTFT and ITL samples.
    pub fn recent(&self) -> RecentLatency {
        let read = |w: &Mutex<Window>| match w.lock() {
            Ok(w) => w.percentiles(),
            Err(poisoned) => poisoned.into_inner().percentiles(),
        };
        RecentLatency {
            ttft: read(&self.recent_ttft),
            itl: read(&self.recent_itl),
        }
    }

    fn first_token(&self, seconds: f64) {
        self.ttft.observe(seconds);
        push(&self.recent_ttft, seconds);
    }

    fn next_token(&self, seconds: f64) {
        self.itl.observe(seconds);
        self.time_per_output_token.observe(seconds);
        push(&self.recent_itl, seconds);
    }
}

fn push(window: &Mutex<Window>, value: f64) {
    match window.lock() {
        Ok(mut w) => w.push(value),
        Err(poisoned) => poisoned.into_inner().push(value),
    }
}

/// An event sink that times its sequence into [`LatencyMetrics`] and passes
/// every event on.
pub struct TimedSink<S> {
    inner: S,
    metrics: Arc<LatencyMetrics>,
    arrived: Instant,
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The sequence's `max_tokens`, observed when it ends.
    max_tokens: usize,
}

impl<S: EventSink> TimedSink<S> {
    /// `arrived`: when the HTTP request came in (TTFT and e2e count from it).
    pub fn new(inner: S, metrics: Arc<LatencyMetrics>, arrived: Instant) -> TimedSink<S> {
        TimedSink {
            inner,
            metrics,
            arrived,
            scheduled: None,
            first_token: None,
            last_token: None,
            max_tokens: 0,
        }
    }

    /// The sequence's `max_tokens` (for `request_max_num_generation_tokens`).
    pub fn with_max_tokens(mut self, max_tokens: usize) -> TimedSink<S> {
        self.max_tokens = max_tokens;
        self
    }

    fn on_token(&mut self, now: Instant) {
        match self.last_token {
            None => {
                self.first_token = Some(now);
                self.metrics
                    .first_token(now.duration_since(self.arrived).as_secs_f64());
            }
            Some(last) => self
                .metrics
                .next_token(now.duration_since(last).as_secs_f64()),
        }
        self.last_token = Some(now);
    }

    fn on_finished(
        &mut self,
        now: Instant,
        reason: &'static str,
        prompt_tokens: usize,
        completion_tokens: usize,
    ) {
        // A sequence whose only token ended it (end-of-sequence, a stop
        // token) sent no `Token` event: its first token is taken to be now.
        if self.first_token.is_none() && completion_tokens > 0 {
            self.on_token(now);
        }
        let m = &self.metrics;
        let seconds = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64();
        m.e2e.observe(seconds(self.arrived, now));
        let scheduled = self.scheduled.unwrap_or(now);
        m.queue
            .observe(seconds(self.arrived.min(scheduled), scheduled));
        if let Some(first) = self.first_token {
            m.prefill.observe(seconds(scheduled.min(first), first));
            m.decode
                .observe(seconds(first, self.last_token.unwrap_or(first)));
        }
        m.prompt_tokens.observe(prompt_tokens as f64);
        m.generation_tokens.observe(completion_tokens as f64);
        m.max_generation_tokens.observe(self.max_tokens as f64);
        m.success
            .get_or_create(&vec![("finished_reason".to_owned(), reason.to_owned())])
            .inc();
    }
}

impl<S: EventSink> EventSink for TimedSink<S> {
    fn send(&mut self, event: Event) -> bool {
        let now = Instant::now();
        match &event {
            Event::Token { .. } => self.on_token(now),
            Event::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
                ..
            } => self.on_finished(now, reason.as_str(), *prompt_tokens, *completion_tokens),
            _ => {}
        }
        self.inner.send(event)
    }

    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn scheduled(&mut self) {
        self.scheduled.get_or_insert_with(Instant::now);
        self.inner.scheduled();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_buckets_follow_one_two_five() {
        assert_eq!(
            one_two_five_buckets(100),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(
            one_two_five_buckets(1024),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
    }

    #[test]
    fn percentiles_are_nearest_rank_over_the_window() {
        let mut w = Window::default();
        assert_eq!(w.percentiles(), None);
        for v in 1..=100 {
            w.push(f64::from(v));
        }
        assert_eq!(w.percentiles(), Some((50.0, 99.0)));
        // The window keeps the latest RECENT_SAMPLES only.
        for _ in 0..RECENT_SAMPLES {
            w.push(7.0);
        }
        assert_eq!(w.percentiles(), Some((7.0, 7.0)));
    }

    #[test]
    fn a_timed_sequence_observes_each_histogram_once() {
        let metrics = Arc::new(LatencyMetrics::new(1024, "m"));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut sink = TimedSink::new(tx, Arc::clone(&metrics), Instant::now()).with_max_tokens(7);
        sink.scheduled();
        for id in 0..3 {
            assert!(sink.send(Event::Token {
                id,
                text: String::new(),
                logprob: None,
                hidden: None,
            }));
        }
        sink.send(Event::Finished {
            reason: crate::engine::FinishReason::Length,
            text: String::new(),
            stop_logprob: None,
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 0,
        });
        assert_eq!(rx.try_iter().count(), 4, "every event passed on");
        let mut text = String::new();
        metrics.encode(&mut text);
        for (name, count) in [
            ("time_to_first_token_seconds", 1),
            ("inter_token_latency_seconds", 2),
            ("e2e_request_latency_seconds", 1),
            ("request_queue_time_seconds", 1),
            ("request_prompt_tokens", 1),
        ] {
            let line = format!("sparkrt_{name}_count{{model_name=\"m\"}} {count}");
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        for line in [
            "sparkrt_request_prompt_tokens_sum{model_name=\"m\"} 5.0",
            "sparkrt_request_prompt_tokens_bucket{model_name=\"m\",le=\"2.0\"} 0",
            "sparkrt_request_prompt_tokens_bucket{model_name=\"m\",le=\"5.0\"} 1",
            "sparkrt_request_max_num_generation_tokens_sum{model_name=\"m\"} 7.0",
            "sparkrt_time_per_output_token_seconds_count{model_name=\"m\"} 2",
            "sparkrt_request_success_total{model_name=\"m\",finished_reason=\"length\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert_eq!(metrics.recent().ttft.map(|_| ()), Some(()));
    }
}
