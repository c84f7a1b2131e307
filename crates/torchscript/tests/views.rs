//! Tensor views in archives: a parameter is a view (storage offset, sizes,
//! strides) of a storage member `data/0`. Views are read correctly where
//! they are sound — zero strides (`expand`), overlapping strides, storage
//! offsets — and refused with an error naming the storage where they are
//! not: negative strides, sizes whose product overflows or whose
//! materialisation would be far beyond the storage (a stride-0 view of one
//! element with sizes [2^20, 2^20] is 4 TiB of f32), elements past the end.
//! Nothing is allocated from a declared size.

use std::io::{Cursor, Write};

use qsync_ir::Model;
use qsync_torchscript::import_bytes;

/// Pickle a Python int: BININT for i32, LONG1 otherwise.
fn int(out: &mut Vec<u8>, v: i64) {
    if let Ok(small) = i32::try_from(v) {
        out.push(b'J');
        out.extend_from_slice(&small.to_le_bytes());
    } else {
        out.extend_from_slice(&[0x8a, 8]);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn unicode(out: &mut Vec<u8>, s: &str) {
    out.push(b'X');
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn int_tuple(out: &mut Vec<u8>, vs: &[i64]) {
    out.push(b'(');
    for &v in vs {
        int(out, v);
    }
    out.push(b't');
}

/// `data.pkl` of a module `__torch__.M` whose parameter `w` is the f32 view
/// (`offset`, `sizes`, `strides`) of storage `0` of `numel` elements.
fn data_pkl(numel: i64, offset: i64, sizes: &[i64], strides: &[i64]) -> Vec<u8> {
    let mut p = b"\x80\x02c__torch__\nM\n)\x81}(".to_vec();
    unicode(&mut p, "training");
    p.push(0x89);
    unicode(&mut p, "w");
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
    // Persistent id ('storage', FloatStorage, key, location, numel).
    p.push(b'(');
    unicode(&mut p, "storage");
    p.extend_from_slice(b"ctorch\nFloatStorage\n");
    unicode(&mut p, "0");
    unicode(&mut p, "cpu");
    int(&mut p, numel);
    p.extend_from_slice(b"tQ");
    int(&mut p, offset);
    int_tuple(&mut p, sizes);
    int_tuple(&mut p, strides);
    p.push(0x89);
    p.extend_from_slice(b"ccollections\nOrderedDict\n)RtRub.");
    p
}

const CODE: &str = "class M(Module):\n  __parameters__ = [\"w\", ]\n  __buffers__ = []\n  training : bool\n  w : Tensor\n  def forward(self: __torch__.M) -> Tensor:\n    return self.w\n";

/// An archive holding the view and storage values `0.0, 1.0, …`.
fn archive(numel: i64, offset: i64, sizes: &[i64], strides: &[i64]) -> Vec<u8> {
    let storage: Vec<u8> = (0..numel).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let pkl = data_pkl(numel, offset, sizes, strides);
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let o = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in [
        ("m/data.pkl", &pkl[..]),
        ("m/code/__torch__.py", CODE.as_bytes()),
        ("m/data/0", &storage[..]),
        ("m/version", b"3\n"),
    ] {
        z.start_file(name, o).expect("start");
        z.write_all(bytes).expect("write");
    }
    z.finish().expect("finish").into_inner()
}

fn import(bytes: &[u8]) -> Result<Model, String> {
    import_bytes(bytes, "view.pt", &[]).map(|(m, _)| m).map_err(|e| e.to_string())
}

/// The values of parameter `w`.
fn values(numel: i64, offset: i64, sizes: &[i64], strides: &[i64]) -> Vec<f32> {
    let m = import(&archive(numel, offset, sizes, strides)).unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let t = g.value(g.value_by_name("w").expect("w")).init().expect("initializer");
    assert_eq!(t.dims, sizes);
    t.inline_bytes().expect("values").chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect()
}

/// The error importing the view; it must name the file and the storage.
fn refused(numel: i64, offset: i64, sizes: &[i64], strides: &[i64]) -> String {
    let e = import(&archive(numel, offset, sizes, strides)).map(|_| ()).expect_err("view refused");
    assert!(e.contains("view.pt") && e.contains("data/0"), "the error names the file and storage: {e}");
    e
}

#[test]
fn zero_strides_repeat_and_huge_zero_stride_views_are_refused() {
    assert_eq!(values(4, 1, &[2, 3], &[0, 1]), [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    assert_eq!(values(1, 0, &[2, 2], &[0, 0]), [0.0; 4]);
    // One element seen as 2^40: 4 TiB, refused before any allocation.
    let e = refused(1, 0, &[1 << 20, 1 << 20], &[0, 0]);
    assert!(e.contains("limit"), "{e}");
    // Sizes whose product overflows u64.
    let e = refused(1, 0, &[1 << 40, 1 << 40], &[0, 0]);
    assert!(e.contains("overflow"), "{e}");
}

#[test]
fn overlapping_views_read_the_shared_elements_and_huge_ones_are_refused() {
    // Rows of 3 starting one element apart: a sliding window.
    assert_eq!(values(4, 0, &[2, 3], &[1, 1]), [0.0, 1.0, 2.0, 1.0, 2.0, 3.0]);
    // 2^21 elements seen as 2^40 overlapping ones: refused.
    let e = refused(1 << 21, 0, &[1 << 20, 1 << 20], &[1, 1]);
    assert!(e.contains("limit"), "{e}");
}

#[test]
fn storage_offsets_shift_the_view_and_are_bounded() {
    assert_eq!(values(6, 2, &[2, 2], &[2, 1]), [2.0, 3.0, 4.0, 5.0]);
    assert_eq!(values(6, 5, &[3], &[0]), [5.0; 3]);
    let e = refused(6, 5, &[2], &[1]);
    assert!(e.contains("reaches element 6"), "{e}");
    // The last element, repeated 2^40 times.
    let e = refused(6, 5, &[1 << 20, 1 << 20], &[0, 0]);
    assert!(e.contains("limit"), "{e}");
    // An offset near i64::MAX: the reach overflows, checked.
    let e = refused(6, i64::MAX - 1, &[4], &[1]);
    assert!(e.contains("overflow") || e.contains("reaches element"), "{e}");
    let e = refused(6, -1, &[2], &[1]);
    assert!(e.contains("negative storage offset"), "{e}");
}

#[test]
fn negative_strides_are_refused_naming_the_storage() {
    let e = refused(4, 3, &[4], &[-1]);
    assert!(e.contains("negative stride -1"), "{e}");
    let e = refused(4, 0, &[2, -2], &[1, 1]);
    assert!(e.contains("negative size -2"), "{e}");
}
