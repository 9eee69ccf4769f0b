//! Reference tensor-parallel LLM decode for boltccl.
//!
//! A Llama/Qwen-family decoder on the CPU whose attention and MLP are split across ranks
//! (column-parallel q/k/v/gate/up, row-parallel o/down followed by `all_sum`), with loaders for
//! Hugging Face safetensors and GGUF, and a byte-level BPE tokenizer.

#![warn(missing_docs)]

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
