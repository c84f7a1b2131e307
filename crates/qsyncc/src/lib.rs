//! The `qsyncc` driver as a library: its subcommands' modules, so that
//! benches and tests can run them in process (the binary is `main.rs`).

pub mod codegen;
pub mod inspect;
pub mod load;
pub mod plan;
pub mod planner;
pub mod profile;
pub mod report;
pub mod simulate;
pub mod syncbench;

/// `NAME=N` for `--dim`.
pub fn parse_dim_binding(s: &str) -> Result<(String, i64), String> {
    let (name, val) = s.split_once('=').ok_or_else(|| format!("`{s}` is not NAME=N"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`{s}` has an empty dimension name"));
    }
    let v: i64 = val.trim().parse().map_err(|_| format!("`{val}` is not an integer"))?;
    if v < 1 {
        return Err(format!("dimension `{name}` must be at least 1, got {v}"));
    }
    Ok((name.to_string(), v))
}
