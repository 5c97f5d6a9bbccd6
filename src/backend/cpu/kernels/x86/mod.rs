//! x86-64 kernels: AVX2 + FMA, entered only through an x86 tier (`Isa::Avx2`,
//! `Isa::Avx512`, `Isa::Avx512Bf16`, `Isa::Amx`, which exist only after
//! run-time detection). The AVX-512 tiers run the AVX2 kernels with these additions:
//! the integer FP4 kernels two pairs of blocks per zmm instruction
//! (`avx2_fp4.rs`, the same bits), NVFP4 rows of an odd number of 16-value
//! blocks decoded by table permutes (`avx512_nvfp4.rs`, the same bits), the
//! panel path over row pairs in zmm registers (`avx512_panel.rs`, the same
//! bits), INT4 with 16 rows per zmm (`avx512_int4.rs`, the same bits), and
//! on `Avx512Bf16` BF16 weights by `vdpbf16ps` (`avx512_bf16.rs`), on
//! `Amx` by AMX tiles (`amx_bf16.rs`).
//! `avx2.rs` holds the f32-decoding matmul kernels (F32, BF16, NVFP4 and FP8,
//! with the decoders of `avx2_nvfp4.rs`, `avx512_nvfp4.rs` and
//! `avx2_fp8.rs`), `avx2_fp4.rs` the integer FP4 kernels (MXFP4, and NVFP4
//! whose rows are whole 32-value blocks) with their scales (`fp4_scales.rs`)
//! and activation quantizer (`avx2_quantize.rs`), `avx2_int4.rs` and `avx512_int4.rs` the integer GPTQ INT4
//! kernels, `avx2_ops.rs`
//! the small ops;
//! `lanes.rs` what the two matmul files share. This file sends each format
//! to its kernels.

mod amx_bf16;
mod avx2;
mod avx2_fp4;
mod avx2_fp8;
mod avx2_int4;
mod avx2_nvfp4;
pub(super) mod avx2_ops;
mod avx2_quantize;
mod avx512_bf16;
mod avx512_int4;
mod avx512_nvfp4;
mod avx512_panel;
mod fp4_scales;
mod lanes;

use std::ops::Range;

use super::isa::Isa;
use super::job::{Job, Path};
use super::quantize::integer_nvfp4;
use crate::checkpoint::linear::{LinearWeight, WeightData};
use fp4_scales::{Mxfp4Scales, Nvfp4Scales};

pub(super) use avx2_quantize::quantize_row;

/// Which path a problem takes on an x86 tier.
pub(super) fn choose_path(isa: Isa, w: &LinearWeight, tokens: usize) -> Path {
    match w.data {
        WeightData::Bf16(_) if isa == Isa::Avx512Bf16 => avx512_bf16::choose_path(tokens),
        // One kernel for every token count (`amx_bf16`).
        WeightData::Bf16(_) if isa == Isa::Amx => Path::Gemv,
        WeightData::Mxfp4 { .. } => avx2_fp4::choose_path(w.cols, tokens),
        WeightData::Nvfp4 { .. } if integer_nvfp4(w) => avx2_fp4::choose_path(w.cols, tokens),
        // One kernel for every token count (`avx2_int4`).
        WeightData::Int4 { .. } => Path::Gemv,
        _ => avx2::choose_path(w, tokens),
    }
}

/// Computes rows `rows` of a job on an x86 tier.
pub(super) fn run_rows(isa: Isa, job: &Job, rows: Range<usize>) {
    match (job.weight.data, &job.quantized) {
        (WeightData::Bf16(bytes), _) if isa == Isa::Avx512Bf16 => {
            // SAFETY: Job shapes were checked by `check_problem`, and this
            // arm is only reached through Isa::Avx512Bf16, i.e. with AVX2,
            // FMA, AVX-512F/BW/VL and AVX-512 BF16 detected.
            unsafe { avx512_bf16::run_rows(bytes, job, rows) }
        }
        (WeightData::Bf16(bytes), _) if isa == Isa::Amx => {
            // SAFETY: Job shapes were checked by `check_problem`, and this
            // arm is only reached through Isa::Amx, i.e. with the AVX-512
            // BF16 tier's features, AMX-TILE and AMX-BF16 detected and the
            // tile data permitted.
            unsafe { amx_bf16::run_rows(bytes, job, rows) }
        }
        (WeightData::Mxfp4 { blocks, scales }, Some(q)) => {
            let stream = avx2_fp4::Stream::new(blocks, scales, job.weight.cols, Mxfp4Scales);
            // SAFETY: Job shapes were checked by `check_problem`, `q` is the
            // job's x quantized, and this module is only reached through an
            // x86 tier, i.e. with AVX2 and FMA present (AVX-512F/VL where
            // `isa.runs_avx512()`).
            unsafe { avx2_fp4::run_rows(isa, stream, q, job, rows) }
        }
        (WeightData::Mxfp4 { .. }, None) => {
            unreachable!("matmul quantizes the activations of MXFP4 on x86")
        }
        (
            WeightData::Nvfp4 {
                packed,
                scales,
                global,
            },
            Some(q),
        ) => {
            let format = Nvfp4Scales::new(global);
            let stream = avx2_fp4::Stream::new(packed, scales, job.weight.cols, format);
            // SAFETY: as for MXFP4 above.
            unsafe { avx2_fp4::run_rows(isa, stream, q, job, rows) }
        }
        (WeightData::Int4 { .. }, Some(q)) if isa.runs_avx512() => {
            // SAFETY: as above: shapes checked, `q` the job's x quantized;
            // this tier exists only with AVX2, FMA and AVX-512F/BW detected.
            unsafe { avx512_int4::run_rows(job, q, rows) }
        }
        (WeightData::Int4 { .. }, Some(q)) => {
            // SAFETY: as above: shapes checked, `q` the job's x quantized,
            // AVX2 and FMA present.
            unsafe { avx2_int4::run_rows(job, q, rows) }
        }
        (WeightData::Int4 { .. }, None) => {
            unreachable!("matmul sends INT4 without quantized activations to the portable kernel")
        }
        _ => avx2::run_rows(isa, job, rows),
    }
}
