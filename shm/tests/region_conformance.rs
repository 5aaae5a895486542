//! Region conformance: one set of checks, run against every backend.
//!
//! Anonymous, shm, file and fake DAX run everywhere; `numa:0` runs wherever Linux exposes NUMA
//! nodes. Device DAX, a second NUMA node and explicit huge pages run only where present; an absent
//! one is skipped with a printed `skipped: ...` line, never silently. Device DAX is also opt-in
//! (`CXLKV_TEST_DAX=/dev/daxX.Y`), because the checks overwrite the device.
//!
//! Every name is unique to this process (it includes the pid) and every file is removed at the
//! end, also when a check fails.

use cxlkv_shm::mem::MemError;
use cxlkv_shm::region::{RegionError, DAX_ALIGN};
use cxlkv_shm::topo::Topology;
use cxlkv_shm::{Backend, HugePages, Region, RegionOptions, SharedMemory};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// What a backend promises beyond the basic checks.
#[derive(Clone, Debug)]
struct Case {
    backend: Backend,
    size: u64,
    opts: RegionOptions,
    /// Memory is zero right after `create`.
    zeroed: bool,
    /// A second mapping (`Region::open`) sees the first one's writes, and a reopen after all
    /// mappings are gone sees them too.
    shared: bool,
    /// Offsets and lengths must be multiples of this (DAX, fake DAX).
    align: Option<u64>,
    /// `create` must refuse an existing backing file.
    creates_file: bool,
}

impl Case {
    fn new(backend: Backend, size: u64) -> Case {
        let file = !matches!(backend, Backend::Anonymous);
        Case {
            backend,
            size,
            opts: RegionOptions::default(),
            zeroed: true,
            shared: file,
            align: None,
            creates_file: file,
        }
    }
}

/// Removes a backend's file on drop, so that a failing check leaves nothing behind.
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file()) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

fn unique(tag: &str) -> String {
    format!("cxlkv-conformance-{}-{tag}", std::process::id())
}

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}.pool", unique(tag)))
}

fn skip(what: &str, why: &str) {
    eprintln!("skipped: {what}: {why}");
}

/// Odd size, so that the last bytes are not at a page boundary (but 8-byte aligned for atomics).
const ODD_SIZE: u64 = (1 << 20) + 3 * 4096 + 24;

fn run(case: &Case) {
    let b = &case.backend;
    let cleanup = Cleanup(b.path().filter(|_| case.creates_file));
    let r = Region::create(b, case.size, &case.opts).unwrap_or_else(|e| panic!("create {b}: {e}"));
    assert_eq!(r.size(), case.size, "{b}: size");
    assert_eq!(r.backend(), b);
    assert_eq!(r.offset(), 0);

    if case.zeroed {
        let mut buf = vec![0xAAu8; 4096];
        r.read(0, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&x| x == 0),
            "{b}: fresh memory is not zero at 0"
        );
        r.read(case.size - 4096, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&x| x == 0),
            "{b}: fresh memory is not zero at the end"
        );
    }

    round_trips(&r);
    bounds_are_checked(&r);
    atomics(&r);
    concurrent_cas(&r);

    if case.creates_file {
        let again = Region::create(b, case.size, &case.opts);
        assert!(
            matches!(again, Err(RegionError::Os { .. })),
            "{b}: create over an existing backing must fail, got {again:?}"
        );
    }
    match case.align {
        Some(align) => dax_alignment(case, &r, align),
        None if case.shared => page_windows(case, &r),
        None => {}
    }
    if case.shared {
        two_mappings_share(case, &r);
        drop(r);
        let r = Region::open(b, &case.opts).unwrap_or_else(|e| panic!("reopen {b}: {e}"));
        assert_eq!(r.size(), case.size, "{b}: reopened size");
        let mut last = [0u8; 8];
        r.read(case.size - 8, &mut last).unwrap();
        assert_eq!(last, *b"last8byt", "{b}: reopen lost the data");
        assert_eq!(
            r.load_u64(0, Ordering::Acquire).unwrap(),
            0x5eed,
            "{b}: reopen lost atomics"
        );
        if case.creates_file {
            Region::unlink(b).unwrap_or_else(|e| panic!("unlink {b}: {e}"));
            assert!(!b.path().unwrap().exists(), "{b}: unlink left the file");
            // The mapping outlives its name.
            r.write(0, b"after unlink").unwrap();
            let mut buf = [0u8; 12];
            r.read(0, &mut buf).unwrap();
            assert_eq!(&buf, b"after unlink");
            assert!(
                Region::open(b, &case.opts).is_err(),
                "{b}: opened after unlink"
            );
            assert!(
                Region::unlink(b).is_err(),
                "{b}: second unlink must report the missing file"
            );
        }
    } else {
        assert!(
            Region::open(b, &case.opts).is_err(),
            "{b}: anonymous memory reopened"
        );
        assert!(
            Region::unlink(b).is_ok(),
            "{b}: unlink of anonymous memory is a no-op"
        );
    }
    drop(cleanup);
}

fn round_trips(r: &Region) {
    let b = r.backend();
    let size = r.size();
    let page = 4096;
    let cases: [(u64, &[u8]); 5] = [
        (0, b"first"),
        (page - 3, b"straddles a page"),
        (size / 2, b"middle"),
        (size - 1, b"z"),
        (size - 8, b"last8byt"),
    ];
    for (off, data) in cases {
        r.write(off, data)
            .unwrap_or_else(|e| panic!("{b}: write at {off}: {e}"));
        let mut back = vec![0u8; data.len()];
        r.read(off, &mut back)
            .unwrap_or_else(|e| panic!("{b}: read at {off}: {e}"));
        assert_eq!(back, data, "{b}: round trip at {off}");
    }
    // A whole-region copy, and fill at both edges.
    let mut all = vec![0u8; size as usize];
    r.read(0, &mut all).unwrap();
    assert_eq!(&all[(size - 8) as usize..], b"last8byt");
    r.fill(8, 16, 0x7f).unwrap();
    let mut buf = [0u8; 16];
    r.read(8, &mut buf).unwrap();
    assert_eq!(buf, [0x7f; 16], "{b}: fill");
    r.fill(size - 16, 8, 0x11).unwrap();
    r.read(size - 16, &mut buf).unwrap();
    assert_eq!(
        &buf, b"\x11\x11\x11\x11\x11\x11\x11\x11last8byt",
        "{b}: fill at the end"
    );
    // Zero-length accesses at the very end are in bounds.
    r.read(size, &mut []).unwrap();
    r.write(size, &[]).unwrap();
    assert!(r.raw_range(0, size).unwrap().is_some());
}

fn bounds_are_checked(r: &Region) {
    let b = r.backend();
    let size = r.size();
    let oob = |res: Result<(), MemError>, what: &str| {
        assert!(
            matches!(res, Err(MemError::OutOfBounds { .. })),
            "{b}: {what} must be out of bounds: {res:?}"
        );
    };
    let mut two = [0u8; 2];
    oob(r.read(size, &mut two[..1]), "read at the end");
    oob(r.read(size - 1, &mut two), "read across the end");
    oob(r.read(u64::MAX, &mut two), "read at u64::MAX");
    oob(r.write(size, b"x"), "write at the end");
    oob(r.write(size - 1, b"xy"), "write across the end");
    oob(r.write(u64::MAX - 1, b"xyz"), "write wrapping around");
    oob(r.fill(size - 4, 5, 0), "fill across the end");
    oob(r.fill(1, u64::MAX, 0), "fill of u64::MAX bytes");
    oob(
        r.load_u64(size, Ordering::Relaxed).map(drop),
        "load at the end",
    );
    oob(
        r.store_u64(u64::MAX - 7, 1, Ordering::Relaxed),
        "store at u64::MAX - 7",
    );
    oob(
        r.compare_exchange_u64(size, 0, 1).map(drop),
        "CAS at the end",
    );
    oob(r.raw_range(size, 1).map(drop), "raw range at the end");
    let mis = |res: Result<(), MemError>, what: &str| {
        assert!(
            matches!(res, Err(MemError::Misaligned { align: 8, .. })),
            "{b}: {what} must be misaligned: {res:?}"
        );
    };
    mis(r.load_u64(4, Ordering::Relaxed).map(drop), "load at 4");
    mis(r.store_u64(1, 1, Ordering::Relaxed), "store at 1");
    mis(
        r.compare_exchange_u64(size - 12, 0, 1).map(drop),
        "CAS at size - 12",
    );
    // The memory at the edges is untouched by the refused accesses.
    let mut last = [0u8; 8];
    r.read(size - 8, &mut last).unwrap();
    assert_eq!(&last, b"last8byt", "{b}: a refused access wrote");
}

fn atomics(r: &Region) {
    let b = r.backend();
    let end = r.size() - 16;
    r.store_u64(end, 41, Ordering::Release).unwrap();
    assert_eq!(
        r.load_u64(end, Ordering::Acquire).unwrap(),
        41,
        "{b}: load after store"
    );
    assert_eq!(
        r.compare_exchange_u64(end, 41, 42).unwrap(),
        Ok(41),
        "{b}: CAS success"
    );
    assert_eq!(
        r.compare_exchange_u64(end, 41, 43).unwrap(),
        Err(42),
        "{b}: CAS failure"
    );
    assert_eq!(r.load_u64(end, Ordering::Acquire).unwrap(), 42);
    r.store_u64(0, 0x5eed, Ordering::Release).unwrap();
    let mut raw = [0u8; 8];
    r.read(0, &mut raw).unwrap();
    assert_eq!(
        u64::from_ne_bytes(raw),
        0x5eed,
        "{b}: atomic store seen by a copy"
    );
    r.publish(0, 8);
    r.acquire(0, 8);
}

/// Four threads increment one word with CAS loops: the region is Send + Sync and CAS is atomic.
fn concurrent_cas(r: &Region) {
    const THREADS: u64 = 4;
    const EACH: u64 = 2000;
    let at = 64;
    r.store_u64(at, 0, Ordering::Relaxed).unwrap();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..EACH {
                    let mut cur = r.load_u64(at, Ordering::Relaxed).unwrap();
                    while let Err(actual) = r.compare_exchange_u64(at, cur, cur + 1).unwrap() {
                        cur = actual;
                    }
                }
            });
        }
    });
    assert_eq!(
        r.load_u64(at, Ordering::Acquire).unwrap(),
        THREADS * EACH,
        "{}: lost CAS",
        r.backend()
    );
}

fn two_mappings_share(case: &Case, a: &Region) {
    let b = &case.backend;
    let other =
        Region::open(b, &case.opts).unwrap_or_else(|e| panic!("second mapping of {b}: {e}"));
    assert_eq!(other.size(), a.size(), "{b}: second mapping size");
    a.write(128, b"from a").unwrap();
    a.publish(128, 6);
    other.acquire(128, 6);
    let mut buf = [0u8; 6];
    other.read(128, &mut buf).unwrap();
    assert_eq!(
        &buf, b"from a",
        "{b}: second mapping does not see the first's write"
    );
    other.store_u64(256, 7, Ordering::Release).unwrap();
    assert_eq!(
        a.load_u64(256, Ordering::Acquire).unwrap(),
        7,
        "{b}: atomics not shared"
    );
    assert_eq!(a.compare_exchange_u64(256, 7, 8).unwrap(), Ok(7));
    assert_eq!(
        other.compare_exchange_u64(256, 7, 9).unwrap(),
        Err(8),
        "{b}: CAS not shared"
    );
}

/// Windows of file-backed memory need page-aligned offsets and must lie inside the file.
fn page_windows(case: &Case, r: &Region) {
    let b = &case.backend;
    match Region::open_range(b, 100, 4096, &case.opts) {
        Err(RegionError::Misaligned { value: 100, .. }) => {}
        other => panic!("{b}: an offset of 100 must be refused as misaligned, got {other:?}"),
    }
    match Region::open_range(b, 4096, case.size, &case.opts) {
        Err(RegionError::OutOfRange { offset: 4096, .. }) => {}
        other => panic!("{b}: a window past the end must be out of range, got {other:?}"),
    }
    r.write(2 * 4096 + 8, b"window").unwrap();
    let w = Region::open_range(b, 2 * 4096, 4096, &case.opts)
        .unwrap_or_else(|e| panic!("{b}: window: {e}"));
    assert_eq!((w.offset(), w.size()), (2 * 4096, 4096));
    let mut buf = [0u8; 6];
    w.read(8, &mut buf).unwrap();
    assert_eq!(&buf, b"window", "{b}: window does not alias the region");
    assert!(
        w.read(4096, &mut buf[..1]).is_err(),
        "{b}: window reads past its end"
    );
}

fn dax_alignment(case: &Case, r: &Region, align: u64) {
    let b = &case.backend;
    let misaligned = |res: Result<Region, RegionError>, what: &str| match res {
        Err(RegionError::Misaligned { align: a, .. }) => assert_eq!(a, align, "{b}: {what}"),
        other => panic!("{b}: {what} must be refused as misaligned, got {other:?}"),
    };
    misaligned(
        Region::open_range(b, 4096, align, &case.opts),
        "an offset of 4 KiB",
    );
    misaligned(
        Region::open_range(b, 0, align + 4096, &case.opts),
        "a length of 2 MiB + 4 KiB",
    );
    match Region::open_range(b, case.size, align, &case.opts) {
        Err(RegionError::OutOfRange { offset, size, .. }) => {
            assert_eq!((offset, size), (case.size, case.size), "{b}")
        }
        other => panic!("{b}: a window past the end must be out of range, got {other:?}"),
    }
    // A window at an aligned offset maps the same bytes.
    r.write(align, b"second 2 MiB").unwrap();
    let w = Region::open_range(b, align, align, &case.opts)
        .unwrap_or_else(|e| panic!("{b}: window: {e}"));
    assert_eq!((w.offset(), w.size()), (align, align));
    let mut buf = [0u8; 12];
    w.read(0, &mut buf).unwrap();
    assert_eq!(
        &buf, b"second 2 MiB",
        "{b}: window does not alias the region"
    );
    if case.creates_file {
        // Fake DAX: the size of a new file must be aligned too.
        let other = Backend::Dax(temp_path("dax-misaligned"));
        let _cleanup = Cleanup(other.path());
        misaligned(
            Region::create(&other, align + 4096, &case.opts),
            "a size of 2 MiB + 4 KiB",
        );
        assert!(
            !other.path().unwrap().exists(),
            "{b}: a refused create left a file"
        );
    }
}

#[test]
fn anonymous() {
    run(&Case::new(Backend::Anonymous, ODD_SIZE));
}

#[test]
fn anonymous_prefaulted_transparent_huge_pages() {
    let mut c = Case::new(Backend::Anonymous, 4 << 20);
    c.opts = RegionOptions {
        prefault: true,
        huge_pages: HugePages::Transparent,
    };
    run(&c);
}

#[test]
fn shm() {
    run(&Case::new(Backend::Shm(unique("shm")), ODD_SIZE));
}

#[test]
fn shm_prefaulted_transparent_huge_pages() {
    let mut c = Case::new(Backend::Shm(unique("shm-thp")), 4 << 20);
    c.opts = RegionOptions {
        prefault: true,
        huge_pages: HugePages::Transparent,
    };
    run(&c);
}

#[test]
fn file() {
    let mut c = Case::new(Backend::File(temp_path("file")), ODD_SIZE);
    c.opts.prefault = true;
    run(&c);
}

#[test]
fn fake_dax() {
    let mut c = Case::new(Backend::Dax(temp_path("fakedax")), 2 * DAX_ALIGN);
    c.align = Some(DAX_ALIGN);
    run(&c);
}

#[test]
fn fake_dax_spec_parses_to_dax() {
    let p = temp_path("spec");
    let spec = format!("fakedax:{}", p.display());
    assert_eq!(spec.parse::<Backend>().unwrap(), Backend::Dax(p));
}

#[test]
fn missing_dax_device_is_unavailable() {
    let b = Backend::Dax(format!("/dev/dax{}.99", std::process::id()).into());
    let e = Region::create(&b, DAX_ALIGN, &RegionOptions::default()).unwrap_err();
    assert!(matches!(e, RegionError::Unavailable { .. }), "{e}");
    assert!(
        !b.path().unwrap().exists(),
        "a fake DAX file was created under /dev"
    );
}

/// Device-DAX devices listed in sysfs.
fn dax_devices() -> Vec<PathBuf> {
    Topology::from_sysfs(Path::new("/sys"))
        .map(|t| t.dax_devices.into_iter().map(|d| d.path).collect())
        .unwrap_or_default()
}

#[test]
fn device_dax() {
    let found = dax_devices();
    let Some(dev) = std::env::var_os("CXLKV_TEST_DAX").map(PathBuf::from) else {
        let why = if found.is_empty() {
            "no device-DAX device in /sys/bus/dax/devices".to_string()
        } else {
            format!("found {found:?}, but CXLKV_TEST_DAX=/dev/daxX.Y is not set (the checks overwrite the device)")
        };
        return skip("device DAX", &why);
    };
    let b = Backend::Dax(dev.clone());
    let whole =
        Region::open(&b, &RegionOptions::default()).unwrap_or_else(|e| panic!("open {b}: {e}"));
    let size = (whole.size() / DAX_ALIGN).min(4) * DAX_ALIGN;
    drop(whole);
    let mut c = Case::new(b, size);
    (c.zeroed, c.creates_file, c.align) = (false, false, Some(DAX_ALIGN));
    run(&c);
    // create never removes a device, and unlink leaves it alone.
    Region::unlink(&c.backend).unwrap();
    assert!(dev.exists(), "unlink removed the device node");
}

#[test]
fn numa_node0() {
    let Ok(topo) = Topology::from_sysfs(Path::new("/sys")) else {
        return skip("numa:0", "cannot read /sys/devices/system/node");
    };
    match topo.node(0) {
        Some(n) if n.memory_bytes > 0 => {}
        _ => return skip("numa:0", "Linux exposes no NUMA node 0 with memory here"),
    }
    let mut c = Case::new(
        Backend::Numa {
            node: 0,
            name: unique("numa0"),
        },
        ODD_SIZE,
    );
    c.opts.huge_pages = HugePages::Transparent;
    run(&c);
}

#[test]
fn numa_other_node() {
    let topo = Topology::from_sysfs(Path::new("/sys")).unwrap();
    let Some(node) = topo.nodes.iter().find(|n| n.id != 0 && n.memory_bytes > 0) else {
        let ids: Vec<u32> = topo.nodes.iter().map(|n| n.id).collect();
        return skip(
            "second NUMA node",
            &format!("no NUMA node with memory besides node 0 (nodes: {ids:?})"),
        );
    };
    eprintln!(
        "running numa:{} (cxl candidate: {})",
        node.id,
        node.is_cxl_candidate()
    );
    run(&Case::new(
        Backend::Numa {
            node: node.id,
            name: unique("numa-other"),
        },
        ODD_SIZE,
    ));
}

#[test]
fn numa_missing_node_is_unavailable() {
    let b = Backend::Numa {
        node: 4000,
        name: unique("numa-missing"),
    };
    let e = Region::create(&b, ODD_SIZE, &RegionOptions::default()).unwrap_err();
    match &e {
        RegionError::Unavailable { why, .. } => assert!(why.contains("node 4000"), "{e}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(!b.path().unwrap().exists(), "a refused create left a file");
}

fn huge_pages_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("HugePages_Total:")?.trim().parse().ok())
}

#[test]
fn explicit_huge_pages() {
    let opts = RegionOptions {
        prefault: true,
        huge_pages: HugePages::Explicit,
    };
    match huge_pages_total() {
        Some(n) if n > 0 => {
            // An odd size: the mapping is rounded up to whole huge pages, the region is not.
            run(&Case {
                opts,
                ..Case::new(Backend::Anonymous, ODD_SIZE)
            });
        }
        total => {
            skip(
                "explicit huge pages",
                &format!("HugePages_Total is {total:?} (none reserved)"),
            );
            // ... and creating them says why instead of failing obscurely.
            let e = Region::create(&Backend::Anonymous, 2 << 20, &opts).unwrap_err();
            assert!(matches!(e, RegionError::Unavailable { .. }), "{e}");
            eprintln!("  (as expected: {e})");
        }
    }
}

#[test]
fn explicit_huge_pages_refuse_file_backends() {
    let b = Backend::Shm(unique("shm-hugetlb"));
    let _cleanup = Cleanup(b.path());
    let opts = RegionOptions {
        prefault: false,
        huge_pages: HugePages::Explicit,
    };
    let e = Region::create(&b, 2 << 20, &opts).unwrap_err();
    assert!(matches!(e, RegionError::Unavailable { .. }), "{e}");
    assert!(!b.path().unwrap().exists(), "a refused create left a file");
}

#[test]
fn zero_size_is_refused() {
    let e = Region::create(&Backend::Anonymous, 0, &RegionOptions::default()).unwrap_err();
    assert!(matches!(e, RegionError::BadSize { size: 0, .. }), "{e}");
}
