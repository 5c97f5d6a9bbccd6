//! `sparkrt bench`: prefill and decode speed against the machine's memory
//! bandwidth roofline, measured in one run, and the peak RSS against the
//! plan's components.
//!
//! The bandwidth is measured by reading the weights the process already
//! maps (those read every decode step first), so that the measurement
//! neither grows the process nor inflates its peak RSS.
//!
//! A performance model checkable on paper comes with the figures: weight
//! and KV bytes read per decode step and FLOPs per prefill token (from
//! `plan::memory` and `plan::perf`), turned into fractions of the memory
//! bandwidth and, on a GPU in `plan::perf`'s table, of its BF16
//! tensor-core peak.

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Result, bail};
use serde::Serialize;

use super::bench_prefix::{self, PrefixBench, median};
use super::common::{ModelArgs, ServingArgs, dummy_if_asked, resolve, set_threads};
use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::backend::cpu::kernels::measure_read_bandwidth_of;
use crate::backend::cuda::CudaBackend;
use crate::checkpoint::groups::group_of;
use crate::checkpoint::{Checkpoint, PageCachePolicy};
use crate::engine::sampling::SamplingParams;
use crate::engine::{Event, Request};
use crate::geometry::WeightGroup;
use crate::plan::Plan;
use crate::plan::memory::{
    self, decode_kv_bytes_per_step, decode_weight_bytes_per_step, expected_distinct_experts,
};
use crate::plan::perf::{
    DevicePeaks, activated_params_per_token, attention_flops_per_prompt_token, device_peaks,
    prefill_flops_per_token,
};
use crate::plan::profile::ValueSource;
use crate::runtime::{Loaded, LoadedModel};
use crate::units::format_bytes;
use crate::util::rng::SplitMix64;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    /// What the prompts are: `random` ids, or a `repeat`ed 32-token phrase
    /// (a workload where n-gram drafts can hold, for --speculative-config).
    #[arg(long, value_enum, default_value_t = PromptKind::Random)]
    pub prompt: PromptKind,
    /// Tokens generated per request (end-of-sequence ignored).
    #[arg(long = "gen", default_value_t = 64)]
    pub generate: usize,
    /// Sampling temperature, 0 to 2 (0: greedy). Above 0 each request
    /// samples with a seed of its own (42 + its index), the same every
    /// round and run; with --speculative-config, drafts are then kept by
    /// rejection sampling (a workload where n-gram drafts often fail).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Requests timed; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Requests run together (decode batch size); at most the profile's
    /// max_num_seqs (without a profile, the derived limits are raised to it).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Measure the prefix cache instead: time to first token of a request
    /// whose first --prompt-len tokens are cached against the same cold,
    /// with --suffix-len new tokens (see src/cli/bench_prefix.rs).
    #[arg(long)]
    pub prefix_cache: bool,
    /// New prompt tokens after the cached prefix (with --prefix-cache).
    #[arg(long, default_value_t = 32)]
    pub suffix_len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PromptKind {
    Random,
    Repeat,
}

/// Tokens of the phrase a `repeat` prompt repeats.
const REPEAT_PHRASE: usize = 32;

/// Bytes of mapped weights one bandwidth sweep reads.
const BANDWIDTH_BYTES: usize = 1 << 30;
/// Slack the peak RSS may exceed the plan's components by (issue 4).
const RSS_SLACK: f64 = 0.05;

/// Speculative decoding's drafts over every round (warm-up included).
#[derive(Serialize)]
struct SpeculativeBench {
    method: &'static str,
    num_speculative_tokens: usize,
    drafts: u64,
    draft_tokens: u64,
    accepted_tokens: u64,
}

#[derive(Serialize)]
struct BenchReport {
    /// Tokens the last round decoded per engine step after prefill (1 per
    /// sequence and pass without speculative decoding).
    tokens_per_decode_pass: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    speculative: Option<SpeculativeBench>,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    peak_rss_bytes: u64,
    /// What the peak RSS is held to: (weights + MoE workspace + activations
    /// + KV cache) × 1.05.
    rss_budget_bytes: u64,
    rss: RssComponents,
    bytes_per_token: u64,
    bandwidth_bytes_s: f64,
    roofline_tok_s: f64,
    /// decode_tok_s ÷ roofline_tok_s.
    roofline_fraction: f64,
    threads: usize,
    prompt_len: usize,
    generate: usize,
    repeats: usize,
    batch: usize,
    temperature: f32,
    backend: &'static str,
    /// The CPU kernels' instruction set (`SPARKRT_ISA` or the default).
    cpu_isa: &'static str,
    /// Kernel launches per decode step (CUDA), and that ÷ layers.
    launches_per_decode_step: Option<f64>,
    launches_per_layer: Option<f64>,
    /// Launches per decode step by kernel (CUDA).
    launches_by_kernel: Vec<(&'static str, f64)>,
    perf_model: PerfModel,
}

/// The model's work per step against the measured rates (see the README's
/// "Performance model").
#[derive(Serialize)]
struct PerfModel {
    /// Weight bytes one decode step reads at batch 1: every non-expert
    /// weight, top_k experts per MoE layer, one embedding row.
    weight_bytes_per_step_batch_1: u64,
    /// The same at `--batch` B: the distinct experts the batch's tokens
    /// are routed to, expected under uniform routing.
    weight_bytes_per_step: u64,
    /// E·(1 − (1 − k/E)^B) per MoE layer.
    distinct_experts_per_moe_layer: f64,
    /// Context the KV traffic is taken at: prompt + gen/2, the mean over
    /// the timed decode.
    kv_context_tokens: usize,
    /// KV bytes one decode step reads for the B sequences at that context.
    kv_bytes_per_step: u64,
    /// Recurrent-state bytes one decode step reads and writes for the B
    /// sequences (hybrid models; zero otherwise).
    state_bytes_per_step: u64,
    /// Parameters one token is multiplied by (lm_head and embedding aside).
    activated_params: u64,
    /// 2 × activated_params + attention at the prompt length.
    flops_per_prefill_token: f64,
    attention_flops_per_prefill_token: f64,
    /// decode tok/s ÷ B × (weights + KV + state per step).
    decode_bytes_s: f64,
    /// decode_bytes_s ÷ the read bandwidth (`None` when none was measured:
    /// a model smaller than one measuring pass).
    decode_bandwidth_fraction: Option<f64>,
    /// prefill tok/s × flops_per_prefill_token.
    prefill_flops_s: f64,
    /// The GPU's dense BF16 tensor-core peak (`None` off the table or on the CPU).
    tensor_core_peak_flops: Option<f64>,
    /// prefill_flops_s ÷ tensor_core_peak_flops.
    prefill_peak_fraction: Option<f64>,
}

impl PerfModel {
    fn of<B: Backend>(
        args: &BenchArgs,
        loaded: &Loaded<B>,
        rates: (f64, f64),
        bandwidth: f64,
        peaks: Option<DevicePeaks>,
    ) -> PerfModel {
        let (prefill_tok_s, decode_tok_s) = rates;
        let plan = &loaded.plan;
        let m = &plan.model;
        let geometry = &loaded.config.geometry;
        let per_step = |batch| {
            decode_weight_bytes_per_step(
                &plan.weights.groups,
                m.top_k,
                m.num_experts,
                m.vocab_size,
                batch,
            )
        };
        let kv_context_tokens = args.prompt_len + args.generate / 2;
        let kv_bytes_per_step = decode_kv_bytes_per_step(
            memory::full_attention_bytes_per_token(geometry, plan.kv_cache.dtype.bytes()),
            &plan.kv_cache.sliding,
            kv_context_tokens,
            args.batch,
        );
        let state_bytes_per_step =
            memory::decode_state_bytes_per_step(&plan.recurrent_state, args.batch);
        let weight_bytes_per_step = per_step(args.batch);
        let flops_per_prefill_token = prefill_flops_per_token(geometry, args.prompt_len);
        let decode_bytes_s = decode_tok_s / args.batch.max(1) as f64
            * (weight_bytes_per_step + kv_bytes_per_step + state_bytes_per_step) as f64;
        let prefill_flops_s = prefill_tok_s * flops_per_prefill_token;
        let tensor_core_peak_flops = peaks.map(|p| p.bf16_dense_flops);
        PerfModel {
            weight_bytes_per_step_batch_1: per_step(1),
            weight_bytes_per_step,
            distinct_experts_per_moe_layer: expected_distinct_experts(
                m.num_experts,
                m.top_k,
                args.batch,
            ),
            kv_context_tokens,
            kv_bytes_per_step,
            state_bytes_per_step,
            activated_params: activated_params_per_token(geometry),
            flops_per_prefill_token,
            attention_flops_per_prefill_token: attention_flops_per_prompt_token(
                geometry,
                args.prompt_len,
            ),
            decode_bytes_s,
            decode_bandwidth_fraction: (bandwidth > 0.0).then(|| decode_bytes_s / bandwidth),
            prefill_flops_s,
            tensor_core_peak_flops,
            prefill_peak_fraction: tensor_core_peak_flops.map(|peak| prefill_flops_s / peak),
        }
    }

    fn print(&self, batch: usize, prompt_len: usize) {
        println!("  performance model (README: Performance model)");
        println!(
            "    weights / decode step, batch 1   {:>14}",
            format_bytes(self.weight_bytes_per_step_batch_1)
        );
        if batch > 1 {
            println!(
                "    weights / decode step, batch {batch:<4}{:>14}  ({:.1} distinct experts / MoE layer)",
                format_bytes(self.weight_bytes_per_step),
                self.distinct_experts_per_moe_layer
            );
        }
        println!(
            "    KV / decode step at {} tokens  {:>14}",
            self.kv_context_tokens,
            format_bytes(self.kv_bytes_per_step)
        );
        if self.state_bytes_per_step > 0 {
            println!(
                "    state read + written / step      {:>14}",
                format_bytes(self.state_bytes_per_step)
            );
        }
        println!(
            "    activated parameters / token     {:>14}",
            si(self.activated_params as f64, "")
        );
        println!(
            "    FLOPs / prefill token at {prompt_len:<6}  {:>14}  (attention {})",
            si(self.flops_per_prefill_token, "FLOP"),
            si(self.attention_flops_per_prefill_token, "FLOP")
        );
        let reads = si(self.decode_bytes_s, "B/s");
        match self.decode_bandwidth_fraction {
            Some(fraction) => println!(
                "    decode reads                     {reads:>14}  = {:.1} % of the read bandwidth",
                100.0 * fraction
            ),
            None => println!(
                "    decode reads                     {reads:>14}  (no read bandwidth measured)"
            ),
        }
        let compute = si(self.prefill_flops_s, "FLOP/s");
        match (self.tensor_core_peak_flops, self.prefill_peak_fraction) {
            (Some(peak), Some(fraction)) => println!(
                "    prefill compute                  {compute:>14}  = {:.2} % of the {} BF16 tensor-core peak",
                100.0 * fraction,
                si(peak, "FLOP/s")
            ),
            _ => println!(
                "    prefill compute                  {compute:>14}  (no tensor-core peak known here)"
            ),
        }
    }
}

/// What bench reports of a backend beyond its ops: the GPU's name, its
/// spec bandwidth and its kernel launches; none of them on the CPU.
trait DeviceFacts {
    /// The GPU's name and architecture, `None` on the CPU.
    fn gpu(&self) -> Option<(&str, String)>;
    /// Peak memory bandwidth from the device's spec, bytes/s, when known.
    fn spec_bandwidth(&self) -> Option<f64>;
    /// Kernel launches so far, by kernel (empty off CUDA).
    fn launches_by_kernel(&self) -> Vec<(&'static str, u64)>;
}

impl DeviceFacts for CpuBackend {
    fn gpu(&self) -> Option<(&str, String)> {
        None
    }

    fn spec_bandwidth(&self) -> Option<f64> {
        None
    }

    fn launches_by_kernel(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

impl DeviceFacts for CudaBackend {
    fn gpu(&self) -> Option<(&str, String)> {
        Some((&self.info().name, self.info().arch()))
    }

    fn spec_bandwidth(&self) -> Option<f64> {
        self.peak_bandwidth()
    }

    fn launches_by_kernel(&self) -> Vec<(&'static str, u64)> {
        self.launch_counts()
    }
}

/// The plan's components the peak RSS is compared with.
#[derive(Serialize)]
struct RssComponents {
    weights_bytes: u64,
    moe_workspace_bytes: u64,
    activations_bytes: u64,
    kv_cache_bytes: u64,
}

impl RssComponents {
    fn of(plan: &Plan) -> RssComponents {
        RssComponents {
            weights_bytes: plan.weights.total,
            moe_workspace_bytes: plan.moe_workspace.bytes,
            activations_bytes: plan.activations.bytes,
            kv_cache_bytes: plan.kv_cache.bytes,
        }
    }

    fn total(&self) -> u64 {
        self.weights_bytes + self.moe_workspace_bytes + self.activations_bytes + self.kv_cache_bytes
    }
}

/// The mapped tensors, those every decode step reads first (they are
/// resident by now), then the experts, largest first within each.
fn weight_regions<'c, B: Backend>(checkpoint: &'c Checkpoint, loaded: &Loaded<B>) -> Vec<&'c [u8]> {
    let mut regions: Vec<(bool, &[u8])> = checkpoint
        .tensor_names()
        .filter_map(|name| {
            let expert =
                group_of(loaded.config.geometry.architecture, name) == Some(WeightGroup::Experts);
            Some((expert, checkpoint.tensor(name).ok()?.bytes()))
        })
        .collect();
    regions.sort_by_key(|&(expert, bytes)| (expert, std::cmp::Reverse(bytes.len())));
    regions.into_iter().map(|(_, bytes)| bytes).collect()
}

/// The highest --temperature (the OpenAI API's bound).
const MAX_TEMPERATURE: f32 = 2.0;

/// Request `index`'s sampling: greedy, or at the bench's temperature with
/// a seed of its own (the same draws every round).
fn bench_sampling(args: &BenchArgs, index: usize) -> SamplingParams {
    let greedy = SamplingParams::greedy(args.generate);
    if args.temperature > 0.0 {
        SamplingParams {
            temperature: args.temperature,
            seed: Some(42 + index as u64),
            ..greedy
        }
    } else {
        greedy
    }
}

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    set_threads(args.model.threads)?;
    if args.prompt_len == 0 || args.generate == 0 || args.repeats == 0 {
        bail!("--prompt-len, --gen and --repeats must be at least 1");
    }
    if !(0.0..=MAX_TEMPERATURE).contains(&args.temperature) {
        bail!(
            "--temperature {} is outside 0 to {MAX_TEMPERATURE}",
            args.temperature
        );
    }
    let (dir, mut profile) = resolve(&args.model, &args.serving)?;
    let (dir, _dummy) = dummy_if_asked(&args.model, &dir)?;
    // Limits neither the profile nor a flag set are raised to hold the
    // batch asked for (those set are kept as written).
    let sources = &profile.sources;
    if sources.get("max_num_seqs") == Some(&ValueSource::Default)
        && args.batch > profile.serving.max_num_seqs
    {
        profile.serving.max_num_seqs = args.batch;
        if sources.get("max_num_batched_tokens") == Some(&ValueSource::Default) {
            let tokens = &mut profile.serving.max_num_batched_tokens;
            *tokens = (*tokens).max(args.batch);
        }
    }
    let host = args.model.host();
    let loaded = LoadedModel::open_with(
        &dir,
        Some(&profile),
        &host,
        PageCachePolicy::WillNeed,
        &args.model.device_options(),
    )?;
    let prefix = PrefixBench {
        prefix_len: args.prompt_len,
        suffix_len: args.suffix_len,
        repeats: args.repeats,
        json: args.json,
    };
    match (&loaded, args.prefix_cache) {
        (LoadedModel::Cpu(loaded), true) => bench_prefix::measure(&prefix, loaded.as_ref()),
        (LoadedModel::Cuda(loaded), true) => bench_prefix::measure(&prefix, loaded.as_ref()),
        (LoadedModel::Cpu(loaded), false) => measure(args, loaded.as_ref()),
        (LoadedModel::Cuda(loaded), false) => measure(args, loaded.as_ref()),
    }
}

/// Times the requests and prints the report, on the loaded model's backend.
fn measure<B: Backend + DeviceFacts>(args: &BenchArgs, loaded: &Loaded<B>) -> Result<ExitCode> {
    if args.prompt_len + args.generate > loaded.plan.serving.max_model_len {
        bail!(
            "--prompt-len + --gen = {} exceeds max_model_len = {} of the profile",
            args.prompt_len + args.generate,
            loaded.plan.serving.max_model_len
        );
    }
    if args.batch == 0 || args.batch > loaded.plan.serving.max_num_seqs {
        bail!(
            "--batch must be between 1 and max_num_seqs = {}",
            loaded.plan.serving.max_num_seqs
        );
    }
    let source = loaded.source();
    let mut engine = loaded.engine(&source)?;
    let vocab = engine.vocab_size() as u64;
    let mut rng = SplitMix64::new(42);
    let prompts: Vec<Vec<u32>> = (0..args.batch)
        .map(|_| {
            let period = match args.prompt {
                PromptKind::Random => args.prompt_len,
                PromptKind::Repeat => REPEAT_PHRASE,
            };
            let phrase: Vec<u32> = (0..period)
                .map(|_| (rng.next_u64() % vocab) as u32)
                .collect();
            phrase
                .iter()
                .cycle()
                .take(args.prompt_len)
                .copied()
                .collect()
        })
        .collect();

    // One untimed warm-up round, then the timed ones. Prefill ends when
    // every request has its first token; decode is timed from there.
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut decode_steps = 0u64;
    let mut decoded_last = 0usize;
    let drafts_before = engine.counters.draft_stats();
    let mut decode_launches: Vec<(&'static str, u64)> = Vec::new();
    for round in 0..=args.repeats {
        let mut receivers = Vec::with_capacity(args.batch);
        for (i, prompt) in prompts.iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            engine.add_request(
                Request::new(prompt.clone(), bench_sampling(args, i))
                    .with_ignore_eos(true)
                    // A salt of its own per round: the prompts repeat, and
                    // the prefix cache must not make later rounds' prefill free.
                    .with_cache_salt(Some(format!("bench-round-{round}"))),
                Box::new(tx),
            )?;
            receivers.push(rx);
        }
        let start = Instant::now();
        let mut first: Vec<Option<Instant>> = vec![None; args.batch];
        let mut prefilled: Option<Instant> = None;
        let mut decoded = 0usize;
        let mut at_decode_start = Vec::new();
        let mut steps = 0u64;
        while engine.has_work() {
            let report = engine.step()?;
            if prefilled.is_some() && report.tokens > 0 {
                steps += 1;
            }
            for (i, rx) in receivers.iter().enumerate() {
                for event in rx.try_iter() {
                    match event {
                        Event::Token { .. } => {
                            if prefilled.is_some() {
                                decoded += 1;
                            }
                            first[i].get_or_insert_with(Instant::now);
                        }
                        Event::Failed { message } => bail!("bench request failed: {message}"),
                        _ => {}
                    }
                }
            }
            if prefilled.is_none() && first.iter().all(Option::is_some) {
                prefilled = Some(Instant::now());
                at_decode_start = loaded.backend.launches_by_kernel();
            }
        }
        let end = Instant::now();
        let prefilled = prefilled.unwrap_or(end);
        if round > 0 {
            let prompt_tokens = (args.batch * args.prompt_len) as f64;
            prefill.push(prompt_tokens / prefilled.duration_since(start).as_secs_f64());
            let decode_s = end.duration_since(prefilled).as_secs_f64();
            decode.push(decoded as f64 / decode_s.max(f64::MIN_POSITIVE));
        }
        if round == args.repeats {
            decode_steps = steps;
            decoded_last = decoded;
            decode_launches = loaded
                .backend
                .launches_by_kernel()
                .into_iter()
                .zip(at_decode_start)
                .map(|((name, after), (_, before))| (name, after - before))
                .collect();
        }
    }
    let threads = rayon::current_num_threads();
    let gpu = loaded.backend.gpu();
    let peaks = gpu.as_ref().and_then(|(name, _)| device_peaks(name));
    let (bandwidth, bandwidth_source) = match (peaks, loaded.backend.spec_bandwidth()) {
        (Some(p), _) => (p.bandwidth_bytes_s, "NVIDIA's published figure"),
        (None, Some(peak)) => (peak, "device peak, from its memory clock and bus width"),
        (None, None) => {
            let regions = weight_regions(&loaded.checkpoint, loaded);
            let measured = measure_read_bandwidth_of(threads, &regions, BANDWIDTH_BYTES);
            (measured, "measured, CPU reads of the mapped weights")
        }
    };
    let bytes_per_token = crate::plan::decode_weight_bytes_per_token(&loaded.plan);
    let roofline = bandwidth / bytes_per_token.max(1) as f64;
    let per_step = |n: u64| n as f64 / decode_steps.max(1) as f64;
    let launches_per_decode_step = (gpu.is_some() && decode_steps > 0)
        .then(|| per_step(decode_launches.iter().map(|(_, n)| n).sum()));
    let layers = loaded.plan.model.num_layers.max(1) as f64;
    let decode_tok_s = median(&mut decode);
    let prefill_tok_s = median(&mut prefill);
    let rss = RssComponents::of(&loaded.plan);
    let perf_model = PerfModel::of(
        args,
        loaded,
        (prefill_tok_s, decode_tok_s),
        bandwidth,
        peaks,
    );
    let drafts = engine.counters.draft_stats();
    let speculative = loaded.plan.serving.speculative.map(|c| SpeculativeBench {
        method: c.method.name(),
        num_speculative_tokens: c.num_speculative_tokens,
        drafts: drafts.drafts - drafts_before.drafts,
        draft_tokens: drafts.draft_tokens - drafts_before.draft_tokens,
        accepted_tokens: drafts.accepted_tokens - drafts_before.accepted_tokens,
    });
    let report = BenchReport {
        tokens_per_decode_pass: decoded_last as f64 / decode_steps.max(1) as f64,
        speculative,
        prefill_tok_s,
        decode_tok_s,
        peak_rss_bytes: crate::host::process::peak_rss_bytes(),
        rss_budget_bytes: (rss.total() as f64 * (1.0 + RSS_SLACK)) as u64,
        rss,
        bytes_per_token,
        bandwidth_bytes_s: bandwidth,
        roofline_tok_s: roofline,
        roofline_fraction: decode_tok_s / roofline,
        threads,
        prompt_len: args.prompt_len,
        generate: args.generate,
        repeats: args.repeats,
        batch: args.batch,
        temperature: args.temperature,
        backend: loaded.backend.name(),
        cpu_isa: crate::backend::cpu::kernels::Isa::best().name(),
        launches_per_decode_step,
        launches_per_layer: launches_per_decode_step.map(|n| n / layers),
        launches_by_kernel: decode_launches
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|&(name, n)| (name, per_step(n)))
            .collect(),
        perf_model,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        match &gpu {
            Some((name, arch)) => println!(
                "sparkrt bench: {} (cuda, {name} {arch})",
                loaded.dir.display(),
            ),
            None => println!(
                "sparkrt bench: {} (cpu, {} threads, kernels {})",
                loaded.dir.display(),
                threads,
                report.cpu_isa
            ),
        }
        println!(
            "  prompt {} tokens, generate {} tokens, batch {}, {} repeats (medians), {}",
            args.prompt_len,
            args.generate,
            args.batch,
            args.repeats,
            if args.temperature > 0.0 {
                format!("temperature {}", args.temperature)
            } else {
                "greedy".to_string()
            }
        );
        println!(
            "  prefill                 {:>10.1} tok/s",
            report.prefill_tok_s
        );
        println!(
            "  decode                  {:>10.1} tok/s",
            report.decode_tok_s
        );
        println!(
            "  tokens / decode pass    {:>10.2}",
            report.tokens_per_decode_pass
        );
        if let Some(s) = &report.speculative {
            println!(
                "  drafts ({}, k = {})      {:>10} kept of {} ({:.1} %) in {} drafting steps",
                s.method,
                s.num_speculative_tokens,
                s.accepted_tokens,
                s.draft_tokens,
                100.0 * s.accepted_tokens as f64 / s.draft_tokens.max(1) as f64,
                s.drafts
            );
        }
        println!(
            "  weights read per token  {:>14}",
            format_bytes(bytes_per_token)
        );
        println!(
            "  read bandwidth          {:>10.1} GB/s ({bandwidth_source})",
            bandwidth / 1e9
        );
        println!("  decode roofline         {:>10.1} tok/s", roofline);
        println!(
            "  decode / roofline       {:>10.1} %",
            100.0 * report.roofline_fraction
        );
        let r = &report.rss;
        println!(
            "  peak RSS                {:>14}  ({:.1} % of the budget below)",
            format_bytes(report.peak_rss_bytes),
            100.0 * report.peak_rss_bytes as f64 / report.rss_budget_bytes.max(1) as f64
        );
        for (name, bytes) in [
            ("weights (mapped)", r.weights_bytes),
            ("MoE workspace", r.moe_workspace_bytes),
            ("activations", r.activations_bytes),
            ("KV cache", r.kv_cache_bytes),
        ] {
            println!("    {name:<21} {:>14}", format_bytes(bytes));
        }
        println!(
            "    sum + {:.0} %            {:>14}",
            100.0 * RSS_SLACK,
            format_bytes(report.rss_budget_bytes)
        );
        println!(
            "  plan total              {:>14}",
            format_bytes(loaded.plan.total)
        );
        if let (Some(step), Some(layer)) =
            (report.launches_per_decode_step, report.launches_per_layer)
        {
            println!("  launches / decode step  {step:>10.1}");
            println!("  launches / layer        {layer:>10.1} (step ÷ {layers} layers)");
            for (name, n) in &report.launches_by_kernel {
                println!("    {name:<22}{n:>8.1} per step");
            }
        }
        report.perf_model.print(args.batch, args.prompt_len);
    }
    Ok(ExitCode::SUCCESS)
}

/// `value` with a decimal prefix: 3.35 G, 989.0 TFLOP/s.
fn si(value: f64, unit: &str) -> String {
    let prefixes = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    let (scale, prefix) = prefixes
        .into_iter()
        .find(|&(scale, _)| value.abs() >= scale)
        .unwrap_or((1.0, ""));
    format!("{:.2} {prefix}{unit}", value / scale)
}
