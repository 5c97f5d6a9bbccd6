//! aarch64 kernels: NEON (part of the aarch64 baseline), entered only through
//! `Isa::Neon`. `neon.rs` holds the f32-decoding matmul kernels (F32, BF16,
//! NVFP4), `neon_mxfp4.rs` the integer MXFP4 kernel, `tiles.rs` the walk
//! over a work unit they share. This file sends each format to its kernel.

mod neon;
mod neon_mxfp4;
mod tiles;

use std::ops::Range;

use super::job::Job;
use crate::checkpoint::linear::WeightData;

/// Computes rows `rows` of a job on NEON.
pub(super) fn run_rows(job: &Job, rows: Range<usize>) {
    match (job.weight.data, &job.quantized) {
        (WeightData::Mxfp4 { blocks, scales }, Some(q)) => {
            // SAFETY: Job shapes were checked by `check_problem`, `q` is the
            // job's x quantized, and NEON is part of the aarch64 baseline.
            unsafe { neon_mxfp4::run_rows(blocks, scales, q, job, rows) }
        }
        (WeightData::Mxfp4 { .. }, None) => {
            unreachable!("matmul quantizes the activations of MXFP4 on NEON")
        }
        _ => neon::run_rows(job, rows),
    }
}
