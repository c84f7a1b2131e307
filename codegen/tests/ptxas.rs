//! The emitted PTX through NVIDIA's own assembler, which needs no GPU: every
//! kernel for every architecture assembles to a cubin, keeps no stack frame,
//! spills nothing to local memory and stays within a register budget that
//! leaves room for full-width blocks.
//!
//! `ptxas` is taken from `$QSYNC_PTXAS`, else `PATH`, else the
//! `nvidia-cuda-nvcc-cu12` Python package `scripts/setup.sh` installs. With
//! none of them the test is skipped and says why; an architecture the found
//! `ptxas` no longer targets (CUDA 13 dropped sm_70) is skipped the same way.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use qsync_codegen::{emit_ptx, Arch};
use qsync_kernels::KernelSpec;

/// Registers per thread at most: 64 still lets 32 warps (1024 threads) be
/// resident on every targeted SM (64 K registers each).
const MAX_REGISTERS: u32 = 64;

fn find_ptxas() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("QSYNC_PTXAS") {
        return Ok(PathBuf::from(p));
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(PathBuf::from("ptxas"));
    }
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&py)
        .args(["-c", "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])"])
        .output()
        .map_err(|e| format!("no ptxas on PATH and `{py}` did not run: {e}"))?;
    if !probe.status.success() {
        return Err("no ptxas on PATH, $QSYNC_PTXAS unset, and the nvidia-cuda-nvcc-cu12 Python package is not \
                    installed (scripts/setup.sh installs it)"
            .into());
    }
    let bin = PathBuf::from(String::from_utf8_lossy(&probe.stdout).trim()).join("bin").join("ptxas");
    match bin.exists() {
        true => Ok(bin),
        false => Err(format!("{} does not exist", bin.display())),
    }
}

/// What `ptxas -v` reports for one entry function.
#[derive(Debug, Default)]
struct EntryInfo {
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
    registers: u32,
}

/// The number right before `unit` in `line` (`"24 bytes stack frame"`).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let head = &line[..line.find(unit)?];
    head.split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty())?.parse().ok()
}

/// Per-entry figures from `ptxas -v` output.
fn parse_verbose(log: &str) -> BTreeMap<String, EntryInfo> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.insert(name.clone(), EntryInfo::default());
            current = Some(name);
            continue;
        }
        let Some(info) = current.as_ref().and_then(|n| out.get_mut(n)) else { continue };
        if line.contains("stack frame") {
            info.stack = number_before(line, "bytes stack frame").unwrap_or(u32::MAX);
            info.spill_stores = number_before(line, "bytes spill stores").unwrap_or(u32::MAX);
            info.spill_loads = number_before(line, "bytes spill loads").unwrap_or(u32::MAX);
        }
        if line.contains("registers") {
            info.registers = number_before(line, "registers").unwrap_or(u32::MAX);
        }
    }
    out
}

#[test]
fn every_kernel_assembles_without_spills_on_every_arch() {
    let ptxas = match find_ptxas() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipping PTX assembly: {why}");
            return;
        }
    };
    let version = Command::new(&ptxas).arg("--version").output().expect("ptxas --version");
    let version = String::from_utf8_lossy(&version.stdout);
    eprintln!("{}", version.lines().find(|l| l.contains("release")).unwrap_or_default());
    let all = KernelSpec::all();
    let dir = std::env::temp_dir().join(format!("qsync-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut assembled = 0;
    for arch in Arch::ALL {
        let ptx = emit_ptx(&all, arch).expect("PTX");
        let (src, cubin) = (dir.join(format!("{arch}.ptx")), dir.join(format!("{arch}.cubin")));
        std::fs::write(&src, &ptx).expect("write PTX");
        let out = Command::new(&ptxas)
            .arg(format!("-arch={}", arch.name()))
            .arg("-v")
            .arg(&src)
            .arg("-o")
            .arg(&cubin)
            .output()
            .expect("run ptxas");
        let log = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && (log.contains("not defined for option") || log.contains("Unsupported .target")) {
            eprintln!("skipping {arch}: this ptxas does not target it ({})", log.lines().next().unwrap_or_default());
            continue;
        }
        assert!(out.status.success(), "{arch}: ptxas failed:\n{log}");
        assert!(std::fs::metadata(&cubin).is_ok_and(|m| m.len() > 0), "{arch}: empty cubin");
        let entries = parse_verbose(&log);
        let mut want: Vec<String> = all.iter().map(|k| k.name()).collect();
        want.sort();
        let got: Vec<String> = entries.keys().cloned().collect();
        assert_eq!(got, want, "{arch}: ptxas compiled other entries than the kernels");
        for (name, e) in &entries {
            assert_eq!((e.stack, e.spill_stores, e.spill_loads), (0, 0, 0), "{arch} {name}: {e:?}\n{log}");
            assert!(e.registers > 0 && e.registers <= MAX_REGISTERS, "{arch} {name}: {e:?}");
        }
        let most = entries.iter().max_by_key(|(_, e)| e.registers).expect("entries");
        eprintln!("{arch}: {} entries, no spills, at most {} registers ({})", entries.len(), most.1.registers, most.0);
        assembled += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(assembled >= Arch::ALL.len() - 1, "only {assembled} architectures assembled");
}

#[test]
fn verbose_output_parses() {
    let log = "ptxas info    : 0 bytes gmem\n\
               ptxas info    : Compiling entry function 'qsync_cast_f32_to_f16' for 'sm_90'\n\
               ptxas info    : Function properties for qsync_cast_f32_to_f16\n\
               \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
               ptxas info    : Used 32 registers, used 0 barriers\n";
    let e = &parse_verbose(log)["qsync_cast_f32_to_f16"];
    assert_eq!((e.stack, e.spill_stores, e.spill_loads, e.registers), (8, 4, 12, 32));
}
