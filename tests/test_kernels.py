"""engine.traces.kernels: kernel name -> category / Tensor Cores / dtype.

Ground truth: tests/data/kernel_names.tsv, 562 real kernel names from public profiler traces
and issue reports, labelled yes/no with the reason. Plus hand-written names of families the
tsv does not hold, to check the rules generalise instead of memorising rows.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

import pytest

from engine.traces.kernels import (
    KERNEL_CATEGORIES,
    MATRIX_CATEGORIES,
    KernelVerdict,
    classify_kernel,
    demangle_hint,
)

TSV = Path(__file__).parent / "data" / "kernel_names.tsv"


def _tsv_rows() -> list[dict]:
    with TSV.open(newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


ROWS = _tsv_rows()


def _row_id(index: int, row: dict) -> str:
    return f"{index:03d}-{re.sub(r'[^A-Za-z0-9_]+', '_', row['kernel_name'])[:50]}"


# --- the labelled set ------------------------------------------------------------------

@pytest.mark.parametrize("row", ROWS, ids=[_row_id(i, r) for i, r in enumerate(ROWS)])
def test_tsv_tensor_core_label(row):
    verdict = classify_kernel(row["kernel_name"])
    assert verdict.tensor_core == row["tensor_core"], (
        f"{row['kernel_name'][:200]}\n  tsv: {row['tensor_core']} ({row['why']})\n"
        f"  got: {verdict}")


def test_tsv_confusion_matrix_has_no_errors():
    counts = Counter((row["tensor_core"], classify_kernel(row["kernel_name"]).tensor_core)
                     for row in ROWS)
    true_pos, false_neg = counts[("yes", "yes")], counts[("yes", "no")] + counts[("yes", "unknown")]
    false_pos, true_neg = counts[("no", "yes")], counts[("no", "no")]
    assert (true_pos, false_neg, false_pos, true_neg) == (157, 0, 0, 400), counts
    assert counts[("no", "unknown")] == 0 and counts[("unknown", "unknown")] == 5


def _tsv_dtypes(label: str) -> set[str]:
    """tsv dtype text -> the classifier's vocabulary: "tf32 (fp32 tensors, ...)" -> {"tf32"},
    "fp8/fp4 (block-scaled)" -> {"fp8", "fp4"}, "complex fp32" -> {"complex64"}."""
    if label.startswith("complex"):
        return {"complex64"}
    return set(re.split(r"[ (]", label.strip())[0].split("/"))


# Spellings of each dtype in kernel names. A tsv dtype that the name does not spell at all
# came from the launching op's input types in the trace (a casting copy, an opaque-typed
# gather, a collective, an Inductor kernel): a name-only classifier cannot see it.
# (nvjet spells its types as letters: tst = bf16, hsh = fp16.)
# (Tensile spells its types in letters too: B_BS_BH / BBS_BH = bf16, S_B / SB = fp32.)
_SPELLINGS = {
    "bf16": ("bf16", "bfloat16", "_tst_", "_b_bs_bh_", "_bbs_bh_", "df16b"),
    "fp16": ("f16", "fp16", "half", "_hsh_"),
    "fp32": ("f32", "float", "sgemm", "ffma", "_s_b_", "_sb_"),
    "tf32": ("tf32", "tfloat32", "s1688"),
    "fp8": ("e4m3", "e5m2", "fp8"),
    "fp4": ("e2m1",),
    "int8": ("int8", "i8"),
    "nvfp4": ("ue4m3xf4", "ue4m3xe2m1", "avec16ue4m3", "e2m1"),
    "mxfp8": ("ue8m0xe4m3", "ue8m0xe5m2", "avec32ue8m0", "mxe4m3"),
    "mxfp4": ("ue8m0xf4", "ue8m0xe2m1", "mxe2m1", "mxfp4"),
    "complex64": ("cgemm",),
}


def _name_spells(name: str, dtypes: set[str]) -> bool:
    lowered = name.lower()
    return any(word in lowered for dtype in dtypes for word in _SPELLINGS.get(dtype, ()))


def test_tsv_dtype_where_the_name_carries_it():
    checked, not_in_name = 0, []
    for row in ROWS:
        if not row["dtype"]:
            continue
        expected = _tsv_dtypes(row["dtype"])
        if not _name_spells(row["kernel_name"], expected):
            not_in_name.append(row["kernel_name"])
            continue
        got = classify_kernel(row["kernel_name"]).dtype
        assert got in expected, f"{row['kernel_name'][:160]}: tsv {row['dtype']!r}, got {got!r}"
        checked += 1
    assert checked >= 180  # of 237 rows with a dtype
    # The exceptions are few; if this grows, look at the rows. A name that does not spell
    # its dtype gets none from the classifier: never a guess.
    assert len(not_in_name) <= 20, not_in_name
    assert all(classify_kernel(n).dtype is None for n in not_in_name
               if classify_kernel(n).category in MATRIX_CATEGORIES)


def test_every_tensor_core_row_gets_a_dtype():
    for row in ROWS:
        verdict = classify_kernel(row["kernel_name"])
        if verdict.tensor_core == "yes" and _name_spells(row["kernel_name"],
                                                         _tsv_dtypes(row["dtype"])):
            assert verdict.dtype in _tsv_dtypes(row["dtype"]), row["kernel_name"][:160]


def test_categories_and_values_are_from_the_closed_sets():
    for row in ROWS:
        verdict = classify_kernel(row["kernel_name"])
        assert verdict.category in KERNEL_CATEGORIES
        assert verdict.tensor_core in ("yes", "no", "unknown")
        assert verdict.reason
        if verdict.tensor_core == "yes":
            assert verdict.category in MATRIX_CATEGORIES, row["kernel_name"][:160]


# --- names the tsv does not hold -------------------------------------------------------

UNSEEN = [
    # (name, category, tensor_core, dtype)
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas", "gemm", "yes", "bf16"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm", "yes", "bf16"),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN", "gemm", "yes", "fp16"),
    ("nvjet_sss_tf32_64x64_64x8_1x1_v_bz_NNT", "gemm", "yes", "tf32"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
     "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)",
     "gemm", "yes", "bf16"),
    ("triton_mm_4", "gemm", "unknown", None),
    ("triton_tem_fused_addmm_relu_1", "gemm", "unknown", None),
    ("triton_poi_fused_addmm_gelu_3", "elementwise", "no", None),
    ("triton_red_fused__log_softmax_0", "softmax", "no", None),
    ("triton_per_fused_native_layer_norm_0", "reduction/norm", "no", None),
    ("volta_h884gemm_64x128_ldg8_nn", "gemm", "yes", "fp16"),
    ("turing_h1688gemm_128x128_ldg8_tn", "gemm", "yes", "fp16"),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn", "gemm", "yes", "bf16"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "gemm", "yes", "fp16"),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize160x128x32_stage4_warpsize2x2x1_"
     "tensor16x8x16_execute_kernel_cublas", "gemm", "yes", "fp16"),
    ("sm86_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_"
     "warpsize2x2x1_g1_tensor16x8x16_t1r1s1_execute_kernel_cudnn", "conv", "yes", "fp16"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f16_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas", "gemm", "yes", "fp8"),
    ("sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize128x128x64_stage3_warpsize2x2x1_tensor16x8x32_"
     "execute_kernel_cublas", "gemm", "yes", "int8"),
    ("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_"
     "execute_kernel__5x_cublas", "gemm", "no", "fp32"),
    ("maxwell_sgemm_128x64_nn", "gemm", "no", "fp32"),
    ("maxwell_hgemm_256x128_nn", "gemm", "no", "fp16"),
    ("maxwell_scudnn_128x32_relu_small_nn", "conv", "no", "fp32"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_h16816gemm_256x128_32x3_nn_align8>(x::Params)",
     "gemm", "yes", "fp16"),
    ("void cutlass::Kernel<cutlass_80_tensorop_i16832gemm_s8_256x128_64x3_tn_align16>(x::Params)",
     "gemm", "yes", "int8"),
    ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_2x1x1_0_tnn_align8_"
     "warpspecialized_cooperative_epi_tma", "gemm", "yes", "bf16"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, "
     "int, int>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
     "MainloopSm90TmaGmmaWarpSpecializedCooperative<4>, cutlass::float_e4m3_t, "
     "cutlass::float_e4m3_t> > >(cutlass::gemm::kernel::GemmUniversal::Params)",
     "gemm", "yes", "fp8"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::collective"
     "::CollectiveMma<cutlass::gemm::MainloopSm100TmaUmmaWarpSpecialized<3, 8, 2>, "
     "cutlass::bfloat16_t, cutlass::bfloat16_t> > >(Params)", "gemm", "yes", "bf16"),
    ("void xmma_cudnn::gemm::kernel<xmma_cudnn::implicit_gemm::fprop_indexed::Kernel_traits<"
     "xmma_cudnn::Ampere_hmma_tf32_traits<unsigned int, float>, xmma_cudnn::Cta_tile<"
     "xmma_cudnn::Ampere, 128, 128, 32, 2, 2, 1, 1> > >(xmma_cudnn::implicit_gemm::"
     "fprop_indexed::Params)", "conv", "yes", "tf32"),
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, "
     "false, cutlass::half_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::half_t> >, false, "
     "true>(flash::Flash_fwd_params)", "attention", "yes", "fp16"),
    ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, "
     "2, 4, 2, false, false, cutlass::bfloat16_t> >(pytorch_flash::Flash_bwd_params)",
     "attention", "yes", "bf16"),
    ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::Flash_bwd_kernel_traits"
     "<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t> >(pytorch_flash::"
     "Flash_bwd_params)", "attention", "no", "bf16"),
    ("flash_fwd_splitkv_combine_kernel", "attention", "no", None),
    ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel"
     "<cutlass::arch::Sm80, cutlass::bfloat16_t, true, false, true, 64, 64, 128, false>::Params)",
     "attention", "yes", "bf16"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm75(PyTorchMemEffAttention::AttentionKernel<float, "
     "cutlass::arch::Sm75, true, 64, 64, 64, true, true>::Params)", "attention", "no", "fp32"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_"
     "kernel0_0", "attention", "yes", "fp16"),
    ("fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalP32VarSeqQ128Kv128PersistentContext",
     "attention", "yes", "bf16"),
    ("void vllm::paged_attention_v2_kernel<unsigned short, unsigned short, 128, 16, 128, "
     "(vllm::Fp8KVCacheDataType)0, false, 512>(float*, float*)", "attention", "no", "fp32"),
    ("void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, float, int>("
     "at::GenericPackedTensorAccessor<float const, 4ul, at::DefaultPtrTraits, int>)",
     "conv", "no", "fp32"),
    ("void at::native::tinygemm_m16n8k16_chunk_kernel<(at::native::KReductionType)0, "
     "(at::native::ALayout)1, (at::native::BLayout)1, 8, 8, 8>(void const*, c10::BFloat16*)",
     "gemm", "yes", "bf16"),
    ("void gemmSN_NN_kernel<__half, 256, 4, 2, 8, 4, 4, false>(cublasGemmSmallNParams)",
     "gemm", "no", "fp16"),
    ("ampere_dgemm_64x64x16_nt", "gemm", "unknown", "fp64"),
    ("volta_dgemm_128x64_nt", "gemm", "no", "fp64"),
    ("Memcpy HtoD (Pageable -> Device)", "memcpy/memset", "no", None),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "communication", "no", "bf16"),
    ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<c10::BFloat16, float>"
     "(c10::BFloat16 const*)", "reduction/norm", "no", "bf16"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
     "<float, 4>, float>(at::native::(anonymous namespace)::TensorListMetadata<4>)",
     "optimizer", "no", "fp32"),
    # argument types must not turn a quantize kernel into "attention"
    ("void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::"
     "BlockScaleQuantizationType)2, __nv_bfloat16, 32, true>(int, __nv_bfloat16 const*, "
     "flashinfer::QuantizationSFLayout)", "elementwise", "no", "bf16"),
    ("_fwd_kernel", "attention", "unknown", None),
    ("some_custom_kernel", "other", "no", None),
    # AMD families: matched as tokens of the family, never as substrings
    ("attn_fwd", "attention", "yes", None),                      # AOTriton
    ("bwd_kernel_fuse", "attention", "yes", None),
    ("bwd_kernel_dk_dv", "attention", "yes", None),
    ("bwd_preprocess", "attention", "no", None),
    ("SubTensorOpWithScalar1d", "elementwise", "no", None),      # MIOpen, not 'tensorop'
    ("SubTensorOpWithCastTensor1d", "elementwise", "no", None),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x64x64_MI16x16x1_PostGSU8_VW4",
     "reduction/norm", "no", "bf16"),                            # hipBLASLt split-K helper
    ("transpose_32x32_off64", "copy kernel", "no", None),        # 'off64' is no fp64
    ("fmha_fwd_d128_bf16_batch_b128x128x32x128x32x128_r4x1x1_r4x1x1_w32x32x16_w32x32x16_qr_"
     "async_vr_psddv_nlogits_nbias_nmask_lse_ndropout_nsquant", "attention", "yes", "bf16"),
    ("_ZN2ck16tensor_operation6device12_GLOBAL__N_137kernel_grouped_conv_fwd_xdl_cshuffle_v3"
     "INS_6half_tEEEvv", "conv", "yes", "fp16"),
    # Blackwell block-scaled formats: the scale's type (ue4m3, ue8m0) is not the data type
    ("nvjet_sm100_qqtst_128x256_128x6_2x1_2cta_v_bz_Avec32UE8M0_Bvec32UE8M0_NNT",
     "gemm", "yes", "mxfp8"),
    ("nvjet_sm100_ootst_128x256_256x4_2x1_2cta_v_bz_Avec16UE4M3_Bvec16UE4M3_NNT",
     "gemm", "yes", "nvfp4"),
    ("cutlass3x_sm100_bstensorop_s256x128x64gemm_block_scaled_ue4m3xf4_ue4m3xf4_f32_bf16_bf16_"
     "256x128x256_0_tnn_align32_o_vs16_2sm_bias_bf16_relu", "gemm", "yes", "nvfp4"),
    ("cutlass3x_sm100_bstensorop_s256x128x64gemm_block_scaled_ue8m0xe4m3_ue8m0xe4m3_f32_bf16_"
     "bf16", "gemm", "yes", "mxfp8"),
]


@pytest.mark.parametrize("name, category, tensor_core, dtype", UNSEEN,
                         ids=[re.sub(r"\W+", "_", n[0])[:48] for n in UNSEEN])
def test_unseen_names(name, category, tensor_core, dtype):
    verdict = classify_kernel(name)
    got = (verdict.category, verdict.tensor_core, verdict.dtype)
    assert got == (category, tensor_core, dtype), verdict


def test_reason_names_the_deciding_token():
    assert "ffma" in classify_kernel(
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_"
        "aligna4_alignc4_execute_kernel__5x_cublas").reason
    assert "tensor16x8x8" in classify_kernel(
        "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_"
        "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer").reason
    assert "884" in classify_kernel("volta_h884gemm_64x128_ldg8_nn").reason
    assert "simt" in classify_kernel(
        "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(x::Params)").reason
    assert "nvjet_tst" in classify_kernel("nvjet_tst_192x8_64x8_4x1_v_bz_TNT").reason


# --- mangled names ---------------------------------------------------------------------

MANGLED = next(r["kernel_name"] for r in ROWS if r["kernel_name"].startswith("_ZN"))


def test_demangle_hint_pulls_identifiers_out_of_itanium_names():
    words = demangle_hint(MANGLED).split()
    for word in ("cutlass_cudnn_train", "ImplicitGemmConvolution", "MmaTensorOp", "tfloat32_t",
                 "Conv2dWgradOutputGradientTileAccessIteratorOptimized"):
        assert word in words
    # Integer literals (Li128E) and substitutions (S4_) are not identifier lengths.
    assert all(re.fullmatch(r"[A-Za-z_]\w*", w) for w in words)


def test_demangle_hint_leaves_plain_names_alone():
    assert demangle_hint("volta_sgemm_128x32_nt") == "volta_sgemm_128x32_nt"


def test_mangled_cutlass_conv_is_a_tf32_tensor_core_conv():
    assert classify_kernel(MANGLED) == KernelVerdict(
        "conv", "yes", "tf32", classify_kernel(MANGLED).reason)
    mangled_simt = ("_ZN7cutlass6KernelINS_4gemm6kernel4GemmINS1_11threadblock7MmaSimtEEEEEvNT_"
                    "6ParamsE")
    assert classify_kernel(mangled_simt).tensor_core == "no"


# --- module contract -------------------------------------------------------------------

def test_closed_sets():
    assert KERNEL_CATEGORIES == ("gemm", "conv", "attention", "elementwise", "reduction/norm",
                                 "softmax", "copy kernel", "memcpy/memset", "communication",
                                 "optimizer", "other")
    assert MATRIX_CATEGORIES == ("gemm", "conv", "attention")


def test_classify_is_cached_and_total():
    classify_kernel.cache_clear()
    classify_kernel("volta_sgemm_128x32_nt")
    classify_kernel("volta_sgemm_128x32_nt")
    assert classify_kernel.cache_info().hits >= 1
    assert classify_kernel("").tensor_core == "no"


def test_verdict_is_frozen():
    verdict = classify_kernel("volta_sgemm_128x32_nt")
    with pytest.raises(AttributeError):
        verdict.tensor_core = "yes"  # type: ignore[misc]


def test_kernels_module_imports_neither_torch_nor_streamlit():
    source = (Path(__file__).parents[1] / "engine" / "traces" / "kernels.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+(torch|streamlit)\b", source, re.MULTILINE)
