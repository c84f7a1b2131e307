//! `--cluster FILE` (plan and simulate): `qsync_sim::topology::ClusterFile::parse`
//! on arbitrary text returns a checked cluster or an error, never panics;
//! an accepted cluster answers its questions (node count, fabric, links).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(c) = qsync_sim::topology::ClusterFile::parse(text) {
            if let Some(f) = &c.fabric {
                let _ = f.fabric();
            }
            let _ = c.unsourced();
            for g in &c.groups {
                let _ = g.count();
                let _ = g.network(25.0);
            }
        }
    }
});
