"""Kernel names shortened for display, on names as real CUDA and ROCm traces hold them."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from itertrace.kernel_names import MAX_CHARS, short_kernel_name

SHARED = Path(__file__).parents[2] / ".." / "shared"
TRACES = sorted([*SHARED.glob("serving_traces/*.json.gz"), *SHARED.glob("kineto_samples/*.json.gz")])

# (name as the trace holds it, what a person should see), from the shared serving traces and Kineto samples
CASES = [
    ("void vllm::reshape_and_cache_flash_kernel<__hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0>"
     "(__hip_bfloat16 const*, __hip_bfloat16 const*, __hip_bfloat16*, __hip_bfloat16*, long const*, long, long, long, "
     "long, long, int, int, int, float const*, float const*, int)", "reshape_and_cache_flash_kernel"),
    ("void at::native::elementwise_kernel_manual_unroll<128, 4, at::native::gpu_kernel_impl<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#4}::operator()() "
     "const::{lambda(long)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const::{lambda()#4}::operator()() const::{lambda(long)#1} const&)::{lambda(int)#1}>"
     "(int, at::native::gpu_kernel_impl<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
     "operator()() const::{lambda()#4}::operator()() const::{lambda(long)#1}>(at::TensorIteratorBase&, at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#4}::operator()() "
     "const::{lambda(long)#1} const&)::{lambda(int)#1})", "elementwise_kernel_manual_unroll"),
    ("void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::StoreKVCacheParams)",
     "store_kvcache"),
    ("at::cuda::(anonymous namespace)::spin_kernel(long)", "spin_kernel"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, "
     "false, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParams<"
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float>, float>)", "gemvx::kernel"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_"
     "32x6_tn_align4::Params)", "cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_"
     "DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA512_LBSPPB512_LBSPPM0_LPA16_LPB16_"
     "LPM0_LRVW8_LWPMn1_MIAV0_MIWT1_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD4_NTM0_NEPBS8_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_"
     "SS1_SPO0_SRVW0_SSO0_SVW1_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGRO1_VSn1_VWA1_VWB1_WSGRA0_WSGRB0_WS64_WG8_"
     "32_1", "Cijk_Alik_Bljk_BBS_MT32x32x256_MI16x16x1"),
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
     "add_rmsnorm_quant_kernel"),
    ("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i",
     "act_and_mul_kernel"),
    ("_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFwdPipelineProblemIDF16b"
     "DF16bfDF16bDF16bDF16bffNS_19Generic2dBlockShapeINS_8sequenceIJLi1ELi3072EEEENS5_IJLi1ELi128EEEENS5_IJLi1ELi8EEEE"
     "EENS_18Rmsnorm2dFwdTraitsILb1ELb0ELb0ELb0ELNS_21Rmsnorm2dFusedAddEnumE1ELNS_23Rmsnorm2dFusedQuantEnumE0ELNS_22Rms"
     "norm2dSensitiveEnumE0EEEEENS_33Rmsnorm2dFwdPipelineDefaultPolicyEEENS_17Default2DEpilogueINS_24Default2DEpilogu"
     "eProblemIfDF16bLb1ELb0ELb0EEEvEEEEEEvT0_", "Rmsnorm2dFwd"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "ncclKernel_AllReduce_RING_LL_Sum_float"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
    ("triton_poi_fused_constant_pad_nd_moe_forward_0", "triton_poi_fused_constant_pad_nd_moe_forward_0"),
    ("__amd_rocclr_copyBuffer", "__amd_rocclr_copyBuffer"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu"),
    # the issue's FlashAttention kernel, and FlashAttention 3's behind CUTLASS's device_kernel and its guard
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::half_t, Flash_kernel_traits"
     "<128, 64, 64, 4, cutlass::half_t> >, false, true, false, false, true, true, false, false>(Flash_fwd_params)",
     "flash_fwd_kernel"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90"
     "<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, "
     "128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, true, false> > > >(flash::FlashAttnFwdSm90<int>::Params)",
     "FlashAttnFwdSm90"),
    # not C++ signatures: copies and sets keep their names
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    ("[CUDA memcpy Host-to-Device]", "[CUDA memcpy Host-to-Device]"),
]


@pytest.mark.parametrize(("name", "short"), CASES, ids=[c[1][:40] for c in CASES])
def test_a_kernel_name_shortens_to_its_base_name(name, short):
    assert short_kernel_name(name) == short
    assert short_kernel_name(short) == short  # a short name is its own short name


def test_a_long_name_without_structure_is_cut_in_the_middle_keeping_its_end():
    name = "cudnn_infer_volta_scudnn_128x32_sliced1x4_ldg4_relu_exp_small_nhwc_tn_v1"
    short = short_kernel_name(name)
    assert len(short) == MAX_CHARS and short.startswith("cudnn_infer_volta_") and short.endswith("_small_nhwc_tn_v1")
    assert "…" in short and short_kernel_name(short) == short


def test_a_broken_signature_comes_back_cut_not_raised():
    for name in ("void foo<int(", ">>>", "void (", "_Z", "_ZN", "_ZN7ck_tile6kentryI", "a::<b>"):
        assert 0 < len(short_kernel_name(name)) <= MAX_CHARS


@pytest.mark.shared
@pytest.mark.skipif(not TRACES, reason=f"no Kineto traces under {SHARED.resolve()}")
def test_every_kernel_name_of_the_shared_traces_shortens_to_one_line():
    names = {e["name"] for path in TRACES for e in json.load(gzip.open(path))["traceEvents"]
             if e.get("cat") == "kernel"}
    assert len(names) > 300
    for name in names:
        short = short_kernel_name(name)
        assert 0 < len(short) <= MAX_CHARS and short_kernel_name(short) == short, name
        if len(short) < MAX_CHARS:  # made of the name's own words, never an invention
            assert all(word in name for word in short.replace("::", "_").split("_")), name
        assert "<" not in short and "(" not in short, name
