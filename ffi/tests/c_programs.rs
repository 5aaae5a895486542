//! Builds the C programs against libcxlkv with the system C compiler and runs them: the engine
//! example (two processes sharing a prefix), the misuse suite, the metrics check and the release
//! race, each again under valgrind (zero errors, zero leaks), and checks that the library exports
//! only `cxlkv_*` symbols.
//!
//! Needs `libcxlkv.so` built first (`cargo build -p cxlkv-ffi`; scripts/test.sh does it), since
//! cargo does not build a cdylib for integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

fn target_dir() -> PathBuf {
    // .../target/<profile>/deps/c_programs-HASH → .../target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn library() -> PathBuf {
    let lib = target_dir().join("libcxlkv.so");
    assert!(
        lib.is_file(),
        "{} missing: run `cargo build -p cxlkv-ffi` before the tests (scripts/test.sh does)",
        lib.display()
    );
    lib
}

fn compile(src: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library();
    let libdir = lib.parent().unwrap();
    let out = std::env::temp_dir().join(format!("cxlkv-{name}-{}", std::process::id()));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11",
            "-D_DEFAULT_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-g",
            "-pthread",
            "-I",
        ])
        .arg(root.join("include"))
        .arg(root.join(src))
        .arg("-L")
        .arg(libdir)
        .arg("-lcxlkv")
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lm")
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run the C compiler (cc)");
    assert!(status.success(), "compiling {src} failed");
    out
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

fn valgrind(bin: &Path, what: &str) {
    valgrind_env(bin, what, &[]);
}

fn valgrind_env(bin: &Path, what: &str, env: &[(&str, PathBuf)]) {
    if Command::new("valgrind").arg("--version").output().is_err() {
        // scripts/setup.sh installs valgrind, so CI always runs this part.
        eprintln!("skipped: valgrind not installed; {what} ran without it");
        return;
    }
    let text = run(
        Command::new("valgrind")
            .args([
                "--trace-children=yes",
                // The device daemon is Rust code tested on its own; valgrind checks the C side.
                "--trace-children-skip=*cxlkv-ndpd*",
                "--error-exitcode=99",
                "--leak-check=full",
            ])
            .args([
                "--show-leak-kinds=definite,indirect,possible",
                "--errors-for-leak-kinds=definite,indirect,possible",
            ])
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .arg(bin),
        &format!("{what} under valgrind"),
    );
    let summaries: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ERROR SUMMARY"))
        .collect();
    assert!(!summaries.is_empty(), "no valgrind summary:\n{text}");
    for s in &summaries {
        assert!(s.contains("ERROR SUMMARY: 0 errors"), "{what}: {s}\n{text}");
    }
    eprintln!(
        "{what} under valgrind: {} process(es), 0 errors, 0 leaks",
        summaries.len()
    );
}

#[test]
fn engine_example_shares_a_prefix_and_runs_an_ndp_topk() {
    let bin = compile("examples/engine.c", "engine");
    let text = run(
        Command::new(&bin).env("CXLKV_NDPD", cxlkv_test_support::ndpd()),
        "engine",
    );
    assert!(text.contains("reused 12 cached chunks"), "{text}");
    assert!(text.contains("computed on the device"), "{text}");
    assert!(text.contains("equal to the host reference"), "{text}");
    assert!(text.contains("contains_batch found 4 of 5 keys"), "{text}");
    assert!(text.contains("every pinned payload inside it"), "{text}");
    assert!(
        text.contains("(5 blocks of 256 KiB) put and read back whole"),
        "{text}"
    );
    assert!(
        text.contains("put_if_absent stored 1, then found it present (0)"),
        "{text}"
    );
    assert!(
        text.contains("get_kv read back 8192 + 8192 bytes"),
        "{text}"
    );
    assert!(text.contains("4 tickets in flight at once"), "{text}");
    assert!(text.contains(", 4 on the device;"), "{text}");
    assert!(text.contains("waited for 1 more (done=1)"), "{text}");
    // The one ATTEND collected (the one left in flight at close is not counted), 3 queries of
    // dim 64: 3 × 64 × 4 bytes in, 3 × (64 + 2) × 4 bytes of partials out.
    assert!(
        text.contains(", 1 ATTEND (768 query bytes in, 792 partial bytes out),"),
        "{text}"
    );
    assert!(text.contains("engine: OK"), "{text}");
    // Under valgrind the device process itself is not traced (--trace-children-skip).
    valgrind_env(
        &bin,
        "engine",
        &[("CXLKV_NDPD", cxlkv_test_support::ndpd())],
    );
    let _ = std::fs::remove_file(bin);
}

#[test]
fn misuse_returns_documented_codes() {
    let bin = compile("tests/misuse.c", "misuse");
    let text = run(&mut Command::new(&bin), "misuse");
    assert!(text.contains(" passed, 0 failed"), "{text}");
    valgrind(&bin, "misuse");
    let _ = std::fs::remove_file(bin);
}

#[test]
fn metrics_follow_known_operations() {
    let bin = compile("tests/metrics.c", "metrics");
    let text = run(&mut Command::new(&bin), "metrics");
    assert!(text.contains(" passed, 0 failed"), "{text}");
    valgrind(&bin, "metrics");
    let _ = std::fs::remove_file(bin);
}

/// Tenants through the C ABI: isolation of reads, pins and prefix lookups, salted keys, quotas.
#[test]
fn tenants_read_only_their_own_and_keep_their_quota() {
    let bin = compile("tests/tenants.c", "tenants");
    let text = run(&mut Command::new(&bin), "tenants");
    assert!(text.contains(" passed, 0 failed"), "{text}");
    valgrind(&bin, "tenants");
    let _ = std::fs::remove_file(bin);
}

/// The mode, group and flags of `cxlkv_pool_config` reach the file the pool creates (stat),
/// defaults and an older caller's config give 0600, and bad values are refused with no file left.
#[test]
fn pool_config_sets_the_mode_of_the_file() {
    let bin = compile("tests/access.c", "access");
    let text = run(&mut Command::new(&bin), "access");
    assert!(text.contains(" passed, 0 failed"), "{text}");
    let _ = std::fs::remove_file(bin);
}

/// A handle released on one thread while another is inside a call on it: the call finishes on a
/// live object and later calls get `CXLKV_ERR_INVALID_HANDLE`, for participants, pools and
/// devices; and two threads releasing one pin or reservation at once: one succeeds. Valgrind sees
/// any read of a released object; on a library that frees at release this fails with "Invalid
/// read ... free'd" (or a segfault), under valgrind and mostly without it.
#[test]
fn a_release_racing_a_call_never_frees_under_it() {
    let bin = compile("tests/race.c", "race");
    let text = run(&mut Command::new(&bin), "race");
    assert!(text.contains("race: 0 failed"), "{text}");
    for kind in ["participant", "pool", "device", "pin", "reservation"] {
        assert!(
            text.contains(&format!("{kind}: ")),
            "{kind} not raced:\n{text}"
        );
    }
    valgrind(&bin, "race");
    let _ = std::fs::remove_file(bin);
}

#[test]
fn exports_only_cxlkv_symbols() {
    let lib = library();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("run nm");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let symbols: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert!(symbols.contains(&"cxlkv_participant_get"), "{text}");
    let foreign: Vec<&&str> = symbols
        .iter()
        .filter(|s| !s.starts_with("cxlkv_") && **s != "CXLKV_1")
        .collect();
    assert!(foreign.is_empty(), "symbols outside cxlkv_*: {foreign:?}");
}

#[test]
fn header_compiles_as_cpp_with_struct_init() {
    // The header promises C++ compatibility; CXLKV_STRUCT_INIT has a C++ branch of its own.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = std::env::temp_dir().join(format!("cxlkv-cpp-{}.cpp", std::process::id()));
    std::fs::write(
        &src,
        "#include \"cxlkv.h\"\n\
         static_assert(sizeof(cxlkv_ndp_stats) == 40, \"layout\");\n\
         int main() {\n\
             cxlkv_ndp_stats st = CXLKV_STRUCT_INIT(cxlkv_ndp_stats);\n\
             cxlkv_pool_info info = CXLKV_STRUCT_INIT(cxlkv_pool_info);\n\
             return st.struct_size == sizeof st && info.struct_size == sizeof info && st.link_bytes == 0 ? 0 : 1;\n\
         }\n",
    )
    .unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let Ok(status) = Command::new(&cxx)
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(root.join("include"))
        .arg(&src)
        .status()
    else {
        // scripts/setup.sh installs g++ with build-essential; say so if it is missing.
        eprintln!("skipped: no C++ compiler ({cxx})");
        let _ = std::fs::remove_file(&src);
        return;
    };
    let _ = std::fs::remove_file(&src);
    assert!(status.success(), "cxlkv.h does not compile as C++11");
}
