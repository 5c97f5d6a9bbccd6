//! The scalar decoders (`sparkrt::formats`) and the checkpoint's row
//! decoders against values computed by hand from the format definitions
//! (docs/FORMATS.md, OCP MX v1.0, float8_e4m3fn).

use sparkrt::checkpoint::quant::{QuantError, decode_mxfp4_row, decode_nvfp4_row};
use sparkrt::checkpoint::{LinearWeight, WeightData};
use sparkrt::formats::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};

#[test]
fn e2m1_codes() {
    let expected = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    for (code, want) in expected.into_iter().enumerate() {
        let got = e2m1_to_f32(code as u8);
        assert_eq!(got.to_bits(), f32::to_bits(want), "code {code:#x}");
    }
    // Only the low nibble counts.
    assert_eq!(e2m1_to_f32(0xF7), 6.0);
}

#[test]
fn e4m3_hand_computed_values() {
    // (byte, value): sign.eeee.mmm, bias 7; e = 0 is subnormal m/8 · 2^-6.
    let cases: [(u8, f32); 16] = [
        (0x00, 0.0),
        (0x01, 0.001953125), // 1/8 · 2^-6 = 2^-9, smallest subnormal
        (0x07, 0.013671875), // 7/8 · 2^-6, largest subnormal
        (0x08, 0.015625),    // 2^-6, smallest normal
        (0x30, 0.5),
        (0x38, 1.0),
        (0x39, 1.125),
        (0x3F, 1.875),
        (0x40, 2.0),
        (0x77, 240.0), // 1.875 · 2^7
        (0x79, 288.0), // 1.125 · 2^8
        (0x7E, 448.0), // 1.75 · 2^8, largest finite
        (0xB0, -0.5),
        (0xB8, -1.0),
        (0x81, -0.001953125),
        (0xFE, -448.0),
    ];
    for (byte, want) in cases {
        assert_eq!(e4m3_to_f32(byte), want, "byte {byte:#04x}");
    }
    assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
    assert!(e4m3_to_f32(0x7F).is_nan());
    assert!(e4m3_to_f32(0xFF).is_nan());
}

#[test]
fn e4m3_all_codes_are_ordered_and_symmetric() {
    // Positive codes 0x00..=0x7E increase strictly; each negative code is the
    // negated positive one; only 0x7F and 0xFF are NaN; nothing is infinite.
    let mut previous = -1.0f32;
    for byte in 0u8..=0x7E {
        let value = e4m3_to_f32(byte);
        assert!(value > previous, "{byte:#04x}: {value} after {previous}");
        assert_eq!(e4m3_to_f32(byte | 0x80), -value, "{byte:#04x}");
        previous = value;
    }
    let nan_codes: Vec<u8> = (0u8..=255).filter(|&b| e4m3_to_f32(b).is_nan()).collect();
    assert_eq!(nan_codes, [0x7F, 0xFF]);
    assert!((0u8..=255).all(|b| !e4m3_to_f32(b).is_infinite()));
    // Within each binade the step is 2^(e-10): 0x48 = 4.0, 0x49 = 4.5.
    assert_eq!(e4m3_to_f32(0x49) - e4m3_to_f32(0x48), 0.5);
}

#[test]
fn e8m0_scales() {
    assert_eq!(e8m0_to_f32(127), 1.0);
    assert_eq!(e8m0_to_f32(128), 2.0);
    assert_eq!(e8m0_to_f32(126), 0.5);
    assert_eq!(e8m0_to_f32(122), 0.03125);
    assert_eq!(e8m0_to_f32(1), f32::MIN_POSITIVE); // 2^-126
    assert_eq!(e8m0_to_f32(0), f32::MIN_POSITIVE / 2.0); // 2^-127, subnormal in f32
    assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
    assert!(e8m0_to_f32(255).is_nan());
}

#[test]
fn nvfp4_row_by_hand() {
    // 32 elements: two groups of 16 with scales 1.0 (0x38) and 2.0 (0x40),
    // global scale 0.5. Value = e2m1(code) · scale · 0.5.
    let mut packed = [0u8; 16];
    packed[0] = 0x21; // elements 0, 1: codes 1 (0.5), 2 (1.0)
    packed[1] = 0xF7; // elements 2, 3: codes 7 (6), 0xF (−6)
    packed[2] = 0x08; // elements 4, 5: codes 8 (−0), 0 (0)
    packed[8] = 0x3A; // elements 16, 17: codes 0xA (−1), 3 (1.5)
    packed[15] = 0xC5; // elements 30, 31: codes 5 (3), 0xC (−2)
    let scales = [0x38, 0x40];
    let mut out = [f32::NAN; 32];
    decode_nvfp4_row(&packed, &scales, 0.5, &mut out).unwrap();
    let mut expected = [0.0f32; 32];
    expected[0] = 0.25;
    expected[1] = 0.5;
    expected[2] = 3.0;
    expected[3] = -3.0;
    expected[4] = -0.0;
    expected[16] = -1.0;
    expected[17] = 1.5;
    expected[30] = 3.0;
    expected[31] = -2.0;
    assert_eq!(out, expected);
    assert_eq!(out[4].to_bits(), (-0.0f32).to_bits());
}

#[test]
fn nvfp4_rounding_happens_once_in_the_global_multiply() {
    // 1.5 · 1.125 = 1.6875 is exact; times a global of 0.1 rounds once.
    let packed = [0x03u8; 8]; // every element code 3 (1.5) or 0
    let scales = [0x39u8]; // 1.125
    let mut out = [0.0f32; 16];
    decode_nvfp4_row(&packed, &scales, 0.1, &mut out).unwrap();
    assert_eq!(out[0], 1.6875f32 * 0.1f32);
    assert_eq!(out[1], 0.0);
}

#[test]
fn mxfp4_row_by_hand() {
    // 64 elements: two blocks of 32 with E8M0 scales 127 (1.0) and 129 (4.0).
    let mut blocks = [0u8; 32];
    blocks[0] = 0x71; // elements 0, 1: 0.5, 6
    blocks[15] = 0x9E; // elements 30, 31: −4, −0.5
    blocks[16] = 0x42; // elements 32, 33: 1·4, 2·4
    blocks[31] = 0xB0; // elements 62, 63: 0, −1.5·4
    let scales = [127, 129];
    let mut out = [f32::NAN; 64];
    decode_mxfp4_row(&blocks, &scales, &mut out).unwrap();
    let mut expected = [0.0f32; 64];
    expected[0] = 0.5;
    expected[1] = 6.0;
    expected[30] = -4.0;
    expected[31] = -0.5;
    expected[32] = 4.0;
    expected[33] = 8.0;
    expected[63] = -6.0;
    assert_eq!(out, expected);

    // A NaN scale poisons its whole block, zeros included.
    let mut out = [0.0f32; 32];
    decode_mxfp4_row(&[0u8; 16], &[255], &mut out).unwrap();
    assert!(out.iter().all(|v| v.is_nan()));
}

#[test]
fn decoders_refuse_pieces_that_do_not_fit() {
    let mut out = [0.0f32; 20];
    assert_eq!(
        decode_nvfp4_row(&[0; 10], &[0; 1], 1.0, &mut out),
        Err(QuantError::Ungrouped {
            cols: 20,
            group: 16
        })
    );
    let mut out = [0.0f32; 32];
    assert!(matches!(
        decode_nvfp4_row(&[0; 15], &[0; 2], 1.0, &mut out),
        Err(QuantError::RowLength {
            expected: 16,
            found: 15,
            ..
        })
    ));
    assert!(matches!(
        decode_nvfp4_row(&[0; 16], &[0; 3], 1.0, &mut out),
        Err(QuantError::RowLength {
            expected: 2,
            found: 3,
            ..
        })
    ));
    assert!(matches!(
        decode_mxfp4_row(&[0; 16], &[0; 2], &mut out),
        Err(QuantError::RowLength {
            expected: 1,
            found: 2,
            ..
        })
    ));
    let mut out = [0.0f32; 48];
    assert_eq!(
        decode_mxfp4_row(&[0; 24], &[0; 1], &mut out),
        Err(QuantError::Ungrouped {
            cols: 48,
            group: 32
        })
    );
}

#[test]
fn linear_weight_rows_decode_each_format() {
    // A 2 × 16 NVFP4 matrix: row 1 has code 2 (1.0) everywhere, scale 4.0
    // (0x48), global 0.25 → 1.0 per element.
    let packed = [[0u8; 8], [0x22u8; 8]].concat();
    let scales = [0x38u8, 0x48];
    let w = LinearWeight::new(
        2,
        16,
        WeightData::Nvfp4 {
            packed: &packed,
            scales: &scales,
            global: 0.25,
        },
    )
    .unwrap();
    let mut row = [0.0f32; 16];
    w.decode_row(1, &mut row).unwrap();
    assert_eq!(row, [1.0; 16]);
    assert_eq!(
        w.decode_row(2, &mut row),
        Err(QuantError::RowOutOfRange { row: 2, rows: 2 })
    );

    // BF16 at an odd address: 0x3FC0 = 1.5, 0xC020 = −2.5.
    let storage = [0xEEu8, 0xC0, 0x3F, 0x20, 0xC0];
    let w = LinearWeight::new(1, 2, WeightData::Bf16(&storage[1..])).unwrap();
    let mut row = [0.0f32; 2];
    w.decode_row(0, &mut row).unwrap();
    assert_eq!(row, [1.5, -2.5]);

    // Lengths that contradict rows × cols are refused up front.
    assert!(LinearWeight::new(2, 2, WeightData::Bf16(&storage[1..])).is_err());
    assert!(
        LinearWeight::new(
            1,
            16,
            WeightData::Mxfp4 {
                blocks: &[0; 8],
                scales: &[]
            }
        )
        .is_err()
    );
    assert!(
        LinearWeight::new(usize::MAX, 2, WeightData::F32(&[])).is_err(),
        "overflowing sizes are an error, not a panic"
    );
}
