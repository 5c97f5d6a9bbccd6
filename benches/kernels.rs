//! Kernel benchmark at the Qwen3-30B-A3B geometry (hidden 2048, 128 experts,
//! top-8, moe_intermediate 768, 32 × 128 query / 4 × 128 KV heads, vocab
//! 32000) and gpt-oss shapes for MXFP4: GEMV GB/s against the measured read
//! bandwidth, prefill GFLOP/s. Medians of repeats, printed as a table.
//!
//! `cargo bench --bench kernels` (threads: the rayon default, or
//! RAYON_NUM_THREADS). Matrices are replicated so that each timed pass
//! reads weights that are not in the last-level cache, as in a real model.

// A benchmark that cannot set itself up stops with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use sparkrt::backend::cpu::kernels::weights::weight_bytes;
use sparkrt::backend::cpu::kernels::{GroupedProblem, Isa, matmul_grouped, measure_read_bandwidth};
use sparkrt::checkpoint::linear::{Fp8Scales, LinearWeight, WeightData};
use sparkrt::formats::{ScaleType, f32_to_bf16};

/// Bytes a working set must exceed to stay out of the last-level cache.
const COLD_BYTES: usize = 192 << 20;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Format {
    Bf16,
    Nvfp4,
    Mxfp4,
    /// FP8 E4M3, one per-tensor scale (ModelOpt).
    Fp8,
    /// FP8 E4M3, f32 scales per 128 × 128 block (Qwen's -FP8).
    Fp8Block,
    /// GPTQ INT4, group 128, f16 scales and packed zero points (AutoRound).
    Int4,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Bf16 => "BF16",
            Format::Nvfp4 => "NVFP4",
            Format::Mxfp4 => "MXFP4",
            Format::Fp8 => "FP8",
            Format::Fp8Block => "FP8-b",
            Format::Int4 => "INT4",
        }
    }
}

struct Owned {
    rows: usize,
    cols: usize,
    format: Format,
    data: Vec<u8>,
    scales: Vec<u8>,
    /// INT4's packed zero points (empty for the other formats).
    zeros: Vec<u8>,
}

/// INT4's group of input columns.
const INT4_GROUP: usize = 128;

impl Owned {
    fn new(rng: &mut Rng, format: Format, rows: usize, cols: usize) -> Owned {
        let n = rows * cols;
        let (data, scales) = match format {
            Format::Bf16 => {
                let mut data = Vec::with_capacity(2 * n);
                for _ in 0..n {
                    data.extend(f32_to_bf16(rng.float() * 0.05).to_le_bytes());
                }
                (data, vec![])
            }
            Format::Nvfp4 => (
                (0..n / 2).map(|_| rng.next() as u8).collect(),
                (0..n / 16)
                    .map(|_| 0x30 + (rng.next() % 16) as u8)
                    .collect(),
            ),
            Format::Mxfp4 => (
                (0..n / 2).map(|_| rng.next() as u8).collect(),
                (0..n / 32).map(|_| 120 + (rng.next() % 8) as u8).collect(),
            ),
            // Finite E4M3 values of either sign, scales around 0.01.
            Format::Fp8 | Format::Fp8Block => (
                (0..n)
                    .map(|_| {
                        let r = rng.next();
                        (0x20 + (r % 0x50) as u8) | (r >> 8) as u8 & 0x80
                    })
                    .collect(),
                (0..rows.div_ceil(128) * cols.div_ceil(128))
                    .flat_map(|_| 0.01f32.to_le_bytes())
                    .collect(),
            ),
            // Random codes; f16 scales of 0.01 (0x211F).
            Format::Int4 => (
                (0..n / 2).map(|_| rng.next() as u8).collect(),
                (0..n / INT4_GROUP)
                    .flat_map(|_| 0x211Fu16.to_le_bytes())
                    .collect(),
            ),
        };
        let zeros = match format {
            Format::Int4 => (0..n / INT4_GROUP / 2).map(|_| rng.next() as u8).collect(),
            _ => vec![],
        };
        Owned {
            rows,
            cols,
            format,
            data,
            scales,
            zeros,
        }
    }

    fn view(&self) -> LinearWeight<'_> {
        let data = match self.format {
            Format::Bf16 => WeightData::Bf16(&self.data),
            Format::Nvfp4 => WeightData::Nvfp4 {
                packed: &self.data,
                scales: &self.scales,
                global: 0.01,
            },
            Format::Mxfp4 => WeightData::Mxfp4 {
                blocks: &self.data,
                scales: &self.scales,
            },
            Format::Fp8 => WeightData::Fp8 {
                values: &self.data,
                scales: Fp8Scales::Tensor(0.01),
            },
            Format::Fp8Block => WeightData::Fp8 {
                values: &self.data,
                scales: Fp8Scales::Block {
                    bytes: &self.scales,
                    dtype: ScaleType::F32,
                },
            },
            Format::Int4 => WeightData::Int4 {
                qweight: &self.data,
                qzeros: &self.zeros,
                scales: &self.scales,
                group: INT4_GROUP,
                zero_offset: 1,
            },
        };
        LinearWeight {
            rows: self.rows,
            cols: self.cols,
            data,
        }
    }
}

/// One timed case: a list of (rows, cols) matrices run as one grouped call,
/// each with `tokens` rows of input.
struct Case {
    name: String,
    format: Format,
    shapes: Vec<(usize, usize)>,
    tokens: usize,
}

struct Timing {
    seconds: f64,
    /// Process CPU time per thread: what the pass would take on idle cores
    /// (this machine's cores are shared with other builds).
    cpu_seconds: f64,
    bytes: usize,
    flops: f64,
}

fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run_case(rng: &mut Rng, case: &Case) -> Timing {
    run_case_with(rng, case, 0)
}

/// `copies`: how many replicas of the weights to cycle through (0: enough
/// to defeat the last-level cache).
fn run_case_with(rng: &mut Rng, case: &Case, copies: usize) -> Timing {
    let set_bytes: usize = case
        .shapes
        .iter()
        .map(|&(r, c)| weight_bytes(&Owned::new(&mut Rng(1), case.format, 1, c).view()) * r)
        .sum();
    // Enough copies that a round trip over them does not fit in cache.
    // SPARKRT_BENCH_HOT=1: one copy, so weights stay cache-resident (to see
    // the kernels' own speed apart from memory).
    let hot = std::env::var_os("SPARKRT_BENCH_HOT").is_some();
    let copies = if copies > 0 {
        copies
    } else if case.tokens >= 32 || hot {
        1
    } else {
        COLD_BYTES.div_ceil(set_bytes).clamp(1, 16)
    };
    let sets: Vec<Vec<Owned>> = (0..copies)
        .map(|_| {
            case.shapes
                .iter()
                .map(|&(r, c)| Owned::new(rng, case.format, r, c))
                .collect()
        })
        .collect();
    let xs: Vec<Vec<f32>> = case
        .shapes
        .iter()
        .map(|&(_, c)| (0..case.tokens * c).map(|_| rng.float()).collect())
        .collect();
    let mut outs: Vec<Vec<f32>> = case
        .shapes
        .iter()
        .map(|&(r, _)| vec![0.0; case.tokens * r])
        .collect();
    let flops: f64 = case
        .shapes
        .iter()
        .map(|&(r, c)| 2.0 * (r * c * case.tokens) as f64)
        .sum();
    let mut run = |set: &Vec<Owned>| {
        let views: Vec<LinearWeight> = set.iter().map(|w| w.view()).collect();
        let mut problems: Vec<GroupedProblem> = views
            .iter()
            .zip(&xs)
            .zip(outs.iter_mut())
            .map(|((w, x), out)| GroupedProblem {
                x,
                tokens: case.tokens,
                weight: *w,
                out,
            })
            .collect();
        let start = Instant::now();
        let cpu_start = process_cpu_seconds();
        matmul_grouped(&mut problems).expect("benchmark shapes are valid");
        (
            start.elapsed().as_secs_f64(),
            process_cpu_seconds() - cpu_start,
        )
    };
    // Warm-up, then enough passes for about half a second (at least 5).
    for set in &sets {
        run(set);
    }
    let once = run(&sets[0]).0.max(1e-6);
    let passes = ((0.5 / once) as usize).clamp(5, 400);
    let times: Vec<(f64, f64)> = (0..passes).map(|i| run(&sets[i % copies])).collect();
    let threads = rayon::current_num_threads() as f64;
    Timing {
        seconds: median(times.iter().map(|t| t.0).collect()),
        cpu_seconds: median(times.iter().map(|t| t.1 / threads).collect()),
        bytes: set_bytes,
        flops,
    }
}

fn main() {
    let threads = rayon::current_num_threads();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    println!(
        "sparkrt kernel benchmark — ISA {:?}, {threads} threads",
        Isa::best()
    );
    let bandwidth = measure_read_bandwidth(threads, 512 << 20);
    let bandwidth_one = measure_read_bandwidth(1, 512 << 20);
    println!(
        "measured read bandwidth: {:.1} GB/s ({threads} threads), {:.1} GB/s (1 thread)\n",
        bandwidth / 1e9,
        bandwidth_one / 1e9
    );

    let (hidden, inter, experts_per_tok, vocab) = (2048, 768, 8, 32000);
    let q = 32 * 128;
    let kv = 4 * 128;
    let expert_gate_up = |n: usize| vec![(inter, hidden); 2 * n];
    let expert_down = |n: usize| vec![(hidden, inter); n];

    // SPARKRT_BENCH=gemv,cache,batch,prefill picks sections (default: these;
    // `rowlen` adds a diagnostic of GEMV speed against row length).
    let sections =
        std::env::var("SPARKRT_BENCH").unwrap_or_else(|_| "gemv,cache,batch,prefill".into());
    let want = |s: &str| sections.split(',').any(|x| x == s);

    if want("gemv") {
        println!("GEMV, tokens = 1 (batch-1 decode)");
        println!(
            "{:<40} {:>6} {:>8} {:>9} {:>7} {:>6} {:>9}",
            "case", "format", "MB", "µs", "GB/s", "% bw", "GB/s cpu"
        );
        let mut gemv_cases = Vec::new();
        for format in [
            Format::Bf16,
            Format::Nvfp4,
            Format::Fp8,
            Format::Fp8Block,
            Format::Int4,
        ] {
            for (name, shapes) in [
                (format!("q_proj {q}x{hidden}"), vec![(q, hidden)]),
                (format!("o_proj {hidden}x{q}"), vec![(hidden, q)]),
                (
                    format!("8 experts gate+up 2x{inter}x{hidden}"),
                    expert_gate_up(experts_per_tok),
                ),
                (
                    format!("8 experts down {hidden}x{inter}"),
                    expert_down(experts_per_tok),
                ),
                (format!("lm_head {vocab}x{hidden}"), vec![(vocab, hidden)]),
            ] {
                gemv_cases.push(Case {
                    name,
                    format,
                    shapes,
                    tokens: 1,
                });
            }
        }
        gemv_cases.push(Case {
            name: "gpt-oss 2880x2880".into(),
            format: Format::Mxfp4,
            shapes: vec![(2880, 2880)],
            tokens: 1,
        });
        gemv_cases.push(Case {
            name: "gpt-oss 4 experts gate_up 5760x2880".into(),
            format: Format::Mxfp4,
            shapes: vec![(5760, 2880); 4],
            tokens: 1,
        });
        for case in &gemv_cases {
            let r = run_case(&mut rng, case);
            let gbs = r.bytes as f64 / r.seconds / 1e9;
            println!(
                "{:<40} {:>6} {:>8.1} {:>9.1} {:>7.1} {:>5.0}% {:>9.1}",
                case.name,
                case.format.name(),
                r.bytes as f64 / 1e6,
                r.seconds * 1e6,
                gbs,
                100.0 * gbs * 1e9 / bandwidth,
                r.bytes as f64 / r.cpu_seconds / 1e9
            );
        }
    }

    if want("rowlen") {
        println!("\nBF16 GEMV by row length (16 MiB each, tokens = 1)");
        for (rows, cols) in [
            (10922, 768),
            (16384, 512),
            (8192, 1024),
            (13107, 640),
            (4096, 2048),
        ] {
            for groups in [1, 8] {
                let case = Case {
                    name: format!("{groups} x {}x{cols}", rows / groups),
                    format: Format::Bf16,
                    shapes: vec![(rows / groups, cols); groups],
                    tokens: 1,
                };
                let r = run_case(&mut rng, &case);
                println!(
                    "{:<40} {:>9.1} µs {:>7.1} GB/s {:>7.1} GB/s cpu",
                    case.name,
                    r.seconds * 1e6,
                    r.bytes as f64 / r.seconds / 1e9,
                    r.bytes as f64 / r.cpu_seconds / 1e9
                );
            }
        }
    }

    if want("cache") {
        println!("\nGEMV from cache (weights L2-resident: the kernels' own ceiling)");
        println!(
            "{:<40} {:>6} {:>8} {:>9} {:>7} {:>9}",
            "case", "format", "KB", "µs", "GB/s", "Gw/s cpu"
        );
        for (format, rows) in [
            (Format::Bf16, 96),
            (Format::Nvfp4, 384),
            (Format::Mxfp4, 384),
        ] {
            let case = Case {
                name: format!("{rows}x{hidden}, tokens=1"),
                format,
                shapes: vec![(rows, hidden)],
                tokens: 1,
            };
            let r = run_case_with(&mut rng, &case, 1);
            println!(
                "{:<40} {:>6} {:>8.0} {:>9.1} {:>7.1} {:>9.1}",
                case.name,
                format.name(),
                r.bytes as f64 / 1e3,
                r.seconds * 1e6,
                r.bytes as f64 / r.seconds / 1e9,
                (rows * hidden) as f64 / r.cpu_seconds / 1e9
            );
        }
    }

    if want("batch") {
        println!("\nSmall batches (q_proj {q}x{hidden})");
        println!(
            "{:<40} {:>6} {:>8} {:>9} {:>7} {:>8} {:>12}",
            "case", "format", "tokens", "µs", "GB/s", "GFLOP/s", "GFLOP/s cpu"
        );
        for format in [Format::Bf16, Format::Nvfp4, Format::Int4] {
            for tokens in [1, 2, 3, 4, 5, 8, 12, 16] {
                let case = Case {
                    name: format!("q_proj tokens={tokens}"),
                    format,
                    shapes: vec![(q, hidden)],
                    tokens,
                };
                let r = run_case(&mut rng, &case);
                println!(
                    "{:<40} {:>6} {:>8} {:>9.1} {:>7.1} {:>8.1} {:>12.1}",
                    case.name,
                    format.name(),
                    tokens,
                    r.seconds * 1e6,
                    r.bytes as f64 / r.seconds / 1e9,
                    r.flops / r.seconds / 1e9,
                    r.flops / r.cpu_seconds / 1e9
                );
            }
        }
    }

    if want("prefill") {
        println!("\nPrefill");
        println!(
            "{:<40} {:>6} {:>8} {:>9} {:>8} {:>12}",
            "case", "format", "tokens", "ms", "GFLOP/s", "GFLOP/s cpu"
        );
        for format in [Format::Bf16, Format::Nvfp4, Format::Int4] {
            let cases = [
                Case {
                    name: format!("q_proj {q}x{hidden}"),
                    format,
                    shapes: vec![(q, hidden)],
                    tokens: 512,
                },
                Case {
                    name: format!("k+v_proj 2x{kv}x{hidden}"),
                    format,
                    shapes: vec![(kv, hidden); 2],
                    tokens: 512,
                },
                Case {
                    name: format!("o_proj {hidden}x{q}"),
                    format,
                    shapes: vec![(hidden, q)],
                    tokens: 512,
                },
                Case {
                    name: "8 experts gate+up, 32 rows each".into(),
                    format,
                    shapes: expert_gate_up(experts_per_tok),
                    tokens: 32,
                },
                Case {
                    name: "8 experts down, 32 rows each".into(),
                    format,
                    shapes: expert_down(experts_per_tok),
                    tokens: 32,
                },
            ];
            for case in &cases {
                print_prefill(run_case(&mut rng, case), case);
            }
        }
        // Qwen3.6-35B-A3B prefill: 512 tokens × top-8 over 256 experts is
        // 16 rows per expert, of width 512.
        for (name, shape) in [
            ("qwen3.6 8 experts gate+up, 16 rows each", (512, 2048)),
            ("qwen3.6 8 experts down, 16 rows each", (2048, 512)),
        ] {
            let count = if shape.0 == 512 { 16 } else { 8 };
            let case = Case {
                name: name.into(),
                format: Format::Bf16,
                shapes: vec![shape; count],
                tokens: 16,
            };
            print_prefill(run_case(&mut rng, &case), &case);
        }
        // gpt-oss prefill: 512 tokens × top-4 over 128 experts is 16 rows
        // per expert; 8 experts of gate_up and of down.
        for (name, shape) in [
            ("gpt-oss 8 experts gate_up, 16 rows each", (5760, 2880)),
            ("gpt-oss 8 experts down, 16 rows each", (2880, 2880)),
        ] {
            let case = Case {
                name: name.into(),
                format: Format::Mxfp4,
                shapes: vec![shape; 8],
                tokens: 16,
            };
            print_prefill(run_case(&mut rng, &case), &case);
        }
    }
}

fn print_prefill(r: Timing, case: &Case) {
    println!(
        "{:<40} {:>6} {:>8} {:>9.2} {:>8.1} {:>12.1}",
        case.name,
        case.format.name(),
        case.tokens,
        r.seconds * 1e3,
        r.flops / r.seconds / 1e9,
        r.flops / r.cpu_seconds / 1e9
    );
}
