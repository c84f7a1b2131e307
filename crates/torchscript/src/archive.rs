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

impl Archive {
    /// Read every member of the zip in `bytes`.
    pub fn open(bytes: &[u8], label: &str) -> Result<Archive> {
        let not = |why: String| TsError::NotArchive { file: label.to_string(), why };
        if bytes.len() < 4 || &bytes[..4] != b"PK\x03\x04" {
            return Err(not("no zip signature (a .pt archive is a zip file)".into()));
        }
        let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| not(format!("malformed zip: {e}")))?;
        let mut members = HashMap::new();
        for i in 0..zip.len() {
            let mut f = zip.by_index(i).map_err(|e| not(format!("malformed zip entry {i}: {e}")))?;
            if f.is_dir() {
                continue;
            }
            let name = f.name().to_string();
            // Guard against a lying size field: never preallocate more than the file holds.
            let cap = usize::try_from(f.size()).unwrap_or(0).min(bytes.len().saturating_mul(64));
            let mut data = Vec::with_capacity(cap.min(1 << 30));
            f.read_to_end(&mut data).map_err(|e| not(format!("cannot read zip entry `{name}`: {e}")))?;
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
