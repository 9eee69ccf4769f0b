//! Reference tensor-parallel LLM decode for boltccl.
//!
//! A Llama/Qwen-family decoder on the CPU whose attention and MLP are split across ranks
//! (column-parallel q/k/v/gate/up, row-parallel o/down followed by `all_sum`), with loaders for
//! Hugging Face safetensors and GGUF, and a byte-level BPE tokenizer.

#![warn(missing_docs)]

/// Largest GPU prefill batch, in tokens (`--gpu-prefill-batch`): enough to take a usual prompt
/// in one or two round trips per layer segment, while the batch buffers (the attention scratch
/// grows with batch x heads x context) stay small next to the weights.
pub const GPU_PREFILL_BATCH: usize = 64;

pub mod comm;
pub mod config;
pub mod generate;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod loader;
pub mod model;
pub mod ops;
pub mod quant;
pub mod sample;
pub mod serve;
pub mod shard;
pub mod timing;
pub mod tokenizer;
