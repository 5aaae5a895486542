//! A folder of real attention tensors in the data/kv format (data/kv/README.md): `tokens.npy`,
//! `meta.json` and, per dumped layer, `layerNN_{q,k,v}.npy` (f16, `[heads][tokens][dim]`).
//! Part 1 of the demo stores its K and V in the pool; the `--sweep` scans them on the device.

use super::super::{Error, Result};
use cxlkv_bench_support::npy::read_npy;
use std::path::{Path, PathBuf};

/// The bundled folder: SmolLM2-135M over the first 2,048 tokens of The Devil's Dictionary.
const BUNDLED: &str = "data/kv/smollm2_devil_2048";

/// One layer's tensors, f16 little-endian bytes, head-major.
pub struct Layer {
    /// The model's layer number.
    pub layer: u32,
    /// Queries, `[q_heads][tokens][dim]`.
    pub q: Vec<u8>,
    /// Query heads (a multiple of the KV heads).
    pub q_heads: usize,
    /// Keys, `[heads][tokens][dim]`.
    pub k: Vec<u8>,
    /// Values, as the keys.
    pub v: Vec<u8>,
}

/// A folder's tokens and layers, checked to share one shape.
pub struct KvDir {
    /// The text's token ids.
    pub tokens: Vec<u32>,
    /// KV heads of every layer.
    pub heads: usize,
    /// Head dimension of every layer.
    pub dim: usize,
    /// Ascending layer numbers, at least one.
    pub layers: Vec<Layer>,
}

/// The repository's copy, found from the binary (target/<profile>/cxlkv) or the source tree.
pub fn default_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            if dir.join(BUNDLED).join("meta.json").is_file() {
                return dir.join(BUNDLED);
            }
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(BUNDLED)
}

/// The folder's meta.json (an empty object when there is none).
pub fn meta(dir: &Path) -> Result<serde_json::Value> {
    match std::fs::read_to_string(dir.join("meta.json")) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| Error::Other(format!("{}: meta.json: {e}", dir.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::json!({})),
        Err(e) => Err(Error::Other(format!("{}: meta.json: {e}", dir.display()))),
    }
}

/// The token ids of `tokens.npy`.
pub fn tokens(dir: &Path) -> Result<Vec<u32>> {
    let err =
        |e: &dyn std::fmt::Display| Error::Other(format!("{}: tokens.npy: {e}", dir.display()));
    let ids = read_npy(dir.join("tokens.npy"))
        .and_then(|a| a.to_i32())
        .map_err(|e| err(&e))?;
    ids.into_iter()
        .map(|t| u32::try_from(t).map_err(|_| err(&format!("negative token id {t}"))))
        .collect()
}

/// The layers a folder holds: meta.json's `dumped_layers`, or, without it, every
/// `layerNN_k.npy` present; ascending, at least one.
pub fn dumped_layers(dir: &Path) -> Result<Vec<u32>> {
    let err = |m: &str| Error::Other(format!("{}: {m}", dir.display()));
    let mut layers: Vec<u32> = match meta(dir)?.get("dumped_layers") {
        Some(v) => v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|l| l.as_u64().and_then(|l| u32::try_from(l).ok()))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or_else(|| err("meta.json: dumped_layers is not a list of layer numbers"))?,
        None => Vec::new(),
    };
    if layers.is_empty() {
        layers = std::fs::read_dir(dir)
            .map_err(|e| err(&e.to_string()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| {
                n.strip_prefix("layer")?
                    .strip_suffix("_k.npy")?
                    .parse()
                    .ok()
            })
            .collect();
    }
    layers.sort_unstable();
    layers.dedup();
    if layers.is_empty() {
        return Err(err(
            "no layers: meta.json names no dumped_layers and there is no layerNN_k.npy",
        ));
    }
    Ok(layers)
}

/// Reads the folder: every dumped layer's K and V (first, so a missing layer is named by its
/// key file), then its Q; all layers must have the same heads and dimension.
pub fn load(dir: &Path) -> Result<KvDir> {
    let tokens = tokens(dir)?;
    let n = tokens.len();
    let (mut heads, mut dim) = (0, 0);
    let mut layers = Vec::new();
    for layer in dumped_layers(dir)? {
        let read = |t: &str| -> Result<(Vec<usize>, Vec<u8>)> {
            let f = format!("layer{layer:02}_{t}.npy");
            let a = read_npy(dir.join(&f))
                .map_err(|e| Error::Other(format!("{}: {f}: {e}", dir.display())))?;
            if a.shape.len() != 3 || a.shape[1] != n {
                return Err(Error::Other(format!(
                    "{f}: shape {:?}, expected [heads, {n}, dim]",
                    a.shape
                )));
            }
            let bits = a
                .to_f16_bits()
                .map_err(|e| Error::Other(format!("{}: {f}: {e}", dir.display())))?;
            Ok((a.shape, bits.iter().flat_map(|b| b.to_le_bytes()).collect()))
        };
        let (ks, k) = read("k")?;
        let (vs, v) = read("v")?;
        if ks[0] == 0 || ks[2] == 0 {
            return Err(Error::Other(format!(
                "layer{layer:02}_k.npy: shape {ks:?} has no heads or no dimension"
            )));
        }
        if vs != ks {
            return Err(Error::Other(format!(
                "layer {layer}: V has shape {vs:?}, K {ks:?}"
            )));
        }
        if !layers.is_empty() && (ks[0], ks[2]) != (heads, dim) {
            return Err(Error::Other(format!(
                "layer{layer:02}_k.npy: shape {ks:?}, but other layers have {heads} heads of \
                 dimension {dim}"
            )));
        }
        (heads, dim) = (ks[0], ks[2]);
        let (qs, q) = read("q")?;
        if qs[2] != dim || qs[0] == 0 || qs[0] % heads != 0 {
            return Err(Error::Other(format!(
                "layer{layer:02}_q.npy: shape {qs:?}, expected [a multiple of {heads}, {n}, {dim}]"
            )));
        }
        layers.push(Layer {
            layer,
            q,
            q_heads: qs[0],
            k,
            v,
        });
    }
    Ok(KvDir {
        tokens,
        heads,
        dim,
        layers,
    })
}
