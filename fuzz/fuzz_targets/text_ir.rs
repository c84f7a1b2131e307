//! Text-IR parsing on arbitrary text: a model or a parse error, never a
//! panic; a model that parses prints to text that parses again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(model) = qsync_ir::text::parse_model(text) {
        let printed = qsync_ir::text::print_model(&model);
        let _ = qsync_ir::text::parse_model(&printed);
    }
});
