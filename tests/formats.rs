//! The case table of tests/format_cases against every CPU-side decoder:
//! `sparkrt::formats` (functions and tables), the checkpoint's row decoders,
//! the kernels' element definition and integer MXFP4 scale, and the matmul
//! kernels of every instruction set of this CPU (FP8 weight values too) (tests/cuda_kernels.rs runs
//! the same table on the CUDA kernels).

use crate::format_cases;

use format_cases::{CASE_COLS, CASES, Case, CaseWeight, Kind, same};
use sparkrt::backend::cpu::kernels::quantize::code_scale;
use sparkrt::backend::cpu::kernels::weights::weight_at;
use sparkrt::backend::cpu::kernels::{GroupedProblem, Isa, matmul_grouped_on};
use sparkrt::checkpoint::quant::{decode_mxfp4_row, decode_nvfp4_row};
use sparkrt::formats::{E2M1, E4M3, E8M0, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, fp8_value};

const KINDS: [Kind; 5] = [
    Kind::E2M1,
    Kind::E4M3,
    Kind::E8M0,
    Kind::Fp8,
    Kind::Fp8Block,
];

fn check(what: &str, case: &Case, got: f32) {
    assert!(
        same(got, case.value),
        "{what}: {:?} byte {:#04x} gave {got} ({:#010x}), expected {}",
        case.kind,
        case.byte,
        got.to_bits(),
        case.value
    );
}

#[test]
fn the_scalar_decoders_and_tables_pass_the_table() {
    for case in CASES {
        let (function, table) = match case.kind {
            Kind::E2M1 => (e2m1_to_f32(case.byte), E2M1[usize::from(case.byte)]),
            Kind::E4M3 => (e4m3_to_f32(case.byte), E4M3[usize::from(case.byte)]),
            Kind::E8M0 => (e8m0_to_f32(case.byte), E8M0[usize::from(case.byte)]),
            Kind::Fp8 | Kind::Fp8Block => (fp8_value(case.byte, 1.0), E4M3[usize::from(case.byte)]),
        };
        check("formats function", case, function);
        check("formats table", case, table);
        if case.kind == Kind::E8M0 {
            // The integer MXFP4 kernels' scale: E8M0 / 512, exactly.
            check(
                "quantize::code_scale × 512",
                case,
                code_scale(case.byte) * 512.0,
            );
        }
    }
}

#[test]
fn the_checkpoint_decoders_pass_the_table() {
    for kind in [Kind::E2M1, Kind::E4M3, Kind::E8M0] {
        let weight = CaseWeight::new(kind);
        let view = weight.view();
        let groups = CASE_COLS / if kind == Kind::E8M0 { 32 } else { 16 };
        let mut out = vec![0.0f32; CASE_COLS];
        for (r, case) in weight.cases.iter().enumerate() {
            let codes = &weight.codes[r * CASE_COLS / 2..(r + 1) * CASE_COLS / 2];
            let scales = &weight.scales[r * groups..(r + 1) * groups];
            match kind {
                Kind::E8M0 => decode_mxfp4_row(codes, scales, &mut out).unwrap(),
                _ => decode_nvfp4_row(codes, scales, 1.0, &mut out).unwrap(),
            }
            check("checkpoint row decoder", case, out[0]);
            view.decode_row(r, &mut out).unwrap();
            check("LinearWeight::decode_row", case, out[0]);
            check("kernels::weights::weight_at", case, weight_at(&view, r, 0));
        }
    }
}

#[test]
fn fp8_weight_rows_pass_the_table() {
    for kind in [Kind::Fp8, Kind::Fp8Block] {
        let weight = CaseWeight::new(kind);
        let view = weight.view();
        let mut out = vec![0.0f32; CASE_COLS];
        for (r, case) in weight.cases.iter().enumerate() {
            view.decode_row(r, &mut out).unwrap();
            check("LinearWeight::decode_row", case, out[0]);
            check("kernels::weights::weight_at", case, weight_at(&view, r, 0));
        }
    }
}

/// A power of two that keeps `value × x` (and every step of the integer
/// MXFP4 kernels) inside f32's normal range, so the product is exact.
fn input_for(case: &Case) -> f32 {
    if case.kind == Kind::E8M0 && case.byte != 0xFF {
        let exponent = (127 - i32::from(case.byte)).clamp(-60, 60);
        2f32.powi(exponent)
    } else {
        1.0
    }
}

#[test]
fn the_matmul_kernels_pass_the_table_on_every_instruction_set() {
    for isa in Isa::available() {
        for kind in KINDS {
            let weight = CaseWeight::new(kind);
            let rows = weight.rows();
            for (r, case) in weight.cases.iter().enumerate() {
                let scale = input_for(case);
                // 1 token: the GEMV paths; 8: AVX2's panel paths.
                for tokens in [1, 8] {
                    let mut x = vec![0.0f32; tokens * CASE_COLS];
                    for t in 0..tokens {
                        x[t * CASE_COLS] = scale;
                    }
                    let mut out = vec![0.0f32; tokens * rows];
                    matmul_grouped_on(
                        isa,
                        &mut [GroupedProblem {
                            x: &x,
                            tokens,
                            weight: weight.view(),
                            out: &mut out,
                        }],
                    )
                    .unwrap();
                    let want = case.value * scale;
                    for t in 0..tokens {
                        // A sum starting from +0 gives +0 for −0.
                        let got = out[t * rows + r];
                        assert!(
                            (want.is_nan() && got.is_nan()) || got == want,
                            "{isa:?} {tokens} tokens: {kind:?} byte {:#04x} × {scale} gave {got}, expected {want}",
                            case.byte
                        );
                    }
                }
            }
        }
    }
}

/// The INT4 cases through `sparkrt::formats`, the checkpoint's row decoder,
/// the kernels' element definition, and the matmul of every instruction
/// set (1 token, and 3: a pair and a single in AVX2's token blocks).
#[test]
fn the_int4_cases_pass_every_decoder_on_every_instruction_set() {
    use format_cases::{INT4_CASE_COLS, INT4_CASES, Int4CaseWeight};
    use sparkrt::formats::{f16_to_f32, int4_value, int4_zero};
    for (i, case) in INT4_CASES.iter().enumerate() {
        let what = format!("INT4 case {i} {case:?}");
        let zero = int4_zero(case.stored_zero, case.zero_offset);
        let scalar = int4_value(case.code, zero, f16_to_f32(case.scale));
        assert_eq!(
            scalar.to_bits(),
            case.value.to_bits(),
            "{what}: formats gave {scalar}"
        );
        let weight = Int4CaseWeight::new(i);
        let view = weight.view();
        let mut row = vec![0.0f32; INT4_CASE_COLS];
        view.decode_row(weight.row, &mut row).unwrap();
        assert_eq!(row[weight.col], case.value, "{what}: decode_row");
        assert_eq!(
            weight_at(&view, weight.row, weight.col),
            case.value,
            "{what}: weight_at"
        );
        for isa in Isa::available() {
            for tokens in [1, 3] {
                let mut x = vec![0.0f32; tokens * INT4_CASE_COLS];
                for t in 0..tokens {
                    x[t * INT4_CASE_COLS + weight.col] = 1.0;
                }
                let rows = Int4CaseWeight::ROWS;
                let mut out = vec![0.0f32; tokens * rows];
                matmul_grouped_on(
                    isa,
                    &mut [GroupedProblem {
                        x: &x,
                        tokens,
                        weight: view,
                        out: &mut out,
                    }],
                )
                .unwrap();
                for t in 0..tokens {
                    let got = out[t * rows + weight.row];
                    assert_eq!(got, case.value, "{what}: {isa:?} {tokens} tokens");
                }
            }
        }
    }
}
