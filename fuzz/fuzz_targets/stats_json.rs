//! `qsyncc plan --stats FILE`: `qsync_planner::Calibration::from_json` on
//! arbitrary text returns statistics or an error, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = qsync_planner::Calibration::from_json(text);
    }
});
