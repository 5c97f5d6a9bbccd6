//! The INT4 (GPTQ) matmul on every instruction set: against an f64 sum of
//! the element definition (`weights::weight_at`; plus the bound of
//! quantizing the activations, where the tier does), and batch invariant —
//! each token's outputs bitwise the same alone, in any batch, and on any
//! number of threads.

use sparkrt::backend::cpu::kernels::weights::weight_at;
use sparkrt::backend::cpu::kernels::{Isa, quantizes_activations};
use sparkrt::checkpoint::linear::{LinearWeight, WeightData};

use crate::kernels_common::{Rng, bits, quantization_bound, random_x, run_on};

struct Int4 {
    rows: usize,
    cols: usize,
    group: usize,
    zero_offset: u8,
    qweight: Vec<u8>,
    qzeros: Vec<u8>,
    scales: Vec<u8>,
}

impl Int4 {
    fn random(rng: &mut Rng, rows: usize, cols: usize, group: usize, zero_offset: u8) -> Int4 {
        let words =
            |n: usize, rng: &mut Rng| -> Vec<u8> { (0..4 * n).map(|_| rng.byte()).collect() };
        let groups = cols / group;
        let qweight = words(cols / 8 * rows, rng);
        let qzeros = words(groups * rows / 8, rng);
        let scales = (0..groups * rows)
            .flat_map(|_| {
                half::f16::from_f32(rng.uniform(-0.05, 0.05))
                    .to_bits()
                    .to_le_bytes()
            })
            .collect();
        Int4 {
            rows,
            cols,
            group,
            zero_offset,
            qweight,
            qzeros,
            scales,
        }
    }

    fn view(&self) -> LinearWeight<'_> {
        LinearWeight::new(
            self.rows,
            self.cols,
            WeightData::Int4 {
                qweight: &self.qweight,
                qzeros: &self.qzeros,
                scales: &self.scales,
                group: self.group,
                zero_offset: self.zero_offset,
            },
        )
        .unwrap()
    }
}

#[test]
fn int4_matmul_matches_the_element_definition_and_is_batch_invariant() {
    let mut rng = Rng::new(28);
    // Groups of one activation block, of several, of half of one, and
    // crossing their boundaries (48); inputs that are not whole activation
    // blocks (40 columns: the portable kernel).
    for (rows, cols, group, offset) in [
        (8, 64, 32, 1),
        (48, 256, 128, 0),
        (72, 768, 32, 1),
        (16, 64, 16, 1),
        (16, 96, 48, 0),
        (8, 40, 8, 1),
    ] {
        let w = Int4::random(&mut rng, rows, cols, group, offset);
        let view = w.view();
        let tokens = 5;
        let x = random_x(&mut rng, tokens * cols, false);
        for isa in Isa::available() {
            let all = run_on(isa, &x, tokens, &view);
            for t in 0..tokens {
                let xt = &x[t * cols..(t + 1) * cols];
                let alone = run_on(isa, xt, 1, &view);
                for r in 0..rows {
                    let want: f64 = (0..cols)
                        .map(|c| f64::from(weight_at(&view, r, c)) * f64::from(xt[c]))
                        .sum();
                    let magnitude: f64 = (0..cols)
                        .map(|c| (f64::from(weight_at(&view, r, c)) * f64::from(xt[c])).abs())
                        .sum();
                    let got = f64::from(all[t * rows + r]);
                    // The x86 tiers multiply int16-quantized activations.
                    let mut tolerance = 1e-5 * magnitude.max(1e-3);
                    if quantizes_activations(isa, &view) {
                        tolerance += f64::from(quantization_bound(xt, &view, r));
                    }
                    assert!(
                        (got - want).abs() <= tolerance,
                        "{isa:?} {rows}x{cols}/{group} token {t} row {r}: {got} vs {want}"
                    );
                    assert_eq!(
                        all[t * rows + r].to_bits(),
                        alone[r].to_bits(),
                        "{isa:?} {rows}x{cols}: token {t} row {r} differs alone and in a batch"
                    );
                }
            }
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let out = pool.install(|| run_on(isa, &x, tokens, &view));
                let same = out
                    .iter()
                    .zip(&all)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?} {rows}x{cols}: {threads} threads differ");
            }
        }
    }
}

/// The AVX-512 tiers' INT4 kernel (16 rows a vector, the last 8 of an odd
/// count to the AVX2 kernel) promises the AVX2 kernel's bits: row counts
/// that leave 8-row tails and span several 256-row chunks, every token
/// count the kernel splits differently (blocks of 4, then 1 to 3), v1 and v2
/// zero points, groups of 32 and 128 and of 16 and 48 (several groups in
/// one activation block, and groups across their boundaries).
#[test]
fn avx512_int4_gives_the_avx2_bits() {
    if !Isa::Avx512.is_available() {
        eprintln!("skipped: this CPU lacks AVX-512F/VL/DQ/BW (the avx512 tier)");
        return;
    }
    let mut rng = Rng::new(2812);
    for (rows, cols, group, offset) in [
        (8, 64, 32, 1),
        (24, 128, 128, 0),
        (40, 256, 32, 1),
        (264, 256, 128, 1),
        (520, 128, 32, 0),
        (24, 64, 16, 1),
        (40, 96, 48, 0),
    ] {
        let w = Int4::random(&mut rng, rows, cols, group, offset);
        let view = w.view();
        for tokens in [1, 2, 3, 4, 5, 11] {
            let x = random_x(&mut rng, tokens * cols, false);
            assert_eq!(
                bits(&run_on(Isa::Avx512, &x, tokens, &view)),
                bits(&run_on(Isa::Avx2, &x, tokens, &view)),
                "{rows}x{cols}/{group} zero offset {offset} tokens {tokens}"
            );
        }
    }
}
