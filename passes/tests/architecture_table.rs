//! ARCHITECTURE.md's pass table is the registry's list: one row per pass of
//! `available_passes()`, in that order, each naming a file that exists and
//! names the pass. A pass added to the registry without a row, or a row left
//! for a pass that is gone, fails here.

use std::path::PathBuf;

use qsync_passes::available_passes;

struct Row {
    pass: String,
    file: String,
    cells: Vec<String>,
}

fn strip_ticks(s: &str) -> String {
    s.trim().trim_matches('`').to_string()
}

fn table_rows(doc: &str) -> Vec<Row> {
    let begin = doc.find("<!-- pass-table -->").expect("ARCHITECTURE.md has a <!-- pass-table --> marker");
    let end = doc.find("<!-- /pass-table -->").expect("ARCHITECTURE.md has a <!-- /pass-table --> marker");
    doc[begin..end]
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            let cells: Vec<String> = l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
            assert_eq!(cells.len(), 5, "a row has pass, file, reads, guarantees, requires: {l}");
            Row { pass: strip_ticks(&cells[0]), file: strip_ticks(&cells[1]), cells }
        })
        .collect()
}

#[test]
fn architecture_pass_table_matches_the_registry() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let rows = table_rows(&doc);
    let names: Vec<&str> = rows.iter().map(|r| r.pass.as_str()).collect();
    assert_eq!(names, available_passes(), "ARCHITECTURE.md's pass table against passes/src/registry.rs");
    for r in &rows {
        let text = std::fs::read_to_string(root.join(&r.file))
            .unwrap_or_else(|e| panic!("{}: file {} in ARCHITECTURE.md: {e}", r.pass, r.file));
        assert!(text.contains(&format!("\"{}\"", r.pass)), "{}: {} does not name the pass", r.pass, r.file);
        for (i, c) in r.cells.iter().enumerate().skip(2) {
            assert!(!c.is_empty(), "{}: empty cell {i}", r.pass);
        }
        // What a pass requires is other passes (or nothing, or a condition in words).
        for req in r.cells[4].split('`').skip(1).step_by(2) {
            assert!(available_passes().contains(&req), "{}: requires `{req}`, which is not a registered pass", r.pass);
        }
    }
}
