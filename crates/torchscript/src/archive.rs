//! The zip container of a `torch.jit` archive: every member sits under one
//! top-level folder (the archive's name when it was saved), so members are
//! looked up by their path below that folder (`data.pkl`, `data/0`,
//! `code/__torch__/…py`). Storages are stored uncompressed; code may be
//! deflated.

use std::collections::HashMap;
use std::io::{Cursor, Read};

use crate::error::{Result, TsError};

/// An opened archive: member bytes by their path below the top folder.
#[derive(Debug)]
pub struct Archive {
    pub label: String,
    members: HashMap<String, Vec<u8>>,
}

/// How many bytes the members of an archive may hold beyond the archive's
/// own size (deflated code and constants; storages are stored, so they
/// count once). A zip whose members would decompress to more is refused
/// before inflating, as a decompression bomb.
pub const INFLATE_BUDGET: u64 = 1 << 30;

impl Archive {
    /// Read every member of the zip in `bytes`; the members may hold at
    /// most `bytes.len() + INFLATE_BUDGET` bytes in all.
    pub fn open(bytes: &[u8], label: &str) -> Result<Archive> {
        Archive::open_limited(bytes, label, (bytes.len() as u64).saturating_add(INFLATE_BUDGET))
    }

    /// [`Archive::open`] with the members' total size bounded by `limit`
    /// bytes: declared sizes are checked before anything is inflated, and a
    /// member that inflates past its declared size is refused when it does.
    pub fn open_limited(bytes: &[u8], label: &str, limit: u64) -> Result<Archive> {
        let not = |why: String| TsError::NotArchive { file: label.to_string(), why };
        if bytes.len() < 4 || &bytes[..4] != b"PK\x03\x04" {
            return Err(not("no zip signature (a .pt archive is a zip file)".into()));
        }
        let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| not(format!("malformed zip: {e}")))?;
        let mut members = HashMap::new();
        let mut total: u64 = 0;
        for i in 0..zip.len() {
            let f = zip.by_index(i).map_err(|e| not(format!("malformed zip entry {i}: {e}")))?;
            if f.is_dir() {
                continue;
            }
            let name = f.name().to_string();
            let declared = f.size();
            let bomb = |read: u64| TsError::Inflate { file: label.to_string(), member: name.clone(), read, limit };
            if total.saturating_add(declared) > limit {
                return Err(bomb(total.saturating_add(declared)));
            }
            // Never preallocate from the size field, and never read more
            // than it declared (a lying field must not get past the limit).
            let cap = usize::try_from(declared).unwrap_or(0).min(bytes.len().saturating_mul(64));
            let mut data = Vec::with_capacity(cap.min(1 << 30));
            let mut f = f.take(declared.saturating_add(1));
            f.read_to_end(&mut data).map_err(|e| not(format!("cannot read zip entry `{name}`: {e}")))?;
            if data.len() as u64 > declared {
                return Err(not(format!(
                    "zip entry `{name}` inflates past its declared size of {declared} bytes (corrupt or a decompression bomb)"
                )));
            }
            total += data.len() as u64;
            let rel = match name.split_once('/') {
                Some((_, rest)) => rest.to_string(),
                None => name,
            };
            members.insert(rel, data);
        }
        if !members.contains_key("data.pkl") {
            return Err(TsError::Missing { file: label.to_string(), member: "data.pkl".into() });
        }
        Ok(Archive { label: label.to_string(), members })
    }

    pub fn get(&self, member: &str) -> Option<&[u8]> {
        self.members.get(member).map(Vec::as_slice)
    }

    /// A member that must be present.
    pub fn require(&self, member: &str) -> Result<&[u8]> {
        self.get(member).ok_or_else(|| TsError::Missing { file: self.label.clone(), member: member.to_string() })
    }

    /// Whether any member lies under `prefix` (e.g. `code/`).
    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.members.keys().any(|k| k.starts_with(prefix))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A zip whose `bomb/code.py` deflates `size` zero bytes, plus a `data.pkl`.
    fn zip_with(size: usize) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let deflate = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        w.start_file("bomb/data.pkl", deflate).expect("start");
        w.write_all(b"\x80\x02N.").expect("write");
        w.start_file("bomb/code.py", deflate).expect("start");
        let chunk = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len());
            w.write_all(&chunk[..n]).expect("write");
            left -= n;
        }
        w.finish().expect("finish").into_inner()
    }

    #[test]
    fn members_decompressing_past_the_limit_are_refused_naming_the_entry() {
        let bytes = zip_with(64 << 20);
        assert!(bytes.len() < 1 << 20, "64 MiB of zeros deflate to {} bytes", bytes.len());
        let e = Archive::open_limited(&bytes, "bomb.pt", 32 << 20).expect_err("over the limit");
        let msg = e.to_string();
        assert!(msg.contains("bomb.pt") && msg.contains("bomb/code.py") && msg.contains("33554432"), "{msg}");
        let ok = Archive::open_limited(&bytes, "bomb.pt", 65 << 20).expect("within the limit");
        assert_eq!(ok.get("code.py").map(<[u8]>::len), Some(64 << 20));
    }

    #[test]
    fn a_size_field_that_lies_cannot_pass_the_limit() {
        let mut bytes = zip_with(4 << 20);
        // Shrink the declared size of `code.py` in its central directory
        // record (signature PK\x01\x02, uncompressed size at offset 24).
        let cd = bytes.windows(4).rposition(|w| w == b"PK\x01\x02").expect("central directory");
        bytes[cd + 24..cd + 28].copy_from_slice(&1000u32.to_le_bytes());
        let e = Archive::open_limited(&bytes, "liar.pt", 1 << 20).expect_err("lying size");
        assert!(e.to_string().contains("liar.pt") && e.to_string().contains("past its declared size of 1000"), "{e}");
    }
}
