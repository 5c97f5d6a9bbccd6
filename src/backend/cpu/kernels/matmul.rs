//! `out = x · Wᵀ` for one or many problems in one parallel region: the
//! dispatcher, the one file that picks an instruction set's matmul kernels
//! (`x86/`, `arm/`, `portable.rs`) and activation quantizer.
//!
//! A call is cut into work units of whole output rows of one problem; the
//! threads of the current rayon pool pull units from a shared counter until
//! none are left, so 2 threads stay busy even when 8 experts have 1 token
//! each, and a slow thread never holds the others back by more than a unit.
//! Every kernel reads the activations where they are: a call allocates
//! nothing (the job list reuses a per-thread allocation). The one exception
//! is MXFP4 (AVX2, NEON), NVFP4 and INT4 (the x86 tiers), which first quantize each
//! problem's activations (`quantize`) into a scratch: the caller's
//! ([`matmul_grouped_in`], the workspace's planned buffers) or a per-thread
//! one that grows.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::error::KernelError;
use super::isa::Isa;
use super::job::{Job, OutPtr, Path};
use super::portable;
use super::quantize::{ActivationScratch, BLOCK, QuantizedX, integer_nvfp4, quantize_row};
use super::weights::{check_weight, weight_bytes};
use crate::checkpoint::linear::{LinearWeight, WeightData};
use crate::formats::read_bf16;

/// One independent `out = x · Wᵀ` of a grouped call: `x` is `[tokens, cols]`,
/// `out` is `[tokens, rows]`, both row-major. `tokens` may be 0.
pub struct GroupedProblem<'a> {
    pub x: &'a [f32],
    pub tokens: usize,
    pub weight: LinearWeight<'a>,
    pub out: &'a mut [f32],
}

/// `out[t·rows + r] = Σ_c x[t·cols + c] · W[r, c]` on the best instruction set.
pub fn matmul(
    x: &[f32],
    tokens: usize,
    weight: &LinearWeight,
    out: &mut [f32],
) -> Result<(), KernelError> {
    matmul_grouped(&mut [GroupedProblem {
        x,
        tokens,
        weight: *weight,
        out,
    }])
}

/// Runs every problem (e.g. the active experts of one MoE layer, each with its
/// own gathered rows) in one parallel region on the best instruction set.
pub fn matmul_grouped(problems: &mut [GroupedProblem]) -> Result<(), KernelError> {
    matmul_grouped_on(Isa::best(), problems)
}

/// [`matmul_grouped`] quantizing activations (where the instruction set does,
/// see [`quantizes_activations`]) into `scratch`, which must be large enough.
pub fn matmul_grouped_in(
    problems: &mut [GroupedProblem],
    scratch: &mut ActivationScratch,
) -> Result<(), KernelError> {
    run_checked(Isa::best(), problems, scratch)
}

/// [`matmul_grouped`] on a chosen instruction set (tests compare them all),
/// with this thread's growable activation scratch.
pub fn matmul_grouped_on(isa: Isa, problems: &mut [GroupedProblem]) -> Result<(), KernelError> {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => run_checked(isa, problems, &mut scratch),
        Err(_) => run_checked(isa, problems, &mut ActivationScratch::growable()),
    })
}

/// Whether `isa` multiplies this weight with quantized activations (and so
/// needs an activation scratch): MXFP4 on AVX2 (and the tiers that run its
/// kernels) and NEON; NVFP4 and GPTQ INT4 on the x86 tiers, where their
/// rows are whole activation blocks.
pub fn quantizes_activations(isa: Isa, weight: &LinearWeight) -> bool {
    match weight.data {
        WeightData::Mxfp4 { .. } => isa.runs_avx2() || isa == Isa::Neon,
        WeightData::Nvfp4 { .. } => isa.runs_avx2() && integer_nvfp4(weight),
        WeightData::Int4 { .. } => isa.runs_avx2() && weight.cols.is_multiple_of(BLOCK),
        _ => false,
    }
}

/// Whether `isa` rounds the activations of this weight to bf16 before it
/// multiplies (BF16 weights on the AVX-512 BF16 tier): what a tolerance
/// against an f32 reference has to allow for.
pub fn rounds_activations_to_bf16(isa: Isa, weight: &LinearWeight) -> bool {
    isa.rounds_activations() && matches!(weight.data, WeightData::Bf16(_))
}

fn run_checked(
    isa: Isa,
    problems: &mut [GroupedProblem],
    scratch: &mut ActivationScratch,
) -> Result<(), KernelError> {
    check_call(isa, problems)?;
    scratch.reserve(quantized_values(isa, problems))?;
    JOBS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut jobs) => run(isa, problems, scratch, &mut jobs),
        // Re-entered on this thread (a rayon worker that stole another matmul
        // while waiting): a fresh job list for this call.
        Err(_) => run(isa, problems, scratch, &mut Vec::new()),
    })
}

/// Whether problem `i` quantizes the very activations problem `i - 1` does
/// (the gate and up projections of one expert): they are quantized once.
fn reuses_previous_quantized(isa: Isa, problems: &[GroupedProblem], i: usize) -> bool {
    i > 0 && {
        let (a, b) = (&problems[i - 1], &problems[i]);
        quantizes_activations(isa, &a.weight)
            && quantizes_activations(isa, &b.weight)
            && std::ptr::eq(a.x, b.x)
            && a.weight.cols == b.weight.cols
    }
}

/// Values the call quantizes.
fn quantized_values(isa: Isa, problems: &[GroupedProblem]) -> usize {
    (0..problems.len())
        .filter(|&i| {
            quantizes_activations(isa, &problems[i].weight)
                && !reuses_previous_quantized(isa, problems, i)
        })
        .map(|i| problems[i].x.len())
        .sum()
}

fn check_call(isa: Isa, problems: &[GroupedProblem]) -> Result<(), KernelError> {
    if !isa.is_available() {
        return Err(KernelError::IsaUnavailable(isa));
    }
    problems.iter().try_for_each(check_problem)
}

/// Adds a bf16 bias (`rows` little-endian bf16 values) to every token row of `out`.
///
/// # Panics
/// If `bias` is not `2 × rows` bytes or `out.len()` is not a multiple of `rows`.
pub fn add_bias_bf16(out: &mut [f32], rows: usize, bias: &[u8]) {
    assert_eq!(bias.len(), 2 * rows, "bias must hold `rows` bf16 values");
    assert!(
        rows > 0 && out.len().is_multiple_of(rows),
        "out is not [tokens, rows]"
    );
    for row in out.chunks_exact_mut(rows) {
        for (r, o) in row.iter_mut().enumerate() {
            *o += read_bf16(bias, r);
        }
    }
}

fn check_problem(p: &GroupedProblem) -> Result<(), KernelError> {
    let w = &p.weight;
    check_weight(w)?;
    let length = |what, width: usize, got| {
        let expected = p.tokens.checked_mul(width);
        if expected == Some(got) {
            Ok(())
        } else {
            Err(KernelError::Length {
                what,
                tokens: p.tokens,
                width,
                expected: expected.unwrap_or(usize::MAX),
                got,
            })
        }
    };
    length("x", w.cols, p.x.len())?;
    length("out", w.rows, p.out.len())
}

/// A job as scheduled: its share of the work units of the whole call.
struct Scheduled<'a> {
    job: Job<'a>,
    unit_rows: usize,
    /// Work units of this job are `unit_start..unit_end` of the whole call.
    unit_start: usize,
    unit_end: usize,
}

thread_local! {
    /// The job list of a call: always empty between calls, kept only for
    /// its allocation.
    static JOBS: RefCell<Vec<Scheduled<'static>>> = const { RefCell::new(Vec::new()) };
    /// The activation scratch of calls that bring none.
    static SCRATCH: RefCell<ActivationScratch> = RefCell::new(ActivationScratch::growable());
}

/// Units are whole multiples of this many rows, a multiple of every kernel's
/// row block, so only a problem's last unit has a ragged edge.
const ROW_ALIGN: usize = 24;
/// Work units per thread a call aims for (finer: better balance, more overhead).
const UNITS_PER_THREAD: usize = 8;
/// Smallest unit worth scheduling, in cost units (≈ bytes of weights).
const MIN_UNIT_COST: f64 = 96.0 * 1024.0;

fn run(
    isa: Isa,
    problems: &mut [GroupedProblem],
    scratch: &mut ActivationScratch,
    job_cache: &mut Vec<Scheduled<'static>>,
) -> Result<(), KernelError> {
    let threads = rayon::current_num_threads().max(1);
    // Reuse the job list's allocation for this call's lifetime (the in-place
    // collect keeps the buffer because `Scheduled` has one layout for every lifetime).
    let mut jobs: Vec<Scheduled> = std::mem::take(job_cache)
        .into_iter()
        .map(|_| unreachable!("the job list is empty between calls"))
        .collect();
    let total_cost: f64 = problems
        .iter()
        .map(|p| {
            let path = choose_path(isa, &p.weight, p.tokens);
            row_cost(path, &p.weight, p.tokens) * p.weight.rows as f64
        })
        .sum();

    let target = (total_cost / (threads * UNITS_PER_THREAD) as f64).max(MIN_UNIT_COST);
    let mut units = 0;
    let (mut codes, mut scales) = scratch.parts();
    let mut previous: Option<QuantizedX> = None;
    for i in 0..problems.len() {
        let reuse = reuses_previous_quantized(isa, problems, i);
        let p = &mut problems[i];
        let quantized = if !quantizes_activations(isa, &p.weight) {
            None
        } else if reuse {
            previous
        } else {
            let cols = p.weight.cols;
            let (c, c_rest) = std::mem::take(&mut codes).split_at_mut(p.x.len());
            let (s, s_rest) = std::mem::take(&mut scales).split_at_mut(p.x.len() / BLOCK);
            (codes, scales) = (c_rest, s_rest);
            quantize_rows(p.x, cols, c, s)?;
            Some(QuantizedX {
                codes: c,
                scales: s,
                cols,
            })
        };
        previous = quantized;
        let path = choose_path(isa, &p.weight, p.tokens);
        let rows = p.weight.rows;
        // As many units as the cost asks for, then rows spread evenly over
        // them in whole blocks of ROW_ALIGN.
        let n_units = if p.tokens == 0 || rows == 0 {
            0
        } else {
            let per_row = row_cost(path, &p.weight, p.tokens);
            rows.div_ceil(((target / per_row).ceil() as usize).max(1))
        };
        let unit_rows = rows.div_ceil(n_units.max(1)).div_ceil(ROW_ALIGN).max(1) * ROW_ALIGN;
        let n_units = if n_units == 0 {
            0
        } else {
            rows.div_ceil(unit_rows)
        };
        jobs.push(Scheduled {
            job: Job {
                weight: p.weight,
                tokens: p.tokens,
                path,
                x: p.x,
                quantized,
                out: OutPtr(p.out.as_mut_ptr()),
            },
            unit_rows,
            unit_start: units,
            unit_end: units + n_units,
        });
        units += n_units;
    }

    let next = AtomicUsize::new(0);
    let work = || {
        loop {
            let unit = next.fetch_add(1, Ordering::Relaxed);
            if unit >= units {
                break;
            }
            let j = jobs.partition_point(|job| job.unit_end <= unit);
            let scheduled = &jobs[j];
            let first = (unit - scheduled.unit_start) * scheduled.unit_rows;
            let rows = first..(first + scheduled.unit_rows).min(scheduled.job.weight.rows);
            run_rows(isa, &scheduled.job, rows);
        }
    };
    let workers = threads.min(units);
    if workers <= 1 {
        work();
    } else {
        (0..workers).into_par_iter().for_each(|_| work());
    }

    jobs.clear();
    *job_cache = jobs
        .into_iter()
        .map(|_| unreachable!("cleared above"))
        .collect();
    Ok(())
}

/// Values from which a call quantizes its rows on the rayon pool.
const PARALLEL_VALUES: usize = 1 << 16;

/// Quantizes `tokens` rows of `cols` values (`cols` a multiple of 32).
pub fn quantize_rows(
    x: &[f32],
    cols: usize,
    codes: &mut [i16],
    scales: &mut [f32],
) -> Result<(), KernelError> {
    if x.is_empty() {
        return Ok(());
    }
    if cols == 0 || !cols.is_multiple_of(BLOCK) {
        return Err(KernelError::ColsNotBlockMultiple {
            format: "quantized activations",
            multiple: BLOCK,
            cols,
        });
    }
    let tokens = x.len() / cols;
    let blocks = cols / BLOCK;
    if codes.len() < tokens * cols || scales.len() < tokens * blocks {
        return Err(KernelError::ScratchTooSmall {
            needed: tokens * cols,
            capacity: codes.len().min(scales.len() * BLOCK),
        });
    }
    let quantize = |((row, c), s): ((&[f32], &mut [i16]), &mut [f32])| {
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx2.is_available() {
            // SAFETY: AVX2 and FMA are present; the row, its codes and its
            // scales have the lengths the function needs.
            unsafe { super::x86::quantize_row(row, c, s) };
            return;
        }
        quantize_row(row, c, s)
    };
    // Parallel only when there is enough work to pay for it (a decode step's
    // few rows are quantized in a microsecond or two on the calling thread).
    if tokens * cols >= PARALLEL_VALUES {
        x.par_chunks_exact(cols)
            .zip(codes.par_chunks_exact_mut(cols))
            .zip(scales.par_chunks_exact_mut(blocks))
            .for_each(quantize);
    } else {
        x.chunks_exact(cols)
            .zip(codes.chunks_exact_mut(cols))
            .zip(scales.chunks_exact_mut(blocks))
            .for_each(quantize);
    }
    Ok(())
}

/// Rough cost of one output row, in the unit of "bytes of weights streamed":
/// the weight bytes plus the arithmetic, which dominates with many tokens.
fn row_cost(path: Path, w: &LinearWeight, tokens: usize) -> f64 {
    let bytes = weight_bytes(w) as f64 / w.rows.max(1) as f64;
    let flops = (w.cols * tokens) as f64;
    match path {
        Path::Gemv => bytes + 0.25 * flops,
        Path::Panel => bytes + 0.1 * flops,
    }
}

fn choose_path(isa: Isa, w: &LinearWeight, tokens: usize) -> Path {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => {
            super::x86::choose_path(isa, w, tokens)
        }
        _ => {
            let _ = (w, tokens);
            Path::Gemv
        }
    }
}

fn run_rows(isa: Isa, job: &Job, rows: Range<usize>) {
    match isa {
        // INT4 whose inputs are not whole activation blocks (no model is
        // known to have such a matrix) has no x86 kernel.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx
            if matches!(job.weight.data, WeightData::Int4 { .. }) && job.quantized.is_none() =>
        {
            portable::run_rows(job, rows)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => {
            super::x86::run_rows(isa, job, rows)
        }
        // FP8 and INT4 have no NEON kernel yet: the portable one is correct
        // (and batch-invariant) everywhere.
        #[cfg(target_arch = "aarch64")]
        Isa::Neon
            if matches!(
                job.weight.data,
                WeightData::Fp8 { .. } | WeightData::Int4 { .. }
            ) =>
        {
            portable::run_rows(job, rows)
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => super::arm::run_rows(job, rows),
        _ => portable::run_rows(job, rows),
    }
}
