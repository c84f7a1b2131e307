//! Device names as people type them: the bundled table's names plus the
//! common short forms (`a100`, `h100`, `4090`), each resolved to one entry
//! of the table with a note saying which.

/// `(alias, device, why)`: a short form and the table entry it means.
/// Where a short form covers several models (the A100 comes with 40 and
/// 80 GB) it means the smaller one, the model sold first and the one
/// clouds list as plain "A100"; the note names the other.
const ALIASES: &[(&str, &str, &str)] = &[
    ("a100", "a100-40gb", "the A100 SXM4 40 GB; say a100-80gb for the 80 GB model"),
    ("a100-40g", "a100-40gb", "the A100 SXM4 40 GB"),
    ("a100-40", "a100-40gb", "the A100 SXM4 40 GB"),
    ("a100-80g", "a100-80gb", "the A100 SXM4 80 GB"),
    ("a100-80", "a100-80gb", "the A100 SXM4 80 GB"),
    ("h100", "h100-sxm", "the H100 SXM5 80 GB, the only H100 in the table"),
    ("h100-80gb", "h100-sxm", "the H100 SXM5 80 GB"),
    ("rtx-4090", "rtx4090", "the GeForce RTX 4090"),
    ("4090", "rtx4090", "the GeForce RTX 4090"),
    ("rtx-2080ti", "rtx2080ti", "the GeForce RTX 2080 Ti"),
    ("2080ti", "rtx2080ti", "the GeForce RTX 2080 Ti"),
    ("tesla-t4", "t4", "the Tesla T4"),
    ("tesla-v100", "v100", "the Tesla V100"),
];

/// The table name `name` stands for and, when it was a short form, a note
/// saying which device it was taken as. `known` says whether a name is in
/// the table (bundled plus `--device-file`s): a device file may define a
/// name that is also an alias here, and then it wins.
pub fn resolve(name: &str, known: impl Fn(&str) -> bool) -> (String, Option<String>) {
    let key = name.trim().to_ascii_lowercase();
    if known(&key) {
        return (key, None);
    }
    match ALIASES.iter().find(|(a, _, _)| *a == key) {
        Some((a, d, why)) if known(d) => (d.to_string(), Some(format!("device `{a}` is taken as `{d}` ({why})"))),
        _ => (key, None),
    }
}

/// Every alias and what it means, for `--help` texts and errors.
pub fn aliases() -> impl Iterator<Item = (&'static str, &'static str)> {
    ALIASES.iter().map(|(a, d, _)| (*a, *d))
}

/// A `--target` of `inspect` / `opt` / `codegen`: a device of the bundled
/// table, by name or alias (the note goes to stderr), or, where `sm_ok`,
/// an `sm_XX` architecture.
pub fn parse_target_flag(s: &str) -> Result<String, String> {
    let known = |n: &str| qsync_passes::precision::KNOWN_TARGETS.contains(&n);
    let (name, note) = resolve(s, known);
    if !known(&name) {
        return Err(format!(
            "unknown device `{s}` (known: {}; aliases: {})",
            qsync_passes::precision::KNOWN_TARGETS.join(", "),
            aliases().map(|(a, _)| a).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(n) = note {
        eprintln!("note: {n}");
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alias_names_a_bundled_device_and_no_alias_shadows_one() {
        let db = qsync_cost::DeviceDb::bundled().expect("bundled");
        for (a, d) in aliases() {
            assert!(db.get(d).is_ok(), "{a} -> {d}");
            assert!(db.get(a).is_err(), "{a} is itself a device name");
        }
        let (n, note) = resolve("A100", |n| db.get(n).is_ok());
        assert_eq!(n, "a100-40gb");
        assert!(note.is_some_and(|s| s.contains("a100-80gb")));
        assert_eq!(resolve("t4", |n| db.get(n).is_ok()), ("t4".to_string(), None));
    }
}
