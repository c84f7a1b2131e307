//! # qsync-torchscript — the TorchScript frontend
pub mod archive;
pub mod code;
pub mod error;
pub mod pickle;
