//! Kernel names: demangling and the tensor-core flag.
//!
//! A kernel is flagged as using tensor cores when its demangled name contains (case-insensitive)
//! one of [`TENSOR_CORE_PATTERNS`]. It is a name heuristic, not a hardware counter: the per-GPU
//! tensor-core utilisation from NVML GPM is the measured figure; this flag says which kernels
//! are the likely users. The table is documented in docs/src/gpu.md.
use std::{collections::HashMap, sync::Arc};

/// (pattern, what it catches). Patterns are lower case; "mma" alone is avoided because it matches
/// "gamma".
pub const TENSOR_CORE_PATTERNS: &[(&str, &str)] = &[
    (
        "hmma",
        "half-precision MMA (cuBLAS/CUTLASS SASS-level names)",
    ),
    ("imma", "integer MMA"),
    ("wgmma", "Hopper warpgroup MMA"),
    ("gmma", "Hopper GMMA (CUTLASS 3 sm90 kernels)"),
    ("xmma", "cuBLAS/cuBLASLt xmma GEMMs, e.g. sm90_xmma_gemm_*"),
    ("_mma", "mma_sync / *_mma_* device paths"),
    ("::mma", "cute::mma / nvcuda::wmma::mma"),
    ("wmma", "CUDA C++ WMMA API"),
    (
        "tensorop",
        "CUTLASS tensor-op kernels (cutlass_*_tensorop_*)",
    ),
    (
        "cutlass",
        "CUTLASS kernels (FlashInfer, FA3, vLLM, TensorRT-LLM GEMMs)",
    ),
    ("cublas", "kernels carrying the cuBLAS/cuBLASLt namespace"),
    ("nvjet", "cuBLAS 12.8+ GEMMs on Hopper/Blackwell (nvjet_*)"),
    ("16816gemm", "Ampere cuBLAS GEMMs (ampere_*_s16816gemm_*)"),
    ("1688gemm", "Turing cuBLAS GEMMs (turing_*_h1688gemm_*)"),
    ("884gemm", "Volta cuBLAS GEMMs (volta_h884gemm_*)"),
    (
        "flash",
        "FlashAttention (flash_fwd_kernel, flash::*, FlashInfer's flashinfer::*)",
    ),
    (
        "fmha",
        "fused multi-head attention (TensorRT-LLM, xFormers)",
    ),
    ("xqa", "TensorRT-LLM XQA decode attention"),
];

pub fn uses_tensor_cores(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    TENSOR_CORE_PATTERNS.iter().any(|(p, _)| lower.contains(p))
}

/// Demangles a C++ symbol; names that are not mangled come back unchanged.
pub fn demangle(raw: &str) -> String {
    if raw.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(raw.as_bytes())
        && let Ok(s) = sym.demangle()
    {
        return s;
    }
    raw.to_string()
}

/// Demangled names and flags by raw name, bounded: cleared when full (kernel name sets are small,
/// so this is rare and only costs re-demangling).
pub struct NameCache {
    map: HashMap<String, (Arc<str>, bool)>,
    capacity: usize,
}

impl NameCache {
    pub fn new(capacity: usize) -> Self {
        NameCache {
            map: HashMap::new(),
            capacity,
        }
    }

    pub fn get(&mut self, raw: &str) -> (Arc<str>, bool) {
        if let Some(v) = self.map.get(raw) {
            return v.clone();
        }
        if self.map.len() >= self.capacity {
            self.map.clear();
        }
        let name: Arc<str> = demangle(raw).into();
        let v = (name.clone(), uses_tensor_cores(&name));
        self.map.insert(raw.to_string(), v.clone());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_core_flags() {
        for yes in [
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
            "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn",
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)",
            "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>",
            "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN",
            "volta_h884gemm_128x128_ldg8_nn",
            "xqa_kernel",
        ] {
            assert!(uses_tensor_cores(yes), "{yes}");
        }
        for no in [
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "rms_norm_kernel_gamma",
            "void at::native::reduce_kernel<512, 1>",
            "paged_attention_v1_kernel",
        ] {
            assert!(!uses_tensor_cores(no), "{no}");
        }
    }

    #[test]
    fn demangles() {
        assert_eq!(demangle("_Z6kernelPfi"), "kernel(float*, int)");
        assert_eq!(demangle("plain_c_kernel"), "plain_c_kernel");
        assert_eq!(demangle("_Zbroken"), "_Zbroken");
    }

    #[test]
    fn cache_is_bounded() {
        let mut c = NameCache::new(2);
        c.get("a");
        c.get("b");
        c.get("c");
        assert!(c.map.len() <= 2);
        assert!(c.get("_Z16hmma_gemm_kernelv").1);
    }
}
