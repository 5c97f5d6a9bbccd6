//! Every CUDA kernel against the CPU backend on random inputs: sizes that
//! are not multiples of the tiles, one row and many, misaligned weights in
//! every format, experts with few or no rows; the tensor-core kernels and
//! the warp-per-row ones alike. Skipped, with the reason printed, on a
//! machine without a usable GPU (the emulator's own mma test needs g++).

use crate::common;
use crate::cuda_common;
use crate::format_cases;
use crate::kernels_common;

use cuda_common::{Both, assert_close, workspace_plan};
use kernels_common::{Format, OwnedWeight, Rng, random_weight, random_x};
use sparkrt::backend::cpu::kernels::{Isa, quantizes_activations};
use sparkrt::backend::cuda::{MatmulPath, TENSOR_CORE_MIN_ROWS, WeightsPolicy, constants};
use sparkrt::backend::{
    AttentionShape, Backend, ExpertActivation, ExpertsSpec, GateUp, KvLayout, Matmul, RouterKind,
    StepMetadataPlan,
};
use sparkrt::checkpoint::kv_scales::KvScales;
use sparkrt::checkpoint::linear::{VectorData, VectorWeight};
use sparkrt::plan::ledger::WeightsResidency;
use sparkrt::plan::profile::KvCacheDtype;
use sparkrt::step::{Logits, NO_BLOCK, StepBatch};

/// A bf16 vector (norm weight, bias, sinks) stored at `offset`.
struct OwnedVector {
    bytes: Vec<u8>,
    offset: usize,
    len: usize,
}

impl OwnedVector {
    fn bf16(values: &[f32], offset: usize) -> OwnedVector {
        let mut bytes = vec![0u8; offset];
        for &v in values {
            bytes.extend(half::bf16::from_f32(v).to_le_bytes());
        }
        OwnedVector {
            bytes,
            offset,
            len: values.len(),
        }
    }

    fn f32(values: &[f32], offset: usize) -> OwnedVector {
        let mut bytes = vec![0u8; offset];
        for &v in values {
            bytes.extend(v.to_le_bytes());
        }
        OwnedVector {
            bytes,
            offset,
            len: values.len(),
        }
    }

    fn view(&self) -> VectorWeight<'_> {
        let b = &self.bytes[self.offset..];
        VectorWeight::new(
            self.len,
            if b.len() == 2 * self.len {
                VectorData::Bf16(b)
            } else {
                VectorData::F32(b)
            },
        )
    }
}

fn regions<'a>(weights: &'a [OwnedWeight], vectors: &'a [OwnedVector]) -> Vec<&'a [u8]> {
    let mut r: Vec<&[u8]> = Vec::new();
    for w in weights {
        r.push(&w.data);
        if !w.scales.is_empty() {
            r.push(&w.scales);
        }
    }
    for v in vectors {
        r.push(&v.bytes);
    }
    r.retain(|b| !b.is_empty());
    r
}

fn cols_for(format: Format, rng: &mut Rng) -> usize {
    match format {
        // FP8: not in `FORMATS` (the CUDA backend refuses FP8 weights).
        Format::F32 | Format::Bf16 | Format::Fp8 | Format::Fp8Block(_) => {
            [1usize, 7, 33, 100, 259][rng.int(0, 4) as usize]
        }
        Format::Nvfp4 => 16 * rng.int(1, 12) as usize,
        Format::Mxfp4 => 32 * rng.int(1, 6) as usize,
    }
}

#[test]
fn matmul_matches_the_cpu_in_every_format_size_and_alignment() {
    let mut rng = Rng::new(11);
    let mut cases = Vec::new();
    for format in kernels_common::FORMATS {
        for (rows_out, tokens, offset, exact) in [
            (1, 1, 0, true),
            (5, 3, 1, true),
            (37, 9, 2, true),
            (64, 17, 4, true),
            (33, 8, 8, false),
            (70, 1, 3, false),
        ] {
            let cols = cols_for(format, &mut rng);
            cases.push((
                random_weight(&mut rng, format, rows_out, cols, offset, exact),
                tokens,
                exact,
            ));
        }
    }
    let weights: Vec<OwnedWeight> = cases
        .iter()
        .map(|(w, _, _)| {
            // Each case keeps its own bytes; a copy keeps `cases` simple.
            OwnedWeight {
                data: w.data.clone(),
                scales: w.scales.clone(),
                ..*w
            }
        })
        .collect();
    let biases: Vec<OwnedVector> = weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let values: Vec<f32> = (0..w.rows).map(|j| (j as f32 - 3.0) * 0.25).collect();
            if i % 2 == 0 {
                OwnedVector::bf16(&values, i % 3)
            } else {
                OwnedVector::f32(&values, 0)
            }
        })
        .collect();
    let Some(b) = Both::new("matmul", &regions(&weights, &biases), WeightsPolicy::Copy) else {
        return;
    };
    for (i, ((w, tokens, exact), bias)) in weights
        .iter()
        .zip(cases.iter().map(|c| (c.1, c.2)))
        .map(|(w, (t, e))| (w, t, e))
        .zip(&biases)
        .enumerate()
    {
        let (k, n) = (w.cols, w.rows);
        // Rows from an offset into x, as the lm_head reads the sampled rows.
        let x_row = i % 3;
        let x = random_x(&mut rng, (x_row + tokens) * k, exact);
        let (xc, xg) = b.buffers(&x, x.len());
        let (mut oc, mut og) = b.zeros(tokens * n + 5);
        let (wc, wg) = (
            b.cpu.linear(w.view()).unwrap(),
            b.cuda.linear(w.view()).unwrap(),
        );
        let with_bias = i % 4 != 3;
        let (bc, bg) = (
            b.cpu.vector(bias.view()).unwrap(),
            b.cuda.vector(bias.view()).unwrap(),
        );
        b.cpu
            .matmul(&mut [Matmul {
                x: &xc,
                x_row,
                rows: tokens,
                w: &wc,
                bias: with_bias.then_some(&bc),
                out: &mut oc,
            }])
            .unwrap();
        b.cuda
            .matmul(&mut [Matmul {
                x: &xg,
                x_row,
                rows: tokens,
                w: &wg,
                bias: with_bias.then_some(&bg),
                out: &mut og,
            }])
            .unwrap();
        let (c, g) = (b.read_cpu(&oc, tokens * n), b.read_cuda(&og, tokens * n));
        let what = format!(
            "matmul {:?} [{n}, {k}] × {tokens} rows, offset {}",
            w.format, w.offset
        );
        let mma = tokens >= TENSOR_CORE_MIN_ROWS && w.format != Format::F32;
        assert_matmul_close(&what, w, &x, x_row, tokens, &c, &g, exact, mma);
    }
}

/// CPU `c` against CUDA `g` for `tokens` rows of `x` (from `x_row`) times
/// `w`: equal when `exact` (values on a coarse grid: every order of
/// summation gives the same f32); else within the summation-order bound of
/// Σ|terms| (`kernels_common::tolerance`), plus the CPU's quantization of
/// MXFP4 activations. The tensor cores (`mma`) decode the weights to BF16
/// exactly and split each activation exactly into three BF16 terms
/// (kernels/mma.cuh): their only error is summing 3·k exact partial
/// products in f32, so their bound is the same one over 3·k terms.
#[allow(clippy::too_many_arguments)]
fn assert_matmul_close(
    what: &str,
    w: &OwnedWeight,
    x: &[f32],
    x_row: usize,
    tokens: usize,
    c: &[f32],
    g: &[f32],
    exact: bool,
    mma: bool,
) {
    if exact {
        assert_eq!(c, g, "{what}");
        return;
    }
    let (k, n) = (w.cols, w.rows);
    let view = w.view();
    let mut row = vec![0f32; k];
    for j in 0..n {
        view.decode_row(j, &mut row).unwrap();
        for t in 0..tokens {
            let xs = &x[(x_row + t) * k..(x_row + t + 1) * k];
            let magnitude: f32 = row.iter().zip(xs).map(|(a, b)| (a * b).abs()).sum();
            let terms = if mma { 3 * k } else { k };
            let mut bound = kernels_common::tolerance(terms, magnitude) + 1e-6;
            // The CPU multiplies MXFP4 with int16-quantized activations.
            if quantizes_activations(Isa::best(), &view) {
                bound += kernels_common::quantization_bound(xs, &view, j);
            }
            let (a, e) = (c[t * n + j], g[t * n + j]);
            assert!(
                (a - e).abs() <= bound,
                "{what} [{t}, {j}]: cpu {a} vs cuda {e}, bound {bound}"
            );
        }
    }
}

/// Launches of `kernel` so far.
fn launches_of(b: &Both, kernel: &str) -> u64 {
    b.cuda
        .launch_counts()
        .iter()
        .find(|(name, _)| *name == kernel)
        .map_or(0, |&(_, n)| n)
}

#[test]
fn tensor_core_matmul_matches_the_cpu_in_every_format_and_awkward_shape() {
    let mut rng = Rng::new(21);
    // [rows, cols]: rows not multiples of 16; BF16 columns not multiples
    // of 16 (partial k tiles, odd rows misaligned); FP4 columns whole groups.
    let shapes: [(Format, usize, usize); 8] = [
        (Format::Bf16, 37, 100),
        (Format::Bf16, 16, 16),
        (Format::Bf16, 5, 7),
        (Format::Bf16, 70, 33),
        (Format::Nvfp4, 37, 48),
        (Format::Nvfp4, 70, 16),
        (Format::Mxfp4, 21, 64),
        (Format::Mxfp4, 40, 96),
    ];
    let mut weights = Vec::new();
    for (i, &(format, rows, cols)) in shapes.iter().enumerate() {
        for exact in [true, false] {
            weights.push(random_weight(&mut rng, format, rows, cols, i % 5, exact));
        }
    }
    let bias = OwnedVector::bf16(&rng.floats(70, -1.0, 1.0), 1);
    let Some(b) = Both::new(
        "tensor-core matmul",
        &regions(&weights, std::slice::from_ref(&bias)),
        WeightsPolicy::Copy,
    ) else {
        return;
    };
    b.cuda.set_matmul_path(MatmulPath::TensorCores);
    let before = launches_of(&b, "matmul_mma");
    let mut launches = 0;
    for (i, w) in weights.iter().enumerate() {
        let exact = i % 2 == 0;
        let (k, n) = (w.cols, w.rows);
        let (wc, wg) = (
            b.cpu.linear(w.view()).unwrap(),
            b.cuda.linear(w.view()).unwrap(),
        );
        let short = OwnedVector {
            bytes: bias.bytes[..bias.offset + 2 * n].to_vec(),
            offset: bias.offset,
            len: n,
        };
        let (bc, bg) = (
            b.cpu.vector(short.view()).unwrap(),
            b.cuda.vector(bias.view()).unwrap(),
        );
        // 64 rows fill one block's tiles; 70 spill into a second block.
        for tokens in [1, 7, 9, 33, 64, 70] {
            let x_row = tokens % 3;
            let x = random_x(&mut rng, (x_row + tokens) * k, exact);
            let (xc, xg) = b.buffers(&x, x.len());
            let (mut oc, mut og) = b.zeros(tokens * n);
            let with_bias = tokens % 2 == 1;
            b.cpu
                .matmul(&mut [Matmul {
                    x: &xc,
                    x_row,
                    rows: tokens,
                    w: &wc,
                    bias: with_bias.then_some(&bc),
                    out: &mut oc,
                }])
                .unwrap();
            b.cuda
                .matmul(&mut [Matmul {
                    x: &xg,
                    x_row,
                    rows: tokens,
                    w: &wg,
                    bias: with_bias.then_some(&bg),
                    out: &mut og,
                }])
                .unwrap();
            launches += 1;
            let what = format!(
                "matmul_mma {:?} [{n}, {k}] × {tokens} rows, offset {}, exact {exact}",
                w.format, w.offset
            );
            let (c, g) = (b.read_cpu(&oc, tokens * n), b.read_cuda(&og, tokens * n));
            assert_matmul_close(&what, w, &x, x_row, tokens, &c, &g, exact, true);
        }
    }
    // Every one of them ran on the tensor cores.
    assert_eq!(launches_of(&b, "matmul_mma") - before, launches);
}

#[test]
fn the_crossover_picks_the_gemv_up_to_eight_rows_and_tensor_cores_past() {
    let mut rng = Rng::new(22);
    let weights = [
        random_weight(&mut rng, Format::Bf16, 20, 32, 0, true),
        random_weight(&mut rng, Format::F32, 20, 32, 0, true),
    ];
    let Some(b) = Both::new("crossover", &regions(&weights, &[]), WeightsPolicy::Copy) else {
        return;
    };
    let x = random_x(&mut rng, 64 * 32, true);
    let (_, xg) = b.buffers(&x, x.len());
    let (_, mut og) = b.zeros(64 * 20);
    let mut run = |w: &OwnedWeight, rows: usize| {
        let wg = b.cuda.linear(w.view()).unwrap();
        let (gemv, mma) = (launches_of(&b, "matmul"), launches_of(&b, "matmul_mma"));
        b.cuda
            .matmul(&mut [Matmul {
                x: &xg,
                x_row: 0,
                rows,
                w: &wg,
                bias: None,
                out: &mut og,
            }])
            .unwrap();
        (
            launches_of(&b, "matmul") - gemv,
            launches_of(&b, "matmul_mma") - mma,
        )
    };
    assert_eq!(TENSOR_CORE_MIN_ROWS, 9);
    for rows in [1, 7, 8] {
        assert_eq!(run(&weights[0], rows), (1, 0), "{rows} rows");
    }
    for rows in [9, 33, 64] {
        assert_eq!(run(&weights[0], rows), (0, 1), "{rows} rows");
    }
    // F32 weights have no BF16 form: always the GEMV.
    assert_eq!(run(&weights[1], 33), (1, 0), "F32");
}

#[test]
fn matmul_runs_several_jobs_in_one_launch() {
    let mut rng = Rng::new(12);
    let weights: Vec<OwnedWeight> = [(70, 48), (8, 48), (8, 48), (3, 48), (5, 48)]
        .iter()
        .enumerate()
        .map(|(i, &(r, c))| random_weight(&mut rng, Format::Bf16, r, c, i, true))
        .collect();
    let Some(b) = Both::new("matmul jobs", &regions(&weights, &[]), WeightsPolicy::Copy) else {
        return;
    };
    // Six rows: the GEMV; 40: the tensor cores (block indices over jobs).
    for tokens in [6, 40] {
        several_jobs_in_one_launch(&b, &weights, tokens, &mut rng);
    }
}

fn several_jobs_in_one_launch(b: &Both, weights: &[OwnedWeight], tokens: usize, rng: &mut Rng) {
    let x = random_x(rng, tokens * 48, true);
    let (xc, xg) = b.buffers(&x, x.len());
    let wc: Vec<_> = weights
        .iter()
        .map(|w| b.cpu.linear(w.view()).unwrap())
        .collect();
    let wg: Vec<_> = weights
        .iter()
        .map(|w| b.cuda.linear(w.view()).unwrap())
        .collect();
    let mut outs_c: Vec<_> = weights.iter().map(|w| b.zeros(tokens * w.rows).0).collect();
    let mut outs_g: Vec<_> = weights.iter().map(|w| b.zeros(tokens * w.rows).1).collect();
    // Five jobs: more than one launch holds (four), split transparently.
    let mut jobs_c: Vec<_> = wc
        .iter()
        .zip(outs_c.iter_mut())
        .map(|(w, out)| Matmul {
            x: &xc,
            x_row: 0,
            rows: tokens,
            w,
            bias: None,
            out,
        })
        .collect();
    b.cpu.matmul(&mut jobs_c).unwrap();
    let mut jobs_g: Vec<_> = wg
        .iter()
        .zip(outs_g.iter_mut())
        .map(|(w, out)| Matmul {
            x: &xg,
            x_row: 0,
            rows: tokens,
            w,
            bias: None,
            out,
        })
        .collect();
    b.cuda.matmul(&mut jobs_g).unwrap();
    drop(jobs_c);
    drop(jobs_g);
    for (i, w) in weights.iter().enumerate() {
        let n = tokens * w.rows;
        assert_eq!(
            b.read_cpu(&outs_c[i], n),
            b.read_cuda(&outs_g[i], n),
            "job {i}, {tokens} rows"
        );
    }
}

#[test]
fn norms_match_the_cpu() {
    let mut rng = Rng::new(13);
    let widths = [1usize, 7, 100, 257, 2050];
    let vectors: Vec<OwnedVector> = widths
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let values = rng.floats(w, 0.5, 1.5);
            if i % 2 == 0 {
                OwnedVector::bf16(&values, i)
            } else {
                OwnedVector::f32(&values, 0)
            }
        })
        .collect();
    let Some(b) = Both::new("rmsnorm", &regions(&[], &vectors), WeightsPolicy::Copy) else {
        return;
    };
    for (&width, v) in widths.iter().zip(&vectors) {
        for rows in [1usize, 13] {
            let n = rows * width;
            let x = rng.floats(n, -3.0, 3.0);
            let delta = rng.floats(n, -1.0, 1.0);
            let (wc, wg) = (
                b.cpu.vector(v.view()).unwrap(),
                b.cuda.vector(v.view()).unwrap(),
            );
            let (xc, xg) = b.buffers(&x, n);
            let (mut oc, mut og) = b.zeros(n);
            b.cpu.rmsnorm(&xc, &wc, 1e-6, rows, width, &mut oc).unwrap();
            b.cuda
                .rmsnorm(&xg, &wg, 1e-6, rows, width, &mut og)
                .unwrap();
            assert_close(
                &format!("rmsnorm {rows}×{width}"),
                &b.read_cpu(&oc, n),
                &b.read_cuda(&og, n),
                1e-6,
                1e-5,
            );

            let (mut rc, mut rg) = b.buffers(&x, n);
            let (dc, dg) = b.buffers(&delta, n);
            b.cpu
                .add_rmsnorm(&mut rc, &dc, &wc, 1e-5, rows, width, &mut oc)
                .unwrap();
            b.cuda
                .add_rmsnorm(&mut rg, &dg, &wg, 1e-5, rows, width, &mut og)
                .unwrap();
            assert_eq!(
                b.read_cpu(&rc, n),
                b.read_cuda(&rg, n),
                "residual {rows}×{width}"
            );
            assert_close(
                &format!("add_rmsnorm {rows}×{width}"),
                &b.read_cpu(&oc, n),
                &b.read_cuda(&og, n),
                1e-6,
                1e-5,
            );
        }
    }
}

#[test]
fn elementwise_ops_match_the_cpu() {
    let mut rng = Rng::new(14);
    let Some(b) = Both::new("elementwise", &[], WeightsPolicy::Copy) else {
        return;
    };
    for n in [1usize, 255, 256, 257, 100_003] {
        let gate = rng.floats(n, -6.0, 6.0);
        let up = rng.floats(n, -2.0, 2.0);
        let (mut gc, mut gg) = b.buffers(&gate, n);
        let (uc, ug) = b.buffers(&up, n);
        b.cpu.silu_mul(&mut gc, &uc, n).unwrap();
        b.cuda.silu_mul(&mut gg, &ug, n).unwrap();
        assert_close(
            &format!("silu_mul {n}"),
            &b.read_cpu(&gc, n),
            &b.read_cuda(&gg, n),
            1e-6,
            2e-6,
        );
        let (mut rc, mut rg) = b.buffers(&gate, n);
        b.cpu.add(&mut rc, &uc, n).unwrap();
        b.cuda.add(&mut rg, &ug, n).unwrap();
        assert_eq!(b.read_cpu(&rc, n), b.read_cuda(&rg, n), "add {n}");
    }
}

#[test]
fn embedding_gather_and_compaction_match_the_cpu() {
    let mut rng = Rng::new(15);
    let (vocab, width) = (97usize, 45usize);
    let table = random_weight(&mut rng, Format::Bf16, vocab, width, 3, false);
    let Some(b) = Both::new(
        "embed",
        &regions(std::slice::from_ref(&table), &[]),
        WeightsPolicy::Copy,
    ) else {
        return;
    };
    let (tc, tg) = (
        b.cpu.linear(table.view()).unwrap(),
        b.cuda.linear(table.view()).unwrap(),
    );
    let mut batch = StepBatch::with_capacity(32, 4, 8);
    batch.push_seq(&[5, 96, 0, 5], 0, &[0], &[], Logits::All);
    batch.push_seq(&[17], 3, &[1], &[], Logits::Last);
    batch.push_seq(&[1, 2, 3], 9, &[2, 3, 4], &[], Logits::Last);
    let rows = batch.rows();
    let mut sc = b
        .cpu
        .step_storage(&StepMetadataPlan::new(32, 4, 8))
        .unwrap();
    let mut sg = b
        .cuda
        .step_storage(&StepMetadataPlan::new(32, 4, 8))
        .unwrap();
    b.cpu.load_step(&batch, &mut sc).unwrap();
    b.cuda.load_step(&batch, &mut sg).unwrap();
    let (mut oc, mut og) = b.zeros(32 * width);
    b.cpu.embed(&tc, &sc, &mut oc).unwrap();
    b.cuda.embed(&tg, &sg, &mut og).unwrap();
    assert_eq!(
        b.read_cpu(&oc, rows * width),
        b.read_cuda(&og, rows * width),
        "embed"
    );

    // Rows 0..3 (All), 4 (Last of the second), 7 (Last of the third).
    b.cpu.compact_rows(&mut oc, &sc, width).unwrap();
    b.cuda.compact_rows(&mut og, &sg, width).unwrap();
    let kept = batch.logit_rows.len() * width;
    assert_eq!(batch.logit_rows, vec![0, 1, 2, 3, 4, 7]);
    assert_eq!(
        b.read_cpu(&oc, kept),
        b.read_cuda(&og, kept),
        "compact_rows"
    );
}

/// The case table of tests/format_cases through the CUDA decoders of
/// kernels/common.cuh (the embedding gather decodes element by element), and
/// the CPU's gather (the checkpoint's row decoders) beside them.
#[test]
fn embedding_gather_decodes_the_format_cases() {
    use format_cases::{CASE_COLS, CaseWeight, Kind, same};
    for kind in [Kind::E2M1, Kind::E4M3, Kind::E8M0] {
        let table = CaseWeight::new(kind);
        let Some(b) = Both::new(
            "format cases",
            &[&table.codes, &table.scales],
            WeightsPolicy::Copy,
        ) else {
            return;
        };
        let (tc, tg) = (
            b.cpu.linear(table.view()).unwrap(),
            b.cuda.linear(table.view()).unwrap(),
        );
        let rows = table.rows();
        let ids: Vec<u32> = (0..rows as u32).collect();
        // At most 32 cases per format: one sequence of 32 tokens at most.
        let mut batch = StepBatch::with_capacity(32, 4, 8);
        batch.push_seq(&ids, 0, &[0, 1], &[], Logits::Last);
        let mut sc = b
            .cpu
            .step_storage(&StepMetadataPlan::new(32, 4, 8))
            .unwrap();
        let mut sg = b
            .cuda
            .step_storage(&StepMetadataPlan::new(32, 4, 8))
            .unwrap();
        b.cpu.load_step(&batch, &mut sc).unwrap();
        b.cuda.load_step(&batch, &mut sg).unwrap();
        let (mut oc, mut og) = b.zeros(32 * CASE_COLS);
        b.cpu.embed(&tc, &sc, &mut oc).unwrap();
        b.cuda.embed(&tg, &sg, &mut og).unwrap();
        let (cpu, cuda) = (
            b.read_cpu(&oc, rows * CASE_COLS),
            b.read_cuda(&og, rows * CASE_COLS),
        );
        for (r, case) in table.cases.iter().enumerate() {
            for (side, out) in [("cpu", &cpu), ("cuda", &cuda)] {
                let got = out[r * CASE_COLS];
                assert!(
                    same(got, case.value),
                    "{side}: {kind:?} byte {:#04x} gave {got}, expected {}",
                    case.byte,
                    case.value
                );
            }
        }
    }
}

#[test]
fn rope_and_qk_norm_match_the_cpu() {
    let mut rng = Rng::new(16);
    for (heads, kv_heads, hd, norm) in [
        (4usize, 2usize, 16usize, true),
        (3, 1, 64, false),
        (2, 2, 128, true),
        (8, 4, 6, true),
    ] {
        let norms = [
            OwnedVector::bf16(&rng.floats(hd, 0.5, 1.5), 1),
            OwnedVector::bf16(&rng.floats(hd, 0.5, 1.5), 0),
        ];
        let Some(b) = Both::new("qk_norm_rope", &regions(&[], &norms), WeightsPolicy::Copy) else {
            return;
        };
        let mut batch = StepBatch::with_capacity(64, 4, 64);
        batch.push_seq(&[1; 9], 0, &[0], &[], Logits::Last);
        batch.push_seq(&[1], 4000, &[1], &[], Logits::Last);
        batch.push_seq(&[1; 3], 70_000, &[2], &[], Logits::Last);
        let rows = batch.rows();
        let mut sc = b
            .cpu
            .step_storage(&StepMetadataPlan::new(64, 4, 64))
            .unwrap();
        let mut sg = b
            .cuda
            .step_storage(&StepMetadataPlan::new(64, 4, 64))
            .unwrap();
        b.cpu.load_step(&batch, &mut sc).unwrap();
        b.cuda.load_step(&batch, &mut sg).unwrap();
        // YaRN-like frequencies and attention factor.
        let inv_freq: Vec<f32> = (0..hd / 2)
            .map(|j| {
                150_000f32.powf(-2.0 * j as f32 / hd as f32) / if j > hd / 4 { 32.0 } else { 1.0 }
            })
            .collect();
        let (mut rc, mut rg) = b.zeros(64 * hd);
        b.cpu
            .rope_table(&sc, &inv_freq, 1.3466, rows, &mut rc)
            .unwrap();
        b.cuda
            .rope_table(&sg, &inv_freq, 1.3466, rows, &mut rg)
            .unwrap();
        // cos/sin of the same f32 angle in double precision: equal or 1 ulp.
        assert_close(
            "rope table",
            &b.read_cpu(&rc, rows * hd),
            &b.read_cuda(&rg, rows * hd),
            0.0,
            2.5e-7,
        );

        let shape = AttentionShape {
            heads,
            kv_heads,
            head_dim: hd,
            rotary_dim: hd,
            scale: 1.0,
            window: None,
        };
        let q = rng.floats(rows * heads * hd, -2.0, 2.0);
        let k = rng.floats(rows * kv_heads * hd, -2.0, 2.0);
        let (mut qc, mut qg) = b.buffers(&q, q.len());
        let (mut kc, mut kg) = b.buffers(&k, k.len());
        let (nc, ng) = (
            [
                b.cpu.vector(norms[0].view()).unwrap(),
                b.cpu.vector(norms[1].view()).unwrap(),
            ],
            [
                b.cuda.vector(norms[0].view()).unwrap(),
                b.cuda.vector(norms[1].view()).unwrap(),
            ],
        );
        b.cpu
            .qk_norm_rope(
                &mut qc,
                &mut kc,
                norm.then_some((&nc[0], &nc[1], 1e-6)),
                &rc,
                rows,
                &shape,
            )
            .unwrap();
        b.cuda
            .qk_norm_rope(
                &mut qg,
                &mut kg,
                norm.then_some((&ng[0], &ng[1], 1e-6)),
                &rg,
                rows,
                &shape,
            )
            .unwrap();
        assert_close(
            &format!("q {heads}×{hd}"),
            &b.read_cpu(&qc, q.len()),
            &b.read_cuda(&qg, q.len()),
            1e-5,
            1e-5,
        );
        assert_close(
            &format!("k {kv_heads}×{hd}"),
            &b.read_cpu(&kc, k.len()),
            &b.read_cuda(&kg, k.len()),
            1e-5,
            1e-5,
        );
    }
}

/// One sequence's KV bookkeeping in the attention test: its full and
/// sliding-window block tables.
struct Seq {
    past: usize,
    sliding: Vec<u32>,
    blocks: Vec<u32>,
}

/// Hands out free blocks (last freed first, as a LIFO allocator does, so
/// released blocks come back at once) and counts blocks handed out again.
struct Pool {
    free: Vec<u32>,
    used_before: Vec<bool>,
    reused: usize,
    released: usize,
}

impl Pool {
    fn new(blocks: u32) -> Pool {
        // Out of order, as a real allocator's after frees.
        let mut free: Vec<u32> = (0..blocks).rev().collect();
        free.swap(3, 40);
        Pool {
            free,
            used_before: vec![false; blocks as usize],
            reused: 0,
            released: 0,
        }
    }

    fn take(&mut self) -> u32 {
        let b = self.free.pop().expect("the test's pool is large enough");
        if std::mem::replace(&mut self.used_before[b as usize], true) {
            self.reused += 1;
        }
        b
    }

    /// Releases the sliding blocks no later query of `seq` can see: block
    /// `i` when all its positions are before `past + 1 − window`.
    fn release_out_of_window(&mut self, seq: &mut Seq, block: usize, window: usize) {
        let first = (seq.past + 1).saturating_sub(window);
        for (i, entry) in seq.sliding.iter_mut().enumerate() {
            if (i + 1) * block <= first && *entry != NO_BLOCK {
                self.free.push(*entry);
                *entry = NO_BLOCK;
                self.released += 1;
            }
        }
    }
}

#[test]
fn attention_over_full_and_sliding_tables_matches_the_cpu() {
    let mut rng = Rng::new(17);
    // (heads, kv heads, head_dim, sinks, kv dtype, forced split)
    let shapes = [
        (4usize, 2usize, 16usize, false, KvCacheDtype::F32, None),
        (8, 1, 40, true, KvCacheDtype::Bf16, None),
        (6, 3, 64, true, KvCacheDtype::F32, Some(32usize)),
        (2, 2, 128, false, KvCacheDtype::Bf16, Some(64)),
        (4, 4, 256, true, KvCacheDtype::F32, None),
    ];
    for (heads, kv_heads, hd, with_sinks, dtype, split) in shapes {
        let sinks = OwnedVector::bf16(&rng.floats(heads, -1.0, 3.0), 1);
        let Some(b) = Both::new(
            "attention",
            &regions(&[], std::slice::from_ref(&sinks)),
            WeightsPolicy::Copy,
        ) else {
            return;
        };
        b.cuda.set_attention_split(split);
        let (block, window) = (4usize, 5usize);
        let layout = KvLayout {
            kv_heads,
            head_dim: hd,
            block_size: block,
            blocks: 64,
            window,
            // Layer 0 full attention, layer 1 sliding: both in array 0, each
            // through its own table.
            sliding_layers: vec![false, true],
            dtype,
        };
        let mut kv_c = b.cpu.kv_cache(&layout, 2, &KvScales::unit(2)).unwrap();
        let mut kv_g = b.cuda.kv_cache(&layout, 2, &KvScales::unit(2)).unwrap();
        let (max_tokens, max_seqs, max_blocks) = (48usize, 3usize, 16usize);
        let mut step_c = b
            .cpu
            .step_storage(&StepMetadataPlan::new(max_tokens, max_seqs, max_blocks))
            .unwrap();
        let mut step_g = b
            .cuda
            .step_storage(&StepMetadataPlan::new(max_tokens, max_seqs, max_blocks))
            .unwrap();
        let plan = workspace_plan(max_tokens, 4, 8, 64, 32);
        let mut ws_c = b.cpu.workspace(&plan).unwrap();
        let mut ws_g = b.cuda.workspace(&plan).unwrap();
        let (sc, sg) = (
            b.cpu.vector(sinks.view()).unwrap(),
            b.cuda.vector(sinks.view()).unwrap(),
        );

        // Full and sliding blocks from one pool, as the engine's.
        let mut pool = Pool::new(64);
        let mut seqs = [
            Seq {
                past: 0,
                blocks: vec![],
                sliding: vec![],
            },
            Seq {
                past: 0,
                blocks: vec![],
                sliding: vec![],
            },
            Seq {
                past: 0,
                blocks: vec![],
                sliding: vec![],
            },
        ];
        // Steps: chunks longer than a query tile, than the window, decode rows.
        let steps: [&[usize]; 5] = [&[7, 20, 1], &[9, 1, 1], &[1, 1, 17], &[1, 1, 1], &[3, 0, 1]];
        for (s, lens) in steps.iter().enumerate() {
            let mut batch = StepBatch::with_capacity(max_tokens, max_seqs, max_blocks);
            for (seq, &len) in seqs.iter_mut().zip(lens.iter()) {
                if len == 0 {
                    continue;
                }
                while seq.blocks.len() * block < seq.past + len {
                    seq.blocks.push(pool.take());
                    seq.sliding.push(pool.take());
                }
                batch.push_seq(
                    &vec![1; len],
                    seq.past,
                    &seq.blocks,
                    &seq.sliding,
                    Logits::Last,
                );
                seq.past += len;
            }
            let rows = batch.rows();
            b.cpu.load_step(&batch, &mut step_c).unwrap();
            b.cuda.load_step(&batch, &mut step_g).unwrap();
            for layer in 0..2 {
                let shape = AttentionShape {
                    heads,
                    kv_heads,
                    head_dim: hd,
                    rotary_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    window: (layer == 1).then_some(window),
                };
                let q = rng.floats(rows * heads * hd, -2.0, 2.0);
                let k = rng.floats(rows * kv_heads * hd, -2.0, 2.0);
                let v = rng.floats(rows * kv_heads * hd, -2.0, 2.0);
                let (qc, qg) = b.buffers(&q, q.len());
                let (mut kc, mut kg) = b.buffers(&k, k.len());
                let (mut vc, mut vg) = b.buffers(&v, v.len());
                let (mut oc, mut og) = b.zeros(rows * heads * hd);
                let sinks_c = with_sinks.then_some(&sc);
                let sinks_g = with_sinks.then_some(&sg);
                b.cpu
                    .attention(
                        &qc, &mut kc, &mut vc, &kv_c, layer, &step_c, &shape, sinks_c, &mut ws_c,
                        &mut oc,
                    )
                    .unwrap();
                b.cuda
                    .attention(
                        &qg, &mut kg, &mut vg, &kv_g, layer, &step_g, &shape, sinks_g, &mut ws_g,
                        &mut og,
                    )
                    .unwrap();
                b.cpu
                    .kv_append(&kc, &vc, &mut kv_c, layer, &step_c)
                    .unwrap();
                b.cuda
                    .kv_append(&kg, &vg, &mut kv_g, layer, &step_g)
                    .unwrap();
                let n = rows * heads * hd;
                assert_close(
                    &format!(
                        "attention {heads}/{kv_heads}×{hd} {dtype:?} split {split:?}, step {s}, layer {layer}"
                    ),
                    &b.read_cpu(&oc, n),
                    &b.read_cuda(&og, n),
                    2e-5,
                    2e-5,
                );
            }
            // After the step, as the engine: blocks out of the window go
            // back to the pool (NO_BLOCK in the table), to be reused.
            for seq in &mut seqs {
                pool.release_out_of_window(seq, block, window);
            }
        }
        // The steps did exercise NO_BLOCK entries and reused blocks.
        assert!(
            pool.released >= 4 && pool.reused >= 4,
            "released {}, reused {}",
            pool.released,
            pool.reused
        );
    }
}

#[test]
fn kv_copy_blocks_copies_every_array_as_the_cpu() {
    let mut rng = Rng::new(23);
    for dtype in [KvCacheDtype::F32, KvCacheDtype::Bf16] {
        let Some(b) = Both::new("kv_copy_blocks", &[], WeightsPolicy::Copy) else {
            return;
        };
        let (heads, kv_heads, hd, block, window) = (4usize, 2usize, 24usize, 4usize, 6usize);
        let layout = KvLayout {
            kv_heads,
            head_dim: hd,
            block_size: block,
            blocks: 160,
            window,
            // Two arrays: layers 0 and 1 share array 0, layer 2 has array 1.
            sliding_layers: vec![false, true, false],
            dtype,
        };
        let layers = 3;
        let mut kv_c = b
            .cpu
            .kv_cache(&layout, layers, &KvScales::unit(layers))
            .unwrap();
        let mut kv_g = b
            .cuda
            .kv_cache(&layout, layers, &KvScales::unit(layers))
            .unwrap();
        let plan = StepMetadataPlan::new(16, 2, 8);
        let mut step_c = b.cpu.step_storage(&plan).unwrap();
        let mut step_g = b.cuda.step_storage(&plan).unwrap();
        let ws_plan = workspace_plan(16, 4, 8, 64, 32);
        let mut ws_c = b.cpu.workspace(&ws_plan).unwrap();
        let mut ws_g = b.cuda.workspace(&ws_plan).unwrap();
        let kv_width = kv_heads * hd;
        let shape = |layer: usize| AttentionShape {
            heads,
            kv_heads,
            head_dim: hd,
            rotary_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: (layer == 1).then_some(window),
        };

        // Sequence A: 10 tokens written by kv_append alone (its kernel, not
        // attention's fused append), every layer.
        let (full_a, mut sliding_a) = (vec![3u32, 7, 11], vec![5u32, 9, 13]);
        let mut batch = StepBatch::with_capacity(16, 2, 8);
        batch.push_seq(&[1; 10], 0, &full_a, &sliding_a, Logits::Last);
        b.cpu.load_step(&batch, &mut step_c).unwrap();
        b.cuda.load_step(&batch, &mut step_g).unwrap();
        for layer in 0..layers {
            let k = rng.floats(10 * kv_width, -2.0, 2.0);
            let v = rng.floats(10 * kv_width, -2.0, 2.0);
            let (kc, kg) = b.buffers(&k, k.len());
            let (vc, vg) = b.buffers(&v, v.len());
            b.cpu
                .kv_append(&kc, &vc, &mut kv_c, layer, &step_c)
                .unwrap();
            b.cuda
                .kv_append(&kg, &vg, &mut kv_g, layer, &step_g)
                .unwrap();
        }
        // Position 10 sees 5..=10: A's first sliding block has left the window.
        sliding_a[0] = NO_BLOCK;

        // Sequence B: A's first two full blocks shared, copies of its last
        // full block and of its sliding blocks in the window. 65 copies of
        // untouched blocks in between put the last two in a second launch.
        let (full_b, sliding_b) = (vec![3u32, 7, 20], vec![NO_BLOCK, 21, 22]);
        let mut pairs = vec![(11u32, 20u32)];
        pairs.extend((30..95).map(|i| (i, i + 65)));
        pairs.extend([(9, 21), (13, 22)]);
        for bad in [
            vec![(0u32, 160u32)],
            vec![(160, 0)],
            vec![(4, 4)],
            // A copy out of a block another copy writes, and two onto one.
            vec![(30, 31), (31, 32)],
            vec![(30, 40), (31, 40)],
        ] {
            assert!(b.cuda.kv_copy_blocks(&mut kv_g, &bad).is_err(), "{bad:?}");
        }
        let launches = launches_of(&b, "kv_copy_blocks");
        b.cpu.kv_copy_blocks(&mut kv_c, &pairs).unwrap();
        b.cuda.kv_copy_blocks(&mut kv_g, &pairs).unwrap();
        assert_eq!(launches_of(&b, "kv_copy_blocks"), launches + 2);

        // One decode row each with the same query, key and value: B sees
        // exactly what A does, on each backend, in every layer.
        batch.clear();
        batch.push_seq(&[1], 10, &full_a, &sliding_a, Logits::Last);
        batch.push_seq(&[1], 10, &full_b, &sliding_b, Logits::Last);
        b.cpu.load_step(&batch, &mut step_c).unwrap();
        b.cuda.load_step(&batch, &mut step_g).unwrap();
        let width = heads * hd;
        for layer in 0..layers {
            let twice = |row: Vec<f32>| [row.clone(), row].concat();
            let q = twice(rng.floats(width, -2.0, 2.0));
            let k = twice(rng.floats(kv_width, -2.0, 2.0));
            let v = twice(rng.floats(kv_width, -2.0, 2.0));
            let (qc, qg) = b.buffers(&q, q.len());
            let (mut kc, mut kg) = b.buffers(&k, k.len());
            let (mut vc, mut vg) = b.buffers(&v, v.len());
            let (mut oc, mut og) = b.zeros(2 * width);
            b.cpu
                .attention(
                    &qc,
                    &mut kc,
                    &mut vc,
                    &kv_c,
                    layer,
                    &step_c,
                    &shape(layer),
                    None,
                    &mut ws_c,
                    &mut oc,
                )
                .unwrap();
            b.cuda
                .attention(
                    &qg,
                    &mut kg,
                    &mut vg,
                    &kv_g,
                    layer,
                    &step_g,
                    &shape(layer),
                    None,
                    &mut ws_g,
                    &mut og,
                )
                .unwrap();
            let (cpu, cuda) = (b.read_cpu(&oc, 2 * width), b.read_cuda(&og, 2 * width));
            let what = format!("{dtype:?} layer {layer}");
            assert_eq!(cpu[..width], cpu[width..], "CPU: B differs from A, {what}");
            assert_eq!(
                cuda[..width],
                cuda[width..],
                "CUDA: B differs from A, {what}"
            );
            assert_close(&format!("copied blocks, {what}"), &cpu, &cuda, 2e-5, 2e-5);
            b.cpu
                .kv_append(&kc, &vc, &mut kv_c, layer, &step_c)
                .unwrap();
            b.cuda
                .kv_append(&kg, &vg, &mut kv_g, layer, &step_g)
                .unwrap();
        }
    }
}

/// Router kinds and activations the MoE test covers.
const ROUTERS: [RouterKind; 3] = [
    RouterKind::SoftmaxTopK { renormalize: true },
    RouterKind::SoftmaxTopK { renormalize: false },
    RouterKind::TopKSoftmax,
];

struct MoeCase {
    experts: usize,
    top_k: usize,
    rows: usize,
    h: usize,
    i: usize,
    format: Format,
    interleaved: bool,
}

#[test]
fn routed_experts_match_the_cpu() {
    let mut rng = Rng::new(18);
    let cases = [
        MoeCase {
            experts: 1,
            top_k: 1,
            rows: 1,
            h: 50,
            i: 21,
            format: Format::Bf16,
            interleaved: false,
        },
        MoeCase {
            experts: 5,
            top_k: 2,
            rows: 3,
            h: 50,
            i: 21,
            format: Format::Bf16,
            interleaved: false,
        },
        // Many experts, few rows: most experts get none.
        MoeCase {
            experts: 64,
            top_k: 4,
            rows: 3,
            h: 64,
            i: 32,
            format: Format::Nvfp4,
            interleaved: false,
        },
        MoeCase {
            experts: 33,
            top_k: 8,
            rows: 17,
            h: 64,
            i: 48,
            format: Format::Nvfp4,
            interleaved: false,
        },
        MoeCase {
            experts: 130,
            top_k: 3,
            rows: 40,
            h: 32,
            i: 16,
            format: Format::Bf16,
            interleaved: false,
        },
        // A few experts with many rows each: several tensor-core passes per
        // expert, features and columns not multiples of 16.
        MoeCase {
            experts: 4,
            top_k: 2,
            rows: 64,
            h: 40,
            i: 37,
            format: Format::Bf16,
            interleaved: false,
        },
        MoeCase {
            experts: 6,
            top_k: 3,
            rows: 9,
            h: 48,
            i: 32,
            format: Format::Nvfp4,
            interleaved: false,
        },
        // gpt_oss: interleaved gate/up with biases, MXFP4, clamped SwiGLU.
        MoeCase {
            experts: 8,
            top_k: 4,
            rows: 1,
            h: 64,
            i: 32,
            format: Format::Mxfp4,
            interleaved: true,
        },
        MoeCase {
            experts: 32,
            top_k: 4,
            rows: 21,
            h: 96,
            i: 64,
            format: Format::Mxfp4,
            interleaved: true,
        },
        MoeCase {
            experts: 5,
            top_k: 2,
            rows: 33,
            h: 64,
            i: 32,
            format: Format::Mxfp4,
            interleaved: true,
        },
    ];
    for (c, case) in cases.iter().enumerate() {
        let MoeCase {
            experts: e,
            top_k: k,
            rows,
            h,
            i,
            format,
            interleaved,
        } = *case;
        let mut weights = Vec::new();
        // Weights and inputs on a coarse grid: gate/up sums are exact in any
        // order, so the two backends differ only past the activation.
        for x in 0..e {
            if interleaved {
                weights.push(random_weight(&mut rng, format, 2 * i, h, x % 5, true));
            } else {
                weights.push(random_weight(&mut rng, format, i, h, x % 3, true));
                weights.push(random_weight(&mut rng, format, i, h, 1, true));
            }
            weights.push(random_weight(&mut rng, format, h, i, 2, true));
        }
        let mut biases = Vec::new();
        if interleaved {
            for _ in 0..e {
                biases.push(OwnedVector::bf16(&rng.floats(2 * i, -0.5, 0.5), 0));
                biases.push(OwnedVector::bf16(&rng.floats(h, -0.5, 0.5), 1));
            }
        }
        let Some(b) = Both::new("moe", &regions(&weights, &biases), WeightsPolicy::Copy) else {
            return;
        };
        let per = if interleaved { 2 } else { 3 };
        let spec = || {
            let w = |x: usize, j: usize| weights[x * per + j].view();
            ExpertsSpec {
                gate_up: if interleaved {
                    GateUp::Interleaved {
                        gate_up: (0..e).map(|x| w(x, 0)).collect(),
                        bias: (0..e).map(|x| biases[2 * x].view()).collect(),
                    }
                } else {
                    GateUp::Split {
                        gate: (0..e).map(|x| w(x, 0)).collect(),
                        up: (0..e).map(|x| w(x, 1)).collect(),
                    }
                },
                down: (0..e).map(|x| w(x, per - 1)).collect(),
                down_bias: if interleaved {
                    (0..e).map(|x| biases[2 * x + 1].view()).collect()
                } else {
                    Vec::new()
                },
                activation: if interleaved {
                    ExpertActivation::ClampedSwiglu {
                        limit: 7.0,
                        alpha: 1.702,
                    }
                } else {
                    ExpertActivation::SiluMul
                },
                hidden_size: h,
                intermediate_size: i,
            }
        };
        let experts_c = b.cpu.experts(spec()).unwrap();
        let experts_g = b.cuda.experts(spec()).unwrap();
        let plan = workspace_plan(rows + 2, k, e, h, i);
        let mut ws_c = b.cpu.workspace(&plan).unwrap();
        let mut ws_g = b.cuda.workspace(&plan).unwrap();
        let x: Vec<f32> = random_x(&mut rng, rows * h, true)
            .iter()
            .map(|v| v * 0.125)
            .collect();
        let (xc, xg) = b.buffers(&x, x.len());
        // Both kernel families at every row count (the crossover would pick
        // the GEMV for ≤ 8 rows, the tensor cores past).
        for path in [MatmulPath::WarpPerRow, MatmulPath::TensorCores] {
            b.cuda.set_matmul_path(path);
            for (r, kind) in ROUTERS.iter().enumerate() {
                // Logits on a coarse grid: ties between experts are common.
                let logits: Vec<f32> = (0..rows * e).map(|_| rng.int(-6, 6) as f32 * 0.5).collect();
                let (lc, lg) = b.buffers(&logits, logits.len());
                let (mut oc, mut og) = b.zeros(rows * h);
                b.cpu.route(&lc, rows, e, k, *kind, &mut ws_c).unwrap();
                b.cuda.route(&lg, rows, e, k, *kind, &mut ws_g).unwrap();
                b.cpu
                    .moe(&xc, rows, &experts_c, &mut ws_c, &mut oc)
                    .unwrap();
                b.cuda
                    .moe(&xg, rows, &experts_g, &mut ws_g, &mut og)
                    .unwrap();
                let (out_c, out_g) = (b.read_cpu(&oc, rows * h), b.read_cuda(&og, rows * h));
                let scale = out_c.iter().fold(0f32, |m, v| m.max(v.abs()));
                // The CPU quantizes MXFP4 experts' inputs (and NVFP4 ones on
                // x86) to 15 bits per block (exact for the gate/up input on
                // its grid, not for the down input past the activation);
                // CUDA keeps them exact (f32 in the GEMV, three BF16 terms on
                // the tensor cores).
                let quantized = matches!(format, Format::Mxfp4 | Format::Nvfp4);
                let relative = if quantized { 2e-4 } else { 2e-6 };
                assert_close(
                    &format!(
                        "moe case {c} ({e} experts, top-{k}, {rows} rows, {format:?}), \
                         router {r}, {path:?}"
                    ),
                    &out_c,
                    &out_g,
                    relative * scale.max(1.0),
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn weights_attached_in_place_read_the_same_as_a_copy() {
    let mut rng = Rng::new(19);
    let w = random_weight(&mut rng, Format::Nvfp4, 40, 64, 5, true);
    let regions = regions(std::slice::from_ref(&w), &[]);
    let Some(copy) = Both::new("weights in place", &regions, WeightsPolicy::Copy) else {
        return;
    };
    let Some(auto) = Both::new("weights in place", &regions, WeightsPolicy::Auto) else {
        return;
    };
    let x = random_x(&mut rng, 3 * 64, true);
    // The weight times three tokens on the CUDA side of `b`.
    let product = |b: &Both| {
        let wg = b.cuda.linear(w.view()).unwrap();
        let (_, xg) = b.buffers(&x, x.len());
        let (_, mut og) = b.zeros(3 * 40);
        b.cuda
            .matmul(&mut [Matmul {
                x: &xg,
                x_row: 0,
                rows: 3,
                w: &wg,
                bias: None,
                out: &mut og,
            }])
            .unwrap();
        b.read_cuda(&og, 3 * 40)
    };
    let outs = [product(&copy), product(&auto)];
    let residency = auto.cuda.ledger().snapshot().weights_residency;
    eprintln!("weights residency with Auto: {residency:?}");
    assert_eq!(
        copy.cuda.ledger().snapshot().weights_residency,
        Some(WeightsResidency::DeviceCopy)
    );
    // Which path Auto takes is the device's: the script that runs this says
    // which device kind it emulates (or the GPU is).
    if let Some(expected) = cuda_common::expected_residency() {
        assert_eq!(residency, Some(expected), "weights residency with Auto");
    }
    assert_eq!(outs[0], outs[1]);

    // The explicit policies: each reads the same, or is refused naming
    // why. Registration is refused only where the device kind says so
    // (the emulator's `mapped` kind); pageable reads need the device to
    // have them.
    let expected = cuda_common::expected_residency();
    let pageable = auto.cuda.info().pageable_memory_access;
    for (policy, residency) in [
        (WeightsPolicy::Register, WeightsResidency::HostRegistered),
        (WeightsPolicy::Map, WeightsResidency::Mapped),
    ] {
        let Some(attached) = Both::try_new("weights in place", &regions, policy) else {
            return;
        };
        let allowed = match policy {
            WeightsPolicy::Register => expected.map(|e| e != WeightsResidency::Mapped),
            _ => Some(pageable),
        };
        match attached {
            Ok(b) => {
                assert_ne!(allowed, Some(false), "{policy:?} attached where it cannot");
                assert_eq!(
                    b.cuda.ledger().snapshot().weights_residency,
                    Some(residency)
                );
                assert_eq!(product(&b), outs[0], "{policy:?}");
            }
            Err(e) => {
                assert_ne!(allowed, Some(true), "{policy:?} refused: {e}");
                assert!(
                    e.contains(&format!("--weights-policy {}", policy.name())),
                    "{e}"
                );
            }
        }
    }
}

/// The emulator's mma.sync (kernels/emu/mma.h) against a scalar A·B + C, in
/// kernels/emu/tests/mma_test.cpp (built here with driver.cpp): the
/// fragment layouts every tensor-core test above relies on. Needs g++ only.
#[test]
fn emulator_mma_follows_the_ptx_fragment_layouts() {
    if !common::tool_present("emulator mma", common::missing_command("g++")) {
        return;
    }
    let emu = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/emu");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let exe = out.join("emulator-mma-test");
    // mma.cuh includes common.cuh, which includes the host's constants.cuh.
    let include = out.join("emulator-mma-include");
    std::fs::create_dir_all(&include).unwrap();
    std::fs::write(include.join("constants.cuh"), constants::header()).unwrap();
    let build = std::process::Command::new("g++")
        .args(["-std=c++20", "-O1", "-pthread", "-fno-strict-aliasing"])
        .arg("-I")
        .arg(&include)
        .arg("-o")
        .arg(&exe)
        .arg(emu.join("tests/mma_test.cpp"))
        .arg(emu.join("driver.cpp"))
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "building the mma test: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = std::process::Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success() && stdout.trim() == "ok", "{stdout}");
}
