//! `simulate --device-file FILE`: `qsync_cost::device::Device::from_json`
//! on arbitrary text returns a device or an error, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = qsync_cost::device::Device::from_json(text, "fuzz.device.json");
    }
});
