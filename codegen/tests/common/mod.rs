//! Running emitted MLIR on the CPU, shared by the execution tests: the module
//! gets a `main` that calls its function with constant arguments and prints
//! each result's bits with MLIR's runner utilities (`printMemrefI32` of the
//! f32 values bitcast, so that nothing is lost to decimal printing); it is
//! bufferized and lowered to LLVM by `mlir-opt-22`, translated by
//! `mlir-translate-22` and run by `lli-22`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// A transform-dialect library for `mlir-opt-22`: `linalg.softmax` has no
/// loop lowering of its own, so its decomposition (max, `exp` of the
/// difference, sum, division as `linalg.generic`s) replaces it first.
const DECOMPOSE: &str = r#"module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %softmax = transform.structured.match ops{["linalg.softmax"]} in %root : (!transform.any_op) -> !transform.any_op
    %parts = transform.structured.decompose_interface %softmax : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
"#;

/// The `mlir-opt-22 --pass-pipeline` given the [`DECOMPOSE`] library's path:
/// softmax decomposed, tosa ops to linalg/arith/tensor (per function), then
/// bufferization and the lowering of everything to LLVM; math ops without
/// an LLVM intrinsic (`math.erf`) become libm calls.
fn pipeline(library: &std::path::Path) -> String {
    [
        &format!("transform-preload-library{{transform-library-paths={}}}", library.display()),
        "transform-interpreter",
        "func.func(tosa-to-linalg-named,tosa-to-linalg,tosa-to-arith,tosa-to-tensor)",
        "convert-elementwise-to-linalg",
        "one-shot-bufferize{bufferize-function-boundaries}",
        "convert-linalg-to-loops",
        "convert-scf-to-cf",
        "expand-strided-metadata",
        "lower-affine",
        "finalize-memref-to-llvm",
        "convert-math-to-llvm",
        "convert-math-to-libm",
        "convert-arith-to-llvm",
        "convert-cf-to-llvm",
        "convert-func-to-llvm",
        "convert-index-to-llvm",
        "reconcile-unrealized-casts",
    ]
    .join(",")
}

fn runner_libs() -> Option<Vec<PathBuf>> {
    let dir = PathBuf::from(std::env::var("QSYNC_MLIR_LIBDIR").unwrap_or_else(|_| "/usr/lib/llvm-22/lib".into()));
    let libs = vec![dir.join("libmlir_c_runner_utils.so"), dir.join("libmlir_runner_utils.so")];
    libs.iter().all(|l| l.exists()).then_some(libs)
}

/// Whether the tools and the runner libraries are there; prints why not.
pub fn tools_present() -> bool {
    for t in ["mlir-opt-22", "mlir-translate-22", "lli-22"] {
        if Command::new(t).arg("--version").output().is_err() {
            eprintln!("skipping MLIR execution: `{t}` is not installed");
            return false;
        }
    }
    if runner_libs().is_none() {
        eprintln!("skipping MLIR execution: MLIR runner utility libraries not found (set QSYNC_MLIR_LIBDIR)");
        return false;
    }
    true
}

/// `tensor<2x3xf32>` for a graph result with a static shape and f32 values.
pub fn f32_result_type(g: &qsync_ir::Graph, v: qsync_ir::ValueId) -> String {
    let dims: Vec<String> = g.ty(v).concrete_shape().expect("static result").iter().map(i64::to_string).collect();
    format!("tensor<{}f32>", dims.iter().map(|d| format!("{d}x")).collect::<String>())
}

/// Appends to `module` a `main` that calls `@func` once per argument list
/// (`(type, literal)` pairs materialized by `arith.constant`), in order, and
/// prints every result (each of type `rtys`, f32 elements); runs it and
/// returns each call's results, exactly. Panics when a tool fails.
pub fn run_module(
    tag: &str,
    module: &str,
    func: &str,
    rtys: &[String],
    calls: &[Vec<(&str, &str)>],
) -> Vec<Vec<Vec<f64>>> {
    let mut main = String::from("  func.func private @printMemrefI32(memref<*xi32>)\n  func.func @main() {\n");
    for (c, args) in calls.iter().enumerate() {
        let mut names = Vec::new();
        for (i, (ty, lit)) in args.iter().enumerate() {
            main.push_str(&format!("    %in{c}_{i} = arith.constant {lit} : {ty}\n"));
            names.push(format!("%in{c}_{i}"));
        }
        let tys: Vec<&str> = args.iter().map(|(t, _)| *t).collect();
        main.push_str(&format!(
            "    %r{c}:{} = func.call @{func}({}) : ({}) -> ({})\n",
            rtys.len(),
            names.join(", "),
            tys.join(", "),
            rtys.join(", ")
        ));
        for (k, rt) in rtys.iter().enumerate() {
            let it = rt.replace("xf32>", "xi32>").replace("<f32>", "<i32>");
            let mr = it.replace("tensor<", "memref<");
            main.push_str(&format!("    %b{c}_{k} = arith.bitcast %r{c}#{k} : {rt} to {it}\n"));
            main.push_str(&format!("    %m{c}_{k} = bufferization.to_buffer %b{c}_{k} : {it} to {mr}\n"));
            main.push_str(&format!("    %u{c}_{k} = memref.cast %m{c}_{k} : {mr} to memref<*xi32>\n"));
            main.push_str(&format!("    func.call @printMemrefI32(%u{c}_{k}) : (memref<*xi32>) -> ()\n"));
        }
    }
    main.push_str("    func.return\n  }\n}\n");
    let full = format!("{}\n{main}", module.trim_end().trim_end_matches('}'));
    let dir = std::env::temp_dir().join(format!("qsync-exec-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (src, lowered, ll) = (dir.join("in.mlir"), dir.join("llvm.mlir"), dir.join("out.ll"));
    std::fs::write(&src, &full).expect("write");
    let library = dir.join("decompose.mlir");
    std::fs::write(&library, DECOMPOSE).expect("write");
    // A failure shows the module when it is small, else where it was kept.
    let shown = if full.len() <= 100_000 { full.clone() } else { format!("(module kept in {})", src.display()) };
    let mut times = Vec::new();
    let mut run = |cmd: &mut Command, what: &str| {
        let start = Instant::now();
        let out = cmd.output().expect(what);
        times.push(format!("{what} {:.1} s", start.elapsed().as_secs_f64()));
        assert!(out.status.success(), "{tag}: {what} failed:\n{}\n{shown}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(
        Command::new("mlir-opt-22")
            .arg(&src)
            .arg(format!("--pass-pipeline=builtin.module({})", pipeline(&library)))
            .arg("-o")
            .arg(&lowered),
        "mlir-opt-22",
    );
    run(
        Command::new("mlir-translate-22").arg("--mlir-to-llvmir").arg(&lowered).arg("-o").arg(&ll),
        "mlir-translate-22",
    );
    let mut lli = Command::new("lli-22");
    for lib in runner_libs().expect("runner libraries") {
        lli.arg(format!("--dlopen={}", lib.display()));
    }
    let printed = run(lli.arg(&ll), "lli-22");
    eprintln!("{tag}: {}", times.join(", "));
    let _ = std::fs::remove_dir_all(&dir);
    let results: Vec<Vec<f64>> = printed
        .split("Unranked Memref")
        .skip(1)
        .map(|chunk| {
            let data = chunk.split_once("data =").map_or("", |(_, d)| d);
            data.split(|c: char| !(c.is_ascii_digit() || c == '-'))
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let bits = s.parse::<i32>().unwrap_or_else(|e| panic!("{tag}: `{s}`: {e}"));
                    f64::from(f32::from_bits(bits.cast_unsigned()))
                })
                .collect()
        })
        .collect();
    assert_eq!(results.len(), rtys.len() * calls.len(), "{tag}: printed\n{printed}");
    results.chunks(rtys.len().max(1)).map(<[Vec<f64>]>::to_vec).collect()
}
