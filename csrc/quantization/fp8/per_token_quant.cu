// Per-token dynamic FP8 quantization, the unfused path's native kernel (upstream-facts F.2):
// one thread block per token, block-wide max of |x|, scale = max(amax / fp8_max, 1 / (fp8_max * 512)),
// then x / scale (true division), clamped to +-fp8_max and converted with c10's FP8 types.
// As in upstream's kernel, NaN is dropped by fmaxf in the reduction and becomes -fp8_max in the
// clamp; the Triton op in vllm/model_executor/layers/quantization/utils/fp8_per_token.py states
// the fork's own policy. The ROCm build (64-lane wavefronts) is written but has not been compiled
// here.

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e4m3fnuz.h>
#include <torch/all.h>

namespace vllm {

constexpr int kMaxBlock = 256;
#ifdef USE_ROCM
constexpr int kWarp = 64;
__device__ __forceinline__ float shfl_xor(float v, int offset) { return __shfl_xor(v, offset); }
#else
constexpr int kWarp = 32;
__device__ __forceinline__ float shfl_xor(float v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}
#endif

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, shfl_xor(v, offset));
  }
  return v;
}

// Max over the block; every thread gets the result. blockDim.x is a multiple of 32.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[kMaxBlock / kWarp];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_max(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = (lane < warps) ? partial[lane] : 0.0f;
  return warp_max(v);
}

template <typename scalar_t, typename fp8_t>
__global__ void dynamic_per_token_fp8_quant_kernel(fp8_t* __restrict__ out,
                                                   float* __restrict__ scales,
                                                   const scalar_t* __restrict__ in,
                                                   const int64_t hidden,
                                                   const int64_t in_row_stride,
                                                   const int64_t out_row_stride,
                                                   const float fp8_max) {
  const int64_t token = blockIdx.x;
  const scalar_t* row = in + token * in_row_stride;
  fp8_t* out_row = out + token * out_row_stride;

  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    amax = fmaxf(amax, fabsf(static_cast<float>(row[i])));
  }
  amax = block_max(amax);

  const float scale = fmaxf(amax / fp8_max, 1.0f / (fp8_max * 512.0f));
  if (threadIdx.x == 0) scales[token] = scale;

  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = fminf(fmaxf(static_cast<float>(row[i]) / scale, -fp8_max), fp8_max);
    out_row[i] = static_cast<fp8_t>(v);
  }
}

}  // namespace vllm

void dynamic_per_token_scaled_fp8_quant(torch::Tensor& out, const torch::Tensor& input,
                                        torch::Tensor& scales, double fp8_max) {
  TORCH_CHECK(input.dim() == 2, "input must be 2-D [tokens, hidden]");
  TORCH_CHECK(input.stride(-1) == 1 && out.stride(-1) == 1, "last dim must be contiguous");
  TORCH_CHECK(out.sizes() == input.sizes(), "out must have the shape of input");
  TORCH_CHECK(scales.numel() == input.size(0) && scales.is_contiguous() &&
                  scales.scalar_type() == at::kFloat,
              "scales must be a contiguous float32 tensor with one entry per token");
  const int64_t tokens = input.size(0);
  const int64_t hidden = input.size(1);
  if (tokens == 0 || hidden == 0) return;

  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int threads =
      static_cast<int>(std::min<int64_t>((hidden + vllm::kWarp - 1) / vllm::kWarp * vllm::kWarp,
                                         vllm::kMaxBlock));

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::BFloat16, at::ScalarType::Half, input.scalar_type(), "per_token_fp8", [&] {
        if (out.scalar_type() == at::kFloat8_e4m3fn) {
          vllm::dynamic_per_token_fp8_quant_kernel<scalar_t, c10::Float8_e4m3fn>
              <<<tokens, threads, 0, stream>>>(
                  out.data_ptr<c10::Float8_e4m3fn>(), scales.data_ptr<float>(),
                  input.data_ptr<scalar_t>(), hidden, input.stride(0), out.stride(0),
                  static_cast<float>(fp8_max));
        } else {
          TORCH_CHECK(out.scalar_type() == at::kFloat8_e4m3fnuz,
                      "out must be float8_e4m3fn or float8_e4m3fnuz");
          vllm::dynamic_per_token_fp8_quant_kernel<scalar_t, c10::Float8_e4m3fnuz>
              <<<tokens, threads, 0, stream>>>(
                  out.data_ptr<c10::Float8_e4m3fnuz>(), scales.data_ptr<float>(),
                  input.data_ptr<scalar_t>(), hidden, input.stride(0), out.stride(0),
                  static_cast<float>(fp8_max));
        }
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
