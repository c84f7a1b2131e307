//! Test data shared by the kernel checks.

#![allow(clippy::excessive_precision)] // tie cases are written out in full
#![allow(dead_code)] // each test crate uses part of it

/// Every special f32: zeros, ±inf, NaNs (quiet, signalling, payloads),
/// subnormals, extremes, f16/bf16 range ends and rounding ties.
pub fn edge_f32() -> Vec<f32> {
    let mut v: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        f32::EPSILON,
        65504.0,
        65519.99,
        65520.0,
        65536.0,
        -65520.0,
        6.1035156e-5,
        5.9604645e-8,
        2.9802322e-8,
        2.98e-8,
        8.940697e-8,
        1.0009765625,
        1.00048828125,
        1.00146484375,
        3.3895314e38,
        3.3961775e38,
        127.0,
        127.5,
        -127.5,
        128.0,
        -128.5,
        254.5,
        255.5,
        0.49999997,
        2.5,
        3.5,
        -2.5,
    ];
    for b in [
        0x7f80_0001u32,
        0xff80_0001,
        0x7fbf_ffff,
        0x7fc0_0001,
        0x0000_0001,
        0x8000_0001,
        0x007f_ffff,
        0x0040_0000,
        0x3380_0000,
        0x3380_0001,
        0x337f_ffff,
        0x3880_0000,
        0x387f_ffff,
        0x3f80_1000,
        0x3f80_3000,
        0x3f80_8000,
        0x3f81_8000,
        0x477f_efff,
        0x477f_f000,
        0x7f7f_8000,
        0x7f7f_7fff,
        0x7f7f_ffff,
    ] {
        v.push(f32::from_bits(b));
    }
    v
}
