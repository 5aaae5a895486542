//! Subcommands of the `cxlkv` binary.

pub mod crosspod;
pub mod demo;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod pool;
pub mod replay;
pub mod sim;

use std::process::ExitCode;

/// Errors the command line reports (exit status 2).
#[derive(Debug)]
pub enum Error {
    /// Bad arguments.
    Usage(String),
    /// A pool operation failed.
    Pool(cxlkv::runtime::PoolError),
    /// Anything else, already described.
    Other(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Usage(m) => write!(f, "{m}"),
            Error::Pool(e) => write!(f, "{e}"),
            Error::Other(m) => write!(f, "{m}"),
        }
    }
}

impl From<cxlkv::runtime::PoolError> for Error {
    fn from(e: cxlkv::runtime::PoolError) -> Self {
        Error::Pool(e)
    }
}

impl From<cxlkv::runtime::region::RegionError> for Error {
    fn from(e: cxlkv::runtime::region::RegionError) -> Self {
        Error::Pool(e.into())
    }
}

/// Result alias of the command line.
pub type Result<T> = std::result::Result<T, Error>;

/// Parses sizes like `4096`, `64K`, `256KiB`, `1G`, `2MB` (binary multiples).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected e.g. 4096, 64K, 1G"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("bad size unit in {s:?}: use K, M, G or T")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

/// Human form of a byte count.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `cxlkv topo`.
pub fn topo(json: bool) -> Result<ExitCode> {
    let t = cxlkv::runtime::topo::Topology::discover().map_err(|e| Error::Other(e.to_string()))?;
    if json {
        println!("{}", t.to_json());
    } else {
        println!("{t}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `cxlkv testbed ...`: runs the test-bed script of the source tree this binary was built from.
pub fn testbed(args: &[String]) -> Result<ExitCode> {
    let rel = std::path::Path::new("testbed/qemu/testbed.sh");
    let roots = std::env::current_exe()
        .ok()
        .into_iter()
        .flat_map(|e| {
            e.ancestors()
                .map(std::path::Path::to_path_buf)
                .collect::<Vec<_>>()
        })
        .chain([std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))]);
    let script = roots
        .map(|r| r.join(rel))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Other(format!(
                "{} not found next to this binary or in {}",
                rel.display(),
                env!("CARGO_MANIFEST_DIR")
            ))
        })?;
    let status = std::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .status()
        .map_err(|e| Error::Other(format!("run {}: {e}", script.display())))?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
