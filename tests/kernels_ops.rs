//! The small ops against the scalar reference, on awkward lengths.

use crate::kernels_common;

use kernels_common::{Rng, tolerance};
use sparkrt::backend::cpu::kernels::ops::{
    add_rmsnorm, argmax, axpy, axpy_bf16, bf16_to_f32_row, dot, dot_bf16, exp, f32_to_bf16_row,
    rmsnorm, silu_mul, softmax_inplace,
};
use sparkrt::backend::cpu::kernels::reference;
use sparkrt::formats::{bf16_to_f32, f32_to_bf16};

const LENGTHS: [usize; 9] = [1, 7, 8, 9, 31, 33, 100, 128, 2051];
const EPS: f32 = f32::EPSILON;

fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
        .collect()
}

fn close(got: f32, want: f32, tol: f32, what: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got} vs {want} (tol {tol})"
    );
}

#[test]
fn dot_and_dot_bf16_match_reference() {
    let mut rng = Rng::new(10);
    for n in LENGTHS {
        let a = rng.floats(n, -2.0, 2.0);
        let b = rng.floats(n, -2.0, 2.0);
        let b16: Vec<u16> = b.iter().map(|&v| f32_to_bf16(v)).collect();
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let mag: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum();
        close(
            dot(&a, &b),
            want as f32,
            tolerance(n, mag as f32),
            &format!("dot {n}"),
        );
        let want16: f64 = a
            .iter()
            .zip(&b16)
            .map(|(&x, &y)| x as f64 * bf16_to_f32(y) as f64)
            .sum();
        close(
            dot_bf16(&a, &b16),
            want16 as f32,
            tolerance(n, mag as f32 * 1.01),
            &format!("dot_bf16 {n}"),
        );
    }
    assert_eq!(dot(&[], &[]), 0.0);
}

#[test]
fn axpy_adds_scaled_rows() {
    let mut rng = Rng::new(11);
    for n in LENGTHS {
        let x = rng.floats(n, -2.0, 2.0);
        let y0 = rng.floats(n, -2.0, 2.0);
        let alpha = -0.73;
        let mut y = y0.clone();
        axpy(alpha, &x, &mut y);
        let x16: Vec<u16> = x.iter().map(|&v| f32_to_bf16(v)).collect();
        let mut y2 = y0.clone();
        axpy_bf16(alpha, &x16, &mut y2);
        for i in 0..n {
            let want = y0[i] as f64 + alpha as f64 * x[i] as f64;
            let tol = EPS * (y0[i].abs() + (alpha * x[i]).abs());
            close(y[i], want as f32, tol, "axpy");
            let want = y0[i] as f64 + alpha as f64 * bf16_to_f32(x16[i]) as f64;
            close(y2[i], want as f32, tol * 1.01, "axpy_bf16");
        }
    }
}

#[test]
fn bf16_rows_round_trip() {
    let values = [
        0.0f32,
        -0.0,
        1.0,
        -1.5,
        3.0e38,
        -1.0e-30,
        0.1,
        65504.0,
        1.0 / 3.0,
    ];
    let mut bits = vec![0u16; values.len()];
    f32_to_bf16_row(&values, &mut bits);
    for (&v, &b) in values.iter().zip(&bits) {
        assert_eq!(b, f32_to_bf16(v));
    }
    let mut back = vec![0.0f32; values.len()];
    bf16_to_f32_row(&bits, &mut back);
    for (&v, &b) in values.iter().zip(&back) {
        // bf16 keeps 8 significant bits: relative error at most 2^-9.
        assert!((v - b).abs() <= v.abs() * 2f32.powi(-9), "{v} -> {b}");
    }
    assert_eq!(back[2], 1.0);
    assert_eq!(back[3], -1.5);
}

#[test]
fn argmax_takes_first_maximum_and_skips_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
    assert_eq!(argmax(&[-5.0, -2.0, -7.0]), 1);
    assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN, 0.5]), 3);
    assert_eq!(argmax(&[7.0]), 0);
    let mut rng = Rng::new(12);
    let v = rng.floats(32000, -10.0, 10.0);
    let want = v
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv { (i, x) } else { (bi, bv) }
        })
        .0;
    assert_eq!(argmax(&v), want);
}

#[test]
fn rmsnorm_and_add_rmsnorm_match_reference() {
    let mut rng = Rng::new(13);
    for dim in [1usize, 7, 8, 100, 128, 2048] {
        for rows in [1usize, 3] {
            let x = rng.floats(rows * dim, -3.0, 3.0);
            let w = bf16_bytes(&rng.floats(dim, -1.5, 1.5));
            // Misaligned weight bytes.
            let mut shifted = vec![0u8];
            shifted.extend(&w);
            let eps = 1e-6;
            let want = reference::rmsnorm(&x, &w, eps);
            let mut out = vec![0.0f32; rows * dim];
            rmsnorm(&x, &shifted[1..], eps, &mut out);
            let tol = |v: f32| (4.0 * (dim as f32).sqrt() + 8.0) * EPS * v.abs() + 1e-30;
            for i in 0..out.len() {
                close(out[i], want[i], tol(want[i]), &format!("rmsnorm dim {dim}"));
            }
            // Fused: residual + delta, then norm.
            let delta = rng.floats(rows * dim, -1.0, 1.0);
            let mut residual = x.clone();
            let mut out2 = vec![0.0f32; rows * dim];
            add_rmsnorm(&mut residual, &delta, &w, eps, &mut out2);
            let summed: Vec<f32> = x.iter().zip(&delta).map(|(a, b)| a + b).collect();
            assert_eq!(residual, summed);
            let want = reference::rmsnorm(&summed, &w, eps);
            for i in 0..out2.len() {
                close(
                    out2[i],
                    want[i],
                    tol(want[i]),
                    &format!("add_rmsnorm dim {dim}"),
                );
            }
        }
    }
    // All-zero input stays zero (eps keeps it finite).
    let w = bf16_bytes(&[1.0; 16]);
    let mut out = vec![1.0f32; 16];
    rmsnorm(&[0.0; 16], &w, 1e-6, &mut out);
    assert_eq!(out, vec![0.0; 16]);
}

#[test]
fn exp_is_accurate_over_its_range() {
    let mut x = -87.0f32;
    while x <= 88.0 {
        let want = (x as f64).exp();
        let got = exp(x) as f64;
        assert!(
            ((got - want) / want).abs() <= 4.0 * EPS as f64,
            "exp({x}) = {got}, want {want}"
        );
        x += 0.0371;
    }
    assert_eq!(exp(0.0), 1.0);
    // Far below the range: tiny, not zero, and never NaN; far above: finite.
    assert!(exp(-1000.0) < 1e-37);
    assert!(exp(1000.0).is_finite());
}

#[test]
fn silu_mul_matches_reference() {
    let mut rng = Rng::new(14);
    for n in LENGTHS {
        let mut gate = rng.floats(n, -20.0, 20.0);
        gate[0] = 0.0;
        let up = rng.floats(n, -3.0, 3.0);
        let want = reference::silu_mul(&gate, &up);
        let mut out = vec![0.0f32; n];
        silu_mul(&gate, &up, &mut out);
        for i in 0..n {
            close(
                out[i],
                want[i],
                8.0 * EPS * want[i].abs() + 1e-37,
                &format!("silu {}", gate[i]),
            );
        }
    }
}

#[test]
fn softmax_matches_reference() {
    let mut rng = Rng::new(15);
    for n in LENGTHS {
        let mut x = rng.floats(n, -30.0, 30.0);
        if n > 2 {
            x[1] = x[0]; // a tie
        }
        let want = reference::softmax(&x);
        softmax_inplace(&mut x);
        let tol = |v: f32| (4.0 * (n as f32).sqrt() + 8.0) * EPS * v + 1e-37;
        for i in 0..n {
            close(x[i], want[i], tol(want[i]), &format!("softmax n {n}"));
        }
        let sum: f32 = x.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5);
    }
    let mut empty: [f32; 0] = [];
    softmax_inplace(&mut empty);
}
