//! `sparkrt bench --prefix-cache`: time to first token of a request whose
//! long prefix is already in the prefix cache against the same request
//! cold, measured side by side in one run.
//!
//! Each repeat draws a fresh prefix (`--prompt-len` tokens) and two
//! different suffixes (`--suffix-len` tokens). Cold: prefix + suffix A under
//! a salt no request used before, so nothing is cached. Cached: prefix +
//! suffix B under the same salt, right after: the prefix's full blocks are
//! cached by the cold request, only the rest is computed. One token is
//! generated; the time is from queueing the request to its first token.

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Result, bail};
use serde::Serialize;

use crate::backend::Backend;
use crate::engine::sampling::SamplingParams;
use crate::engine::{Engine, Event, Request};
use crate::runtime::Loaded;
use crate::util::rng::SplitMix64;

#[derive(Serialize)]
struct PrefixCacheReport {
    prefix_len: usize,
    suffix_len: usize,
    repeats: usize,
    cold_ttft_s: f64,
    cached_ttft_s: f64,
    /// cold_ttft_s ÷ cached_ttft_s.
    speedup: f64,
    /// Prompt tokens the cached request took from the cache (last repeat).
    cached_tokens: usize,
    backend: &'static str,
    threads: usize,
}

/// Runs one request to its first token: (seconds, prompt tokens it took
/// from the cache).
fn first_token(engine: &mut Engine<'_>, prompt: Vec<u32>, salt: &str) -> Result<(f64, usize)> {
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    engine.add_request(
        Request::new(prompt, SamplingParams::greedy(1))
            .with_ignore_eos(true)
            .with_cache_salt(Some(salt.to_string())),
        Box::new(tx),
    )?;
    let mut ttft = None;
    let mut cached = 0;
    while engine.has_work() {
        engine.step()?;
        for event in rx.try_iter() {
            match event {
                Event::Token { .. } => {
                    ttft.get_or_insert_with(|| start.elapsed().as_secs_f64());
                }
                Event::Finished { cached_tokens, .. } => cached = cached_tokens,
                Event::Failed { message } => bail!("bench request failed: {message}"),
                _ => {}
            }
        }
    }
    match ttft {
        Some(seconds) => Ok((seconds, cached)),
        None => bail!("the bench request produced no token"),
    }
}

/// What `bench --prefix-cache` measures (from its flags).
pub(super) struct PrefixBench {
    /// The shared prefix (`--prompt-len`).
    pub prefix_len: usize,
    /// New tokens after it (`--suffix-len`).
    pub suffix_len: usize,
    pub repeats: usize,
    pub json: bool,
}

pub(super) fn measure<B: Backend>(args: &PrefixBench, loaded: &Loaded<B>) -> Result<ExitCode> {
    let (prefix_len, suffix_len) = (args.prefix_len, args.suffix_len);
    if suffix_len == 0 {
        bail!("--suffix-len must be at least 1");
    }
    if prefix_len + suffix_len + 1 > loaded.plan.serving.max_model_len {
        bail!(
            "--prompt-len + --suffix-len + 1 = {} exceeds max_model_len = {} of the profile",
            prefix_len + suffix_len + 1,
            loaded.plan.serving.max_model_len
        );
    }
    if !loaded.plan.serving.enable_prefix_caching {
        bail!("--prefix-cache measures the prefix cache; drop --no-prefix-caching");
    }
    let source = loaded.source();
    let mut engine = loaded.engine(&source)?;
    let vocab = engine.vocab_size() as u64;
    let mut rng = SplitMix64::new(42);
    let mut draw =
        |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect() };
    let (mut cold, mut cached) = (Vec::new(), Vec::new());
    let mut cached_tokens = 0;
    // Round 0 warms up (untimed).
    for round in 0..=args.repeats {
        let prefix = draw(prefix_len);
        let (a, b) = (draw(suffix_len), draw(suffix_len));
        let salt = format!("bench-prefix-cache-{round}");
        let (cold_s, cold_hit) = first_token(&mut engine, [prefix.clone(), a].concat(), &salt)?;
        let (hit_s, hit) = first_token(&mut engine, [prefix, b].concat(), &salt)?;
        if cold_hit != 0 {
            bail!("the cold request took {cold_hit} tokens from the cache");
        }
        if round > 0 {
            cold.push(cold_s);
            cached.push(hit_s);
            cached_tokens = hit;
        }
    }
    let (cold_ttft_s, cached_ttft_s) = (median(&mut cold), median(&mut cached));
    let report = PrefixCacheReport {
        prefix_len,
        suffix_len,
        repeats: args.repeats,
        cold_ttft_s,
        cached_ttft_s,
        speedup: cold_ttft_s / cached_ttft_s.max(f64::MIN_POSITIVE),
        cached_tokens,
        backend: loaded.backend.name(),
        threads: rayon::current_num_threads(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "prefix cache: {} cached + {} new tokens, {} repeats, {} backend, {} threads",
            report.prefix_len, report.suffix_len, report.repeats, report.backend, report.threads
        );
        println!(
            "  cold TTFT (median)      {:>10.1} ms",
            1e3 * report.cold_ttft_s
        );
        println!(
            "  cached TTFT (median)    {:>10.1} ms  ({} prompt tokens from the cache)",
            1e3 * report.cached_ttft_s,
            report.cached_tokens
        );
        println!("  cold ÷ cached           {:>10.1}×", report.speedup);
    }
    Ok(ExitCode::SUCCESS)
}

/// The median of `values` (sorted in place); 0 for none.
pub(super) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
