//! Machine topology as the memory tier sees it.
//!
//! [`Topology::discover`] lists the NUMA nodes (memory, CPUs, distances, memory tier), flags the
//! CPU-less ones that have memory ([`NumaNode::is_cxl_candidate`]: that is how a CXL memory
//! expander, or DRAM emulating one, appears to Linux), lists device-DAX devices with their size,
//! alignment and target node, and reports per-node bandwidth and latency where the firmware gives
//! them (ACPI HMAT, surfaced in `/sys/devices/system/node/nodeN/accessC/initiators`).
//!
//! The `/sys` reader ([`Topology::from_sysfs`]) always works and takes the sysfs root as a
//! parameter, so its parser is tested against fake trees. With the `hwloc` feature, discovery asks
//! the system libhwloc (through the `hwlocality` crate) for nodes and memory attributes first and
//! keeps `/sys` for the rest (distances, tiers, DAX devices); if hwloc fails, `/sys` alone is used
//! and [`Topology::notes`] says why.
//!
//! Nothing here maps memory or needs privileges: it only reads files.

use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Errors of topology discovery.
#[derive(Debug, Error)]
pub enum TopoError {
    /// A sysfs directory that exists could not be read.
    #[error("reading {path}: {source}")]
    Sysfs {
        /// The path that failed.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, TopoError>;

/// The machine's NUMA nodes and DAX devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// Where the data came from: `"sysfs"` or `"hwloc+sysfs"`.
    pub source: String,
    /// NUMA nodes in ascending id order.
    pub nodes: Vec<NumaNode>,
    /// Device-DAX devices in name order.
    pub dax_devices: Vec<DaxDevice>,
    /// Caveats met during discovery (a missing sysfs directory, an hwloc failure, ...).
    pub notes: Vec<String>,
}

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// Node id (`nodeN`).
    pub id: u32,
    /// Memory of the node in bytes (`MemTotal`).
    pub memory_bytes: u64,
    /// CPUs of the node.
    pub cpus: Vec<u32>,
    /// No CPU belongs to the node: with memory, a CXL expander candidate.
    pub cpuless: bool,
    /// Row of the SLIT distance matrix: distance from this node to each online node.
    pub distances: Vec<NodeDistance>,
    /// The kernel's memory tier of the node (`memory_tierN`), where memory tiering is enabled.
    pub memory_tier: Option<u32>,
    /// Bandwidth and latency from the best (`access0`) or CPU (`access1`) initiators, where the
    /// firmware reports them.
    pub access: Vec<AccessAttributes>,
}

impl NumaNode {
    /// A CPU-less node with memory: how a CXL memory expander (or DRAM emulating one) appears.
    pub fn is_cxl_candidate(&self) -> bool {
        self.cpuless && self.memory_bytes > 0
    }
}

/// Distance to another node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NodeDistance {
    /// The other node.
    pub node: u32,
    /// SLIT distance (10 = local).
    pub distance: u32,
}

/// Access performance of a node's memory as seen from its initiators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccessAttributes {
    /// Where the figures come from: `"sysfs access0"`, `"sysfs access1"` or `"hwloc"`.
    pub source: String,
    /// The initiators they are measured from (`"nodes 0,1"`, or an hwloc cpuset).
    pub initiators: String,
    /// Read bandwidth in MB/s (MiB/s for hwloc).
    pub read_bandwidth_mbps: Option<u64>,
    /// Write bandwidth in MB/s (MiB/s for hwloc).
    pub write_bandwidth_mbps: Option<u64>,
    /// Read latency in nanoseconds.
    pub read_latency_ns: Option<u64>,
    /// Write latency in nanoseconds.
    pub write_latency_ns: Option<u64>,
}

/// A device-DAX device (`/sys/bus/dax/devices/daxX.Y`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DaxDevice {
    /// Device name, `daxX.Y`.
    pub name: String,
    /// Character device path, `/dev/daxX.Y`.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Mapping alignment in bytes (`align`), where the kernel reports it.
    pub align: Option<u64>,
    /// The NUMA node the memory would form if onlined as system RAM (`target_node`).
    pub target_node: Option<i64>,
    /// The NUMA node the device is attached to (`numa_node`).
    pub numa_node: Option<i64>,
}

impl Topology {
    /// Discovers this machine's topology: hwloc for nodes and memory attributes when the `hwloc`
    /// feature is enabled (falling back to `/sys` if it fails), `/sys` for everything else.
    pub fn discover() -> Result<Topology> {
        #[allow(unused_mut)]
        let mut topo = Topology::from_sysfs(Path::new("/sys"))?;
        #[cfg(feature = "hwloc")]
        match hwloc::overlay(&mut topo) {
            Ok(()) => topo.source = "hwloc+sysfs".into(),
            Err(why) => topo
                .notes
                .push(format!("hwloc failed, /sys used alone: {why}")),
        }
        Ok(topo)
    }

    /// Reads the topology from a sysfs tree rooted at `root` (`/sys` on a live system).
    pub fn from_sysfs(root: &Path) -> Result<Topology> {
        let mut notes = Vec::new();
        let nodes = read_nodes(root, &mut notes)?;
        let dax_devices = read_dax(root)?;
        Ok(Topology {
            source: "sysfs".into(),
            nodes,
            dax_devices,
            notes,
        })
    }

    /// The node with id `id`.
    pub fn node(&self, id: u32) -> Option<&NumaNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// CPU-less nodes with memory: the CXL expander candidates.
    pub fn cxl_candidates(&self) -> impl Iterator<Item = &NumaNode> {
        self.nodes.iter().filter(|n| n.is_cxl_candidate())
    }

    /// The topology as a JSON object (the fields of [`Topology`], plus `cxl_candidates`).
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Json<'a> {
            #[serde(flatten)]
            topo: &'a Topology,
            cxl_candidates: Vec<u32>,
        }
        let json = Json {
            topo: self,
            cxl_candidates: self.cxl_candidates().map(|n| n.id).collect(),
        };
        serde_json::to_string_pretty(&json).expect("plain data always serializes")
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "NUMA nodes ({}): {}", self.source, self.nodes.len())?;
        for n in &self.nodes {
            let cpus = if n.cpus.is_empty() {
                "none".to_string()
            } else {
                format_list(&n.cpus)
            };
            write!(
                f,
                "  node {}: {}, CPUs {}",
                n.id,
                format_bytes(n.memory_bytes),
                cpus
            )?;
            if n.is_cxl_candidate() {
                write!(f, "  [CPU-less: CXL candidate]")?;
            } else if n.cpuless {
                write!(f, "  [CPU-less, no memory]")?;
            }
            writeln!(f)?;
            if !n.distances.is_empty() {
                let d: Vec<String> = n
                    .distances
                    .iter()
                    .map(|d| format!("{}:{}", d.node, d.distance))
                    .collect();
                writeln!(f, "    distances: {}", d.join(" "))?;
            }
            if let Some(t) = n.memory_tier {
                writeln!(f, "    memory tier: {t}")?;
            }
            if n.access.is_empty() {
                writeln!(
                    f,
                    "    bandwidth/latency: not reported by the firmware (no HMAT)"
                )?;
            }
            for a in &n.access {
                writeln!(
                    f,
                    "    {} from {}: read {} / write {}, latency read {} / write {}",
                    a.source,
                    a.initiators,
                    opt(a.read_bandwidth_mbps, "MB/s"),
                    opt(a.write_bandwidth_mbps, "MB/s"),
                    opt(a.read_latency_ns, "ns"),
                    opt(a.write_latency_ns, "ns"),
                )?;
            }
        }
        let cxl: Vec<String> = self
            .cxl_candidates()
            .map(|n| format!("node {}", n.id))
            .collect();
        if cxl.is_empty() {
            writeln!(f, "no CXL candidate (CPU-less NUMA node with memory) found")?;
        } else {
            writeln!(
                f,
                "CXL candidates (CPU-less NUMA nodes with memory): {}",
                cxl.join(", ")
            )?;
        }
        if self.dax_devices.is_empty() {
            writeln!(f, "no DAX device found")?;
        } else {
            writeln!(f, "DAX devices: {}", self.dax_devices.len())?;
            for d in &self.dax_devices {
                writeln!(
                    f,
                    "  {}: {}, align {}, target node {}, attached to node {}",
                    d.path.display(),
                    format_bytes(d.size),
                    d.align.map_or("?".into(), format_bytes),
                    d.target_node.map_or("?".into(), |n| n.to_string()),
                    d.numa_node.map_or("?".into(), |n| n.to_string()),
                )?;
            }
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

fn opt(v: Option<u64>, unit: &str) -> String {
    v.map_or("?".into(), |v| format!("{v} {unit}"))
}

fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Formats ids as a kernel-style range list (`0-3,8`).
fn format_list(ids: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Parses a kernel range list (`0-3,8,10-11`; empty for none). Malformed parts are skipped.
pub(crate) fn parse_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_num<T: std::str::FromStr>(path: &Path) -> Option<T> {
    read_trimmed(path)?.parse().ok()
}

/// `MemTotal` of a node directory (`.../node/nodeN`) in bytes, from its `meminfo`.
pub(crate) fn node_memory_bytes(node_dir: &Path) -> Option<u64> {
    let info = std::fs::read_to_string(node_dir.join("meminfo")).ok()?;
    info.lines().find_map(|l| {
        // "Node 0 MemTotal:       4155596 kB"
        let rest = l.split_once("MemTotal:")?.1;
        let mut it = rest.split_whitespace();
        let v: u64 = it.next()?.parse().ok()?;
        Some(match it.next() {
            Some("kB") => v * 1024,
            _ => v,
        })
    })
}

/// Ids of the entries of `dir` named `PREFIX<number>`, ascending.
fn numbered_entries(dir: &Path, prefix: &str) -> Result<Vec<u32>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(TopoError::Sysfs {
                path: dir.into(),
                source,
            })
        }
    };
    let mut ids: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix(prefix)?.parse().ok())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

fn read_nodes(root: &Path, notes: &mut Vec<String>) -> Result<Vec<NumaNode>> {
    let dir = root.join("devices/system/node");
    if !dir.is_dir() {
        notes.push(format!(
            "{} is missing: this kernel has no NUMA support",
            dir.display()
        ));
        return Ok(Vec::new());
    }
    let ids = numbered_entries(&dir, "node")?;
    // The distance file lists one entry per online node, in id order.
    let online = read_trimmed(&dir.join("online"))
        .map(|s| parse_list(&s))
        .unwrap_or(ids.clone());
    let tiers = read_tiers(root)?;
    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        let nd = dir.join(format!("node{id}"));
        let cpus = read_trimmed(&nd.join("cpulist"))
            .map(|s| parse_list(&s))
            .unwrap_or_default();
        let distances = read_trimmed(&nd.join("distance"))
            .map(|s| {
                s.split_whitespace()
                    .filter_map(|d| d.parse().ok())
                    .zip(&online)
                    .map(|(distance, &node)| NodeDistance { node, distance })
                    .collect()
            })
            .unwrap_or_default();
        let memory_bytes = node_memory_bytes(&nd).unwrap_or_else(|| {
            notes.push(format!("no MemTotal in {}/meminfo", nd.display()));
            0
        });
        nodes.push(NumaNode {
            id,
            memory_bytes,
            cpuless: cpus.is_empty(),
            cpus,
            distances,
            memory_tier: tiers
                .iter()
                .find(|(_, ns)| ns.contains(&id))
                .map(|(t, _)| *t),
            access: read_access(&nd)?,
        });
    }
    Ok(nodes)
}

/// `(tier, nodes)` from `/sys/devices/virtual/memory_tiering/memory_tierN/nodelist`.
fn read_tiers(root: &Path) -> Result<Vec<(u32, Vec<u32>)>> {
    let dir = root.join("devices/virtual/memory_tiering");
    Ok(numbered_entries(&dir, "memory_tier")?
        .into_iter()
        .map(|t| {
            let nodes = read_trimmed(&dir.join(format!("memory_tier{t}/nodelist")))
                .map(|s| parse_list(&s))
                .unwrap_or_default();
            (t, nodes)
        })
        .collect())
}

/// `nodeN/accessC/initiators/{read,write}_{bandwidth,latency}` (HMAT), for access classes 0 and 1.
fn read_access(node_dir: &Path) -> Result<Vec<AccessAttributes>> {
    let mut out = Vec::new();
    for class in 0..2 {
        let dir = node_dir.join(format!("access{class}/initiators"));
        if !dir.is_dir() {
            continue;
        }
        let initiators = numbered_entries(&dir, "node")?;
        let a = AccessAttributes {
            source: format!("sysfs access{class}"),
            initiators: format!("nodes {}", format_list(&initiators)),
            read_bandwidth_mbps: read_num(&dir.join("read_bandwidth")),
            write_bandwidth_mbps: read_num(&dir.join("write_bandwidth")),
            read_latency_ns: read_num(&dir.join("read_latency")),
            write_latency_ns: read_num(&dir.join("write_latency")),
        };
        let any = a.read_bandwidth_mbps.is_some()
            || a.write_bandwidth_mbps.is_some()
            || a.read_latency_ns.is_some()
            || a.write_latency_ns.is_some();
        if any {
            out.push(a);
        }
    }
    Ok(out)
}

fn read_dax(root: &Path) -> Result<Vec<DaxDevice>> {
    let dir = root.join("bus/dax/devices");
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(TopoError::Sysfs { path: dir, source }),
    };
    let mut devs: Vec<DaxDevice> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let d = e.path();
            Some(DaxDevice {
                path: Path::new("/dev").join(&name),
                size: read_num(&d.join("size"))?,
                align: read_num(&d.join("align")),
                target_node: read_num(&d.join("target_node")),
                numa_node: read_num(&d.join("numa_node")),
                name,
            })
        })
        .collect();
    devs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(devs)
}

/// Nodes and memory attributes from the system libhwloc.
#[cfg(feature = "hwloc")]
mod hwloc {
    use super::{AccessAttributes, NumaNode, Topology};
    use hwlocality::memory::attribute::MemoryAttribute;
    use hwlocality::object::attributes::ObjectAttributes;
    use hwlocality::object::types::ObjectType;
    use hwlocality::object::TopologyObject;

    /// The best value of `attr` for `node` over all initiators (largest bandwidth, smallest
    /// latency) and the initiator it is seen from.
    fn best(
        attr: MemoryAttribute<'_>,
        node: &TopologyObject,
        higher_is_better: bool,
    ) -> Option<(String, u64)> {
        let (inits, values) = attr.initiators(node).ok()?;
        let pairs = inits
            .iter()
            .zip(values)
            .filter(|&(_, v)| v != 0 && v != u64::MAX);
        let pick = if higher_is_better {
            pairs.max_by_key(|&(_, v)| v)
        } else {
            pairs.min_by_key(|&(_, v)| v)
        };
        pick.map(|(i, v)| (i.to_string(), v))
    }

    /// Replaces the nodes' id, memory and CPUs with hwloc's, adds nodes only hwloc sees, and adds
    /// hwloc's memory attributes.
    pub(super) fn overlay(topo: &mut Topology) -> Result<(), String> {
        let hw = hwlocality::Topology::new().map_err(|e| e.to_string())?;
        for obj in hw.objects_with_type(ObjectType::NUMANode) {
            let Some(id) = obj.os_index().and_then(|i| u32::try_from(i).ok()) else {
                continue;
            };
            let memory = match obj.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
                _ => obj.total_memory(),
            };
            let cpus: Vec<u32> = obj
                .cpuset()
                .map(|c| {
                    c.iter_set()
                        .filter_map(|i| u32::try_from(usize::from(i)).ok())
                        .collect()
                })
                .unwrap_or_default();
            let at = match topo.nodes.iter().position(|n| n.id == id) {
                Some(i) => i,
                None => {
                    topo.nodes.push(NumaNode {
                        id,
                        memory_bytes: 0,
                        cpus: Vec::new(),
                        cpuless: true,
                        distances: Vec::new(),
                        memory_tier: None,
                        access: Vec::new(),
                    });
                    topo.nodes.len() - 1
                }
            };
            let n = &mut topo.nodes[at];
            if memory > 0 {
                n.memory_bytes = memory;
            }
            n.cpuless = cpus.is_empty();
            n.cpus = cpus;
            let rb = best(MemoryAttribute::read_bandwidth(&hw), obj, true)
                .or_else(|| best(MemoryAttribute::bandwidth(&hw), obj, true));
            let wb = best(MemoryAttribute::write_bandwidth(&hw), obj, true)
                .or_else(|| best(MemoryAttribute::bandwidth(&hw), obj, true));
            let rl = best(MemoryAttribute::read_latency(&hw), obj, false)
                .or_else(|| best(MemoryAttribute::latency(&hw), obj, false));
            let wl = best(MemoryAttribute::write_latency(&hw), obj, false)
                .or_else(|| best(MemoryAttribute::latency(&hw), obj, false));
            let initiators = [&rb, &wb, &rl, &wl]
                .into_iter()
                .find_map(|v| v.as_ref().map(|(i, _)| i.clone()));
            if let Some(initiators) = initiators {
                n.access.push(AccessAttributes {
                    source: "hwloc".into(),
                    initiators: format!("best initiator {initiators}"),
                    read_bandwidth_mbps: rb.map(|v| v.1),
                    write_bandwidth_mbps: wb.map(|v| v.1),
                    read_latency_ns: rl.map(|v| v.1),
                    write_latency_ns: wl.map(|v| v.1),
                });
            }
        }
        topo.nodes.sort_by_key(|n| n.id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs tree under the system temp dir, removed on drop.
    struct FakeSys(PathBuf);

    impl FakeSys {
        fn new(tag: &str) -> FakeSys {
            let root =
                std::env::temp_dir().join(format!("cxlkv-topo-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            FakeSys(root)
        }
        fn file(&self, rel: &str, body: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        fn node(&self, id: u32, cpus: &str, mem_kb: u64, distance: &str) {
            let d = format!("devices/system/node/node{id}");
            self.file(&format!("{d}/cpulist"), &format!("{cpus}\n"));
            self.file(&format!("{d}/distance"), &format!("{distance}\n"));
            self.file(
                &format!("{d}/meminfo"),
                &format!("Node {id} MemTotal:       {mem_kb} kB\nNode {id} MemFree:  1 kB\n"),
            );
        }
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn range_lists_round_trip() {
        assert_eq!(parse_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_list(""), Vec::<u32>::new());
        assert_eq!(parse_list("\n"), Vec::<u32>::new());
        assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    #[test]
    fn cpuless_node_with_memory_is_a_cxl_candidate() {
        let sys = FakeSys::new("cxl");
        sys.file("devices/system/node/online", "0-2\n");
        sys.node(0, "0-3", 8 << 20, "10 21 14");
        sys.node(1, "", 16 << 20, "21 10 24");
        sys.node(2, "", 0, "14 24 10");
        sys.file(
            "devices/system/node/node1/access0/initiators/read_bandwidth",
            "30000\n",
        );
        sys.file(
            "devices/system/node/node1/access0/initiators/write_bandwidth",
            "20000\n",
        );
        sys.file(
            "devices/system/node/node1/access0/initiators/read_latency",
            "250\n",
        );
        sys.file("devices/system/node/node1/access0/initiators/node0", "");
        sys.file(
            "devices/virtual/memory_tiering/memory_tier4/nodelist",
            "0\n",
        );
        sys.file(
            "devices/virtual/memory_tiering/memory_tier22/nodelist",
            "1\n",
        );
        let dax = "bus/dax/devices/dax0.0";
        sys.file(&format!("{dax}/size"), &format!("{}\n", 4u64 << 30));
        sys.file(&format!("{dax}/align"), "2097152\n");
        sys.file(&format!("{dax}/target_node"), "1\n");
        sys.file(&format!("{dax}/numa_node"), "0\n");

        let t = Topology::from_sysfs(&sys.0).unwrap();
        assert_eq!(t.nodes.len(), 3);
        let n0 = t.node(0).unwrap();
        assert_eq!(n0.cpus, vec![0, 1, 2, 3]);
        assert_eq!(n0.memory_bytes, 8 << 30);
        assert!(!n0.cpuless && !n0.is_cxl_candidate());
        assert_eq!(n0.memory_tier, Some(4));
        assert!(n0.access.is_empty());
        let n1 = t.node(1).unwrap();
        assert!(n1.cpuless && n1.is_cxl_candidate());
        assert_eq!(n1.memory_tier, Some(22));
        assert_eq!(
            n1.distances,
            vec![
                NodeDistance {
                    node: 0,
                    distance: 21
                },
                NodeDistance {
                    node: 1,
                    distance: 10
                },
                NodeDistance {
                    node: 2,
                    distance: 24
                },
            ]
        );
        let a = &n1.access[0];
        assert_eq!(a.initiators, "nodes 0");
        assert_eq!(
            (
                a.read_bandwidth_mbps,
                a.write_bandwidth_mbps,
                a.read_latency_ns,
                a.write_latency_ns
            ),
            (Some(30000), Some(20000), Some(250), None)
        );
        let n2 = t.node(2).unwrap();
        assert!(
            n2.cpuless && !n2.is_cxl_candidate(),
            "no memory: not a candidate"
        );
        assert_eq!(
            t.cxl_candidates().map(|n| n.id).collect::<Vec<_>>(),
            vec![1]
        );

        assert_eq!(
            t.dax_devices,
            vec![DaxDevice {
                name: "dax0.0".into(),
                path: "/dev/dax0.0".into(),
                size: 4 << 30,
                align: Some(2 << 20),
                target_node: Some(1),
                numa_node: Some(0),
            }]
        );

        let text = t.to_string();
        assert!(
            text.contains("node 1: 16.00 GiB, CPUs none  [CPU-less: CXL candidate]"),
            "{text}"
        );
        assert!(
            text.contains("CXL candidates (CPU-less NUMA nodes with memory): node 1"),
            "{text}"
        );
        assert!(text.contains("/dev/dax0.0: 4.00 GiB"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
        assert_eq!(json["cxl_candidates"], serde_json::json!([1]));
        assert_eq!(json["nodes"][1]["cpuless"], serde_json::json!(true));
        assert_eq!(
            json["dax_devices"][0]["size"],
            serde_json::json!(4u64 << 30)
        );
    }

    #[test]
    fn one_node_and_no_dax_says_so() {
        let sys = FakeSys::new("one");
        sys.node(0, "0-1", 4 << 20, "10");
        let t = Topology::from_sysfs(&sys.0).unwrap();
        assert_eq!(t.nodes.len(), 1);
        assert_eq!(
            t.nodes[0].distances,
            vec![NodeDistance {
                node: 0,
                distance: 10
            }]
        );
        let text = t.to_string();
        assert!(
            text.contains("no CXL candidate (CPU-less NUMA node with memory) found"),
            "{text}"
        );
        assert!(text.contains("no DAX device found"), "{text}");
    }

    #[test]
    fn missing_node_directory_is_a_note_not_an_error() {
        let sys = FakeSys::new("nonuma");
        let t = Topology::from_sysfs(&sys.0).unwrap();
        assert!(t.nodes.is_empty() && t.dax_devices.is_empty());
        assert!(t.notes[0].contains("no NUMA support"), "{:?}", t.notes);
    }

    /// Prints this machine's topology (what `cxlkv topo` shows); run with `--nocapture`.
    #[test]
    fn discover_this_machine() {
        let t = Topology::discover().unwrap();
        eprintln!("{t}");
        eprintln!("{}", t.to_json());
    }
}
