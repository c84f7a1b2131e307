//! TorchScript archive import on arbitrary bytes: the zip reader, the
//! pickle reader, the code parser and the lowering must return a model or
//! an error, never panic, recurse without bound or loop forever.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = qsync_torchscript::import_bytes(data, "fuzz.pt", &[]);
});
