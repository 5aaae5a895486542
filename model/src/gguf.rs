//! Opening a GGUF file: the magic checked by hand (so a wrong file is a clear error, not a parse
//! failure deep in candle), then candle's reader for the metadata and tensor directory, and typed
//! metadata getters whose errors name the key.

use crate::error::{Error, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// An open GGUF file: its metadata and tensor directory, and the reader its tensors come from.
pub struct Gguf {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

impl Gguf {
    /// Opens `path` and reads its header. A missing file, a file without the `GGUF` magic or a
    /// truncated header are errors naming the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref().to_path_buf();
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let mut reader = BufReader::new(File::open(&path).map_err(io)?);
        let mut magic = [0u8; 4];
        match reader.read_exact(&mut magic) {
            Ok(()) if &magic == b"GGUF" => {}
            Ok(()) => {
                return Err(Error::NotGguf {
                    path,
                    reason: format!("starts with {magic:02x?}, expected \"GGUF\""),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(Error::NotGguf {
                    path,
                    reason: "shorter than the 4-byte magic".into(),
                })
            }
            Err(e) => return Err(io(e)),
        }
        reader.seek(SeekFrom::Start(0)).map_err(io)?;
        let content = Content::read(&mut reader).map_err(|e| Error::NotGguf {
            path: path.clone(),
            reason: format!("bad header: {e}"),
        })?;
        Ok(Gguf {
            path,
            content,
            reader,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| Error::MissingMetadata(key.to_string()))
    }

    /// A required unsigned integer (any GGUF integer type that is non-negative).
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.require(key)?;
        let n = match v {
            Value::U8(x) => Some(*x as u64),
            Value::U16(x) => Some(*x as u64),
            Value::U32(x) => Some(*x as u64),
            Value::U64(x) => Some(*x),
            Value::I8(x) => u64::try_from(*x).ok(),
            Value::I16(x) => u64::try_from(*x).ok(),
            Value::I32(x) => u64::try_from(*x).ok(),
            Value::I64(x) => u64::try_from(*x).ok(),
            _ => None,
        };
        n.and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
            bad(
                key,
                format!("expected a non-negative integer, found {}", describe(v)),
            )
        })
    }

    /// An optional unsigned integer.
    pub fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        self.get(key).map(|_| self.usize(key)).transpose()
    }

    /// A required float (f32 or f64).
    pub fn f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            v => Err(bad(key, format!("expected a float, found {}", describe(v)))),
        }
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(bad(
                key,
                format!("expected a string, found {}", describe(v)),
            )),
        }
    }

    /// A required array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        let Value::Array(items) = self.require(key)? else {
            return Err(bad(key, "expected an array of strings".into()));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(bad(
                    key,
                    format!("element {i} is {}, not a string", describe(other)),
                )),
            })
            .collect()
    }

    /// An optional array of integers (e.g. `tokenizer.ggml.token_type`).
    pub fn ints_opt(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = v else {
            return Err(bad(key, "expected an array of integers".into()));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::I32(x) => Ok(*x as i64),
                Value::U32(x) => Ok(*x as i64),
                Value::I64(x) => Ok(*x),
                Value::U8(x) => Ok(*x as i64),
                Value::I8(x) => Ok(*x as i64),
                Value::U16(x) => Ok(*x as i64),
                Value::I16(x) => Ok(*x as i64),
                other => Err(bad(
                    key,
                    format!("element {i} is {}, not an integer", describe(other)),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Whether the file holds a tensor called `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The dimensions of tensor `name` in candle's order (rows first: a GGUF `[in, out]` matrix
    /// is `[out, in]` here).
    pub fn tensor_dims(&self, name: &str) -> Option<&[usize]> {
        self.content.tensor_infos.get(name).map(|t| t.shape.dims())
    }

    /// Reads tensor `name` (quantized as stored), checking its dimensions against `dims`.
    pub fn tensor(&mut self, name: &str, dims: &[usize]) -> Result<QTensor> {
        let Some(found) = self.tensor_dims(name) else {
            return Err(Error::BadTensor {
                name: name.into(),
                reason: "absent from the file".into(),
            });
        };
        if found != dims {
            return Err(Error::BadTensor {
                name: name.into(),
                reason: format!("dimensions {found:?}, expected {dims:?}"),
            });
        }
        self.content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| Error::BadTensor {
                name: name.into(),
                reason: e.to_string(),
            })
    }
}

fn bad(key: &str, reason: String) -> Error {
    Error::BadMetadata {
        key: key.to_string(),
        reason,
    }
}

/// A short description of a metadata value for error messages (arrays can hold 100k strings).
fn describe(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("an array of {} elements", items.len()),
        Value::String(s) if s.len() > 64 => format!("a string of {} bytes", s.len()),
        other => format!("{other:?}"),
    }
}
