//! Hugging Face safetensors checkpoints (`config.json` + one or more `*.safetensors` files),
//! f32 / f16 / bf16. Also a writer, used by the tests to produce real files.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::Context;
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use super::{Tensor, WeightSource};
use crate::config::{HfConfig, ModelConfig};

/// A safetensors checkpoint, memory-mapped.
pub struct SafetensorsModel {
    config: ModelConfig,
    files: Vec<Mmap>,
    /// Tensor name -> index into `files`.
    index: HashMap<String, usize>,
}

impl SafetensorsModel {
    /// Opens a directory holding `config.json` and `*.safetensors`, or a single `.safetensors`
    /// file whose directory holds `config.json`.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let (dir, files): (PathBuf, Vec<PathBuf>) = if path.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(path)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                .collect();
            v.sort();
            (path.to_path_buf(), v)
        } else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, vec![path.to_path_buf()])
        };
        anyhow::ensure!(!files.is_empty(), "no .safetensors files in {}", dir.display());
        let cfg_path = dir.join("config.json");
        let hf: HfConfig = serde_json::from_slice(
            &std::fs::read(&cfg_path).with_context(|| format!("reading {}", cfg_path.display()))?,
        )
        .with_context(|| format!("parsing {}", cfg_path.display()))?;
        let config = hf.to_model_config()?;

        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            let file = File::open(f).with_context(|| format!("opening {}", f.display()))?;
            // SAFETY: the file is opened read-only; like every mmap-based loader we assume it
            // is not truncated by another process while we read it.
            let map = unsafe { Mmap::map(&file)? };
            let st = SafeTensors::deserialize(&map).with_context(|| format!("parsing header of {}", f.display()))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
            maps.push(map);
        }
        Ok(Self { config, files: maps, index })
    }
}

fn view_to_f32(v: &TensorView<'_>) -> anyhow::Result<Vec<f32>> {
    let b = v.data();
    Ok(match v.dtype() {
        Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => anyhow::bail!("unsupported safetensors dtype {other:?}"),
    })
}

impl WeightSource for SafetensorsModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }
    fn tensor(&self, name: &str) -> anyhow::Result<Tensor> {
        let i = *self.index.get(name).with_context(|| format!("tensor {name} not in checkpoint"))?;
        let st = SafeTensors::deserialize(&self.files[i])?;
        let v = st.tensor(name)?;
        Ok(Tensor { shape: v.shape().to_vec(), data: view_to_f32(&v)? })
    }
}

/// Element type for [`write_safetensors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreDtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

/// Writes `tensors` to a safetensors file with the given element type (a real file, through
/// the `safetensors` crate's serialiser).
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)], dtype: StoreDtype) -> anyhow::Result<()> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(n, t)| {
            let b: Vec<u8> = match dtype {
                StoreDtype::F32 => t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                StoreDtype::F16 => t.data.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
                StoreDtype::BF16 => t.data.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect(),
            };
            (n.clone(), b, t.shape.clone())
        })
        .collect();
    let st_dtype = match dtype {
        StoreDtype::F32 => Dtype::F32,
        StoreDtype::F16 => Dtype::F16,
        StoreDtype::BF16 => Dtype::BF16,
    };
    let views = bytes
        .iter()
        .map(|(n, b, s)| Ok((n.clone(), TensorView::new(st_dtype, s.clone(), b)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, &None, path)?;
    Ok(())
}
